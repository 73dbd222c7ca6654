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

from ..health.store import DEFAULT, HealthStore

__all__ = ["STORES"]


class _Stores:
    """The health stores turns have used while telemetry was on, held weakly, each with
    the clock its turns read (cooldown ends are on it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clocks: weakref.WeakKeyDictionary[HealthStore, Callable[[], float]] = (
            weakref.WeakKeyDictionary()
        )

    def add(self, store: HealthStore, clock: Callable[[], float]) -> None:
        if self._clocks.get(store) is not clock:  # new, or its turns now run on another clock
            with self._lock:
                self._clocks[store] = clock

    def cooldowns(self) -> dict[tuple[tuple[str, Any], ...], int]:
        """Active cooldowns per (provider, model, server, scope), over every store."""
        with self._lock:
            stores = list(self._clocks.items())
        if all(store is not DEFAULT for store, _ in stores):
            stores.append((DEFAULT, time.monotonic))
        counts: dict[tuple[tuple[str, Any], ...], int] = {}
        for store, clock in stores:
            t_until, c_until, _ = store.facts()
            now = clock()
            for tkey, until in t_until.items():
                labels = _target_labels(tkey, "target")
                counts[labels] = counts.get(labels, 0) + (until > now)
            for (tkey, _cred), until in c_until.items():
                labels = _target_labels(tkey, "credential")
                counts[labels] = counts.get(labels, 0) + (until > now)
        return counts


def _target_labels(key: Any, scope: str) -> tuple[tuple[str, Any], ...]:
    """A health-store target key ((base_url, model): the backend) as metric attributes."""
    if isinstance(key, tuple) and len(key) == 2 and all(isinstance(p, str) for p in key):
        base_url, model = key
        host = ""
        if base_url.startswith(("http://", "https://")):
            try:
                host = urlsplit(base_url).hostname or ""
            except ValueError:
                host = ""
        return (
            ("gen_ai.request.model", model),
            ("server.address", host),
            ("fallgate.cooldown.scope", scope),
        )
    return (("fallgate.target_key", str(key)), ("fallgate.cooldown.scope", scope))


#: Every store a turn used while telemetry was on (and `DEFAULT`), for the gauge.
STORES: Final = _Stores()
