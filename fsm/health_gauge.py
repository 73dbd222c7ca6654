"""Which health stores are in use, and their active cooldowns (the metrics' gauge).

Held weakly: telemetry must never keep a health store (and the cooldowns of a
finished tenant or test) alive.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import urlsplit

from .health import DEFAULT, HealthStore

__all__ = ["STORES"]


class _Stores:
    """The health stores turns have used while telemetry was on, held weakly.

    A `HealthStore` takes no weak reference (slots), so each is followed through its
    lock, which lives and dies with it; the entry keeps the store's cooldown tables
    (read under that lock) and the clock its turns read (cooldown ends are on it).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, tuple[weakref.ref[Any], Any, Any, Callable[[], float]]] = {}

    def add(self, store: HealthStore, clock: Callable[[], float]) -> None:
        key = id(store)
        lock = store._lock
        entries = self._entries
        entry = entries.get(key)
        if entry is not None and entry[0]() is lock:
            if entry[3] is not clock:  # the store's turns now run on another clock
                entries[key] = (entry[0], entry[1], entry[2], clock)
            return
        targets, credentials, _ = store.facts(copy=False)

        def gone(ref: weakref.ref[Any], key: int = key) -> None:
            found = entries.get(key)
            if found is not None and found[0] is ref:
                entries.pop(key, None)

        with self._lock:
            entries[key] = (weakref.ref(lock, gone), targets, credentials, clock)

    def cooldowns(self) -> dict[tuple[tuple[str, Any], ...], int]:
        """Active cooldowns per (provider, model, server, scope), over every store."""
        with self._lock:
            entries = list(self._entries.values())
        seen_default = any(ref() is DEFAULT._lock for ref, *_ in entries)
        if not seen_default:
            d_targets, d_creds, _ = DEFAULT.facts(copy=False)
            entries.append((weakref.ref(DEFAULT._lock), d_targets, d_creds, time.monotonic))
        counts: dict[tuple[tuple[str, Any], ...], int] = {}
        for ref, targets, credentials, clock in entries:
            lock = ref()
            if lock is None:
                continue
            with lock:
                t_until = dict(targets)
                c_until = dict(credentials)
            now = clock()
            for tkey, until in t_until.items():
                labels = _target_labels(tkey, "target")
                counts[labels] = counts.get(labels, 0) + (until > now)
            for (tkey, _cred), until in c_until.items():
                labels = _target_labels(tkey, "credential")
                counts[labels] = counts.get(labels, 0) + (until > now)
        return counts


def _target_labels(key: Any, scope: str) -> tuple[tuple[str, Any], ...]:
    """A health-store target key ((provider, base_url, model)) as metric attributes."""
    if isinstance(key, tuple) and len(key) == 3 and all(isinstance(p, str) for p in key):
        provider, base_url, model = key
        host = ""
        if base_url:
            try:
                host = urlsplit(base_url).hostname or ""
            except ValueError:
                host = ""
        return (
            ("gen_ai.provider.name", provider),
            ("gen_ai.request.model", model),
            ("server.address", host),
            ("fallgate.cooldown.scope", scope),
        )
    return (("fallgate.target_key", str(key)), ("fallgate.cooldown.scope", scope))


#: Every store a turn used while telemetry was on (and `DEFAULT`), for the gauge.
STORES: Final = _Stores()
