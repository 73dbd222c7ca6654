"""What outlives a turn: cooldowns per target and per credential, failure streaks.

In-memory and thread-safe. Times are in the clock domain of the turns that
use the store (by default the system clock's monotonic seconds).

`DEFAULT` is the one process-wide store: every turn that is given no
``health=`` (``fsm.Turn``, ``fsm.run``, ``fsm.arun``, ...) reads and writes it,
so unrelated callers share cooldowns — on purpose, since a cooldown belongs
to the endpoint (a target's provider, base URL and model) and the key, not to
a policy object. Pass your own `HealthStore` to keep a turn's facts apart
(tests, tenants), or ``DEFAULT.clear()`` to forget them.

Cooldowns never extend themselves: while one is active, a new failure
report for the same key leaves its end where it is (such reports come from
turns that were already in flight when the cooldown began).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, Final

TargetKey = Hashable
CredKey = tuple[Hashable, str]


class HealthStore:
    """Cross-turn facts. All methods take `now` so that the store stays clock-agnostic."""

    __slots__ = (
        "__weakref__",
        "_cause",
        "_cred_until",
        "_lock",
        "_rr",
        "_streak",
        "_target_until",
    )

    @staticmethod
    def default() -> HealthStore:
        """The process-wide `DEFAULT` store, shared by every turn given no store."""
        return DEFAULT

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._target_until: dict[TargetKey, float] = {}
        self._cred_until: dict[CredKey, float] = {}
        self._streak: dict[TargetKey, int] = {}
        self._rr: dict[TargetKey, int] = {}
        # What started a cooldown, by target key or (target, credential id): its end and
        # a short safe label ("quota (HTTP 402)", never provider text). Words for failure
        # reports only; nothing decides by it.
        self._cause: dict[Hashable, tuple[float, str]] = {}

    # -- reads (lock-free: single dict lookups are atomic in CPython) ---------------------
    def quiet(self) -> bool:
        """True when nothing has ever been benched (a fast path for turn start)."""
        return not self._target_until and not self._cred_until

    def target_until(self, target: TargetKey) -> float:
        return self._target_until.get(target, 0.0)

    def credential_until(self, target: TargetKey, cred: str) -> float:
        return self._cred_until.get((target, cred), 0.0)

    def cause(self, target: TargetKey, cred: str | None = None) -> str | None:
        """What started the cooldown in force on `target` (or its credential `cred`)."""
        key: Hashable = target if cred is None else (target, cred)
        until = self.target_until(target) if cred is None else self.credential_until(target, cred)
        noted = self._cause.get(key)
        return noted[1] if noted is not None and noted[0] == until else None

    def note_cause(
        self, target: TargetKey, cause: str, until: float, cred: str | None = None
    ) -> None:
        """Remember `cause` for the cooldown of `target` (or `cred`) ending at `until`,
        if that is the one in force (a running cooldown keeps its own cause)."""
        key: Hashable = target if cred is None else (target, cred)
        with self._lock:
            if cred is None:
                held = self._target_until.get(target, 0.0)
            else:
                held = self._cred_until.get((target, cred), 0.0)
            if held == until:
                self._cause[key] = (until, cause)

    # -- writes ---------------------------------------------------------------------------
    def cool_target(self, target: TargetKey, until: float, now: float) -> float:
        """Bench `target` until `until` unless already benched; returns the end in force."""
        with self._lock:
            current = self._target_until.get(target, 0.0)
            if current > now:
                return current
            self._target_until[target] = until
            return until

    def cool_credential(self, target: TargetKey, cred: str, until: float, now: float) -> float:
        """Bench one credential of one target (never another target's)."""
        key = (target, cred)
        with self._lock:
            current = self._cred_until.get(key, 0.0)
            if current > now:
                return current
            self._cred_until[key] = until
            return until

    def failed(self, target: TargetKey) -> int:
        """Count a hard failure; returns the new streak (drives exponential cooldown)."""
        with self._lock:
            n = self._streak.get(target, 0) + 1
            self._streak[target] = n
            return n

    def succeeded(self, target: TargetKey, cred: str) -> None:
        """A success clears the target's streak and any stale bench on it."""
        if not self._streak and not self._target_until and not self._cred_until:
            return
        with self._lock:
            self._streak.pop(target, None)
            self._target_until.pop(target, None)
            self._cred_until.pop((target, cred), None)

    def next_round_robin(self, target: TargetKey, size: int) -> int:
        """The starting slot for a round-robin pool (advances on every call)."""
        with self._lock:
            n = self._rr.get(target, -1) + 1
            self._rr[target] = n
            return n % size

    # -- identity (the model checker's) -----------------------------------------------------------
    def copy(self) -> HealthStore:
        """An independent copy (same class: a deliberately broken subclass stays broken)."""
        new = object.__new__(type(self))
        for klass in type(self).__mro__:
            for name in getattr(klass, "__slots__", ()):
                if name == "__weakref__":
                    continue
                if name == "_lock":
                    object.__setattr__(new, name, threading.Lock())
                elif hasattr(self, name):
                    value = getattr(self, name)
                    object.__setattr__(
                        new, name, value.copy() if isinstance(value, dict) else value
                    )
        return new

    def key(
        self,
        now: float,
        targets: Iterable[TargetKey],
        credentials: Iterable[CredKey],
        horizon: float = math.inf,
        saturation: int = 1 << 30,
        sizes: Mapping[Any, int] | None = None,
    ) -> tuple[Any, ...]:
        """Canonical identity of the facts about `targets` and `credentials` that can steer a
        turn: cooldowns as seconds left (inf beyond `horizon`), failure streaks (equal once
        at `saturation`, where the cooldown stops growing), round-robin positions."""
        targets = tuple(targets)
        out: list[Any] = []
        for k in targets:
            until = self._target_until.get(k, 0.0)
            out.append(relative(until, now, horizon))
        for ck in credentials:
            until = self._cred_until.get(ck, 0.0)
            out.append(relative(until, now, horizon))
        for k in targets:
            out.append(min(self._streak.get(k, 0), saturation))
            n = self._rr.get(k)
            out.append(None if n is None else n % (sizes or {}).get(k, 1 << 30))
        return tuple(out)

    def clear(self) -> None:
        with self._lock:
            self._target_until.clear()
            self._cred_until.clear()
            self._streak.clear()
            self._rr.clear()
            self._cause.clear()

    def facts(
        self, copy: bool = True
    ) -> tuple[dict[TargetKey, float], dict[CredKey, float], dict[TargetKey, int]]:
        """Target cooldowns, credential cooldowns and failure streaks (for the checker's
        before/after comparison; copies unless `copy` is False)."""
        if copy:
            with self._lock:
                return self._target_until.copy(), self._cred_until.copy(), self._streak.copy()
        return self._target_until, self._cred_until, self._streak

    def snapshot(self) -> dict[str, object]:
        """A copy for debugging and tests (credential ids only, never keys)."""
        with self._lock:
            return {
                "targets": dict(self._target_until),
                "credentials": dict(self._cred_until),
                "streaks": dict(self._streak),
            }


def relative(until: float, now: float, horizon: float = math.inf) -> float:
    """Seconds left of a not-before time: 0 when over, inf beyond `horizon`."""
    if until <= now:
        return 0.0
    left = until - now
    return round(left, 6) if left <= horizon else math.inf


#: The process-wide store shared by every turn that passes no ``health=``.
DEFAULT: Final = HealthStore()
