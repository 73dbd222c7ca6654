"""What the router (`fsm.core.members`) remembers across turns, kept with a health store.

Per backend (a target's `key`: base_url and model) the measured latency of its answers
and the turns in flight that started on it; per conversation (an affinity key and a
chain entry) the member and key that last answered it, its *pin*. One `Routes` per
health store (`routes_of`), made on first use and dropped with the store. Pins are
bounded: at most `MAX_PINS` (least recently used first out) and `PIN_TTL` seconds since
their last use (a provider's prompt cache does not outlive an idle hour either).

This is per process: a `SharedHealthStore` shares cooldowns and breakers through its
backend, but each process keeps its own latencies and pins (a conversation served by
two processes is pinned in each; both pins point at the deployment that last answered).
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from collections import OrderedDict
from typing import Final

from .store import HealthStore

__all__ = ["MAX_PINS", "PIN_TTL", "Pin", "Routes", "routes_of"]

#: The most conversation pins one store keeps.
MAX_PINS: Final = 10_000
#: Seconds a pin lives after its last use.
PIN_TTL: Final = 3_600.0
#: The weight of a new latency sample in the moving average.
LATENCY_ALPHA: Final = 0.3

TargetKey = tuple[str, str]
#: A conversation's member and key: (the member's target key, the credential's health id).
Pin = tuple[TargetKey, str]


class Routes:
    """Latencies, turns in flight and pins of one health store (thread-safe)."""

    __slots__ = ("_busy", "_latency", "_lock", "_pins", "_tickets", "max_pins", "pin_ttl")

    def __init__(self, max_pins: int = MAX_PINS, pin_ttl: float = PIN_TTL) -> None:
        if not isinstance(max_pins, int) or isinstance(max_pins, bool) or max_pins < 1:
            raise ValueError(f"max_pins = {max_pins!r}: must be an integer >= 1")
        if not (isinstance(pin_ttl, int | float) and 0 < pin_ttl < math.inf):
            raise ValueError(f"pin_ttl = {pin_ttl!r}: must be a number of seconds > 0")
        self.max_pins = max_pins
        self.pin_ttl = float(pin_ttl)
        self._lock = threading.Lock()
        self._latency: dict[TargetKey, float] = {}
        self._busy: dict[TargetKey, int] = {}
        #: ticket -> (backend, the time after which it no longer counts); in issue order.
        self._tickets: OrderedDict[int, tuple[TargetKey, float]] = OrderedDict()
        self._pins: OrderedDict[tuple[str, str], tuple[Pin, float]] = OrderedDict()

    # -- latency ---------------------------------------------------------------------------
    def latency(self, target: TargetKey) -> float | None:
        """The moving average of `target`'s answer times (seconds; None: none yet)."""
        return self._latency.get(target)

    def measured(self, target: TargetKey, seconds: float) -> None:
        if not (seconds >= 0 and math.isfinite(seconds)):
            return
        with self._lock:
            old = self._latency.get(target)
            self._latency[target] = (
                seconds if old is None else old + LATENCY_ALPHA * (seconds - old)
            )

    # -- turns in flight ---------------------------------------------------------------------
    def busy(self, target: TargetKey, now: float) -> int:
        """Turns started on `target` and not ended (nor older than their deadline)."""
        with self._lock:
            self._expire(now)
            return self._busy.get(target, 0)

    def start(self, target: TargetKey, now: float, deadline: float) -> int:
        """A turn starts on `target`; returns its ticket for `end`. A ticket that is
        never ended (a cancelled turn) stops counting once `deadline` has passed."""
        with self._lock:
            self._expire(now)
            ticket = next(_TICKETS)
            self._tickets[ticket] = (target, now + deadline)
            self._busy[target] = self._busy.get(target, 0) + 1
            return ticket

    def end(self, ticket: int) -> None:
        with self._lock:
            found = self._tickets.pop(ticket, None)
            if found is not None:
                self._drop(found[0])

    def _drop(self, target: TargetKey) -> None:
        n = self._busy.get(target, 0) - 1
        if n > 0:
            self._busy[target] = n
        else:
            self._busy.pop(target, None)

    def _expire(self, now: float) -> None:
        """Tickets past their deadline, oldest first (most were issued in time order)."""
        tickets = self._tickets
        while tickets:
            ticket, (target, until) = next(iter(tickets.items()))
            if until > now:
                break
            del tickets[ticket]
            self._drop(target)

    # -- pins --------------------------------------------------------------------------------
    def pin(self, affinity: str, entry: str, now: float) -> Pin | None:
        """The member and key pinned for conversation `affinity` on chain entry `entry`
        (None: none, or expired)."""
        with self._lock:
            k = (affinity, entry)
            found = self._pins.get(k)
            if found is None:
                return None
            if now - found[1] > self.pin_ttl:
                del self._pins[k]
                return None
            self._pins.move_to_end(k)
            return found[0]

    def set_pin(self, affinity: str, entry: str, pin: Pin, now: float) -> None:
        with self._lock:
            k = (affinity, entry)
            self._pins[k] = (pin, now)
            self._pins.move_to_end(k)
            while len(self._pins) > self.max_pins:
                self._pins.popitem(last=False)

    def pins(self) -> int:
        return len(self._pins)


_TICKETS = itertools.count(1)
_ROUTES: weakref.WeakKeyDictionary[HealthStore, Routes] = weakref.WeakKeyDictionary()
_made = threading.Lock()


def routes_of(health: HealthStore) -> Routes:
    """The `Routes` kept with `health` (made on first use)."""
    found = _ROUTES.get(health)
    if found is None:
        with _made:
            found = _ROUTES.get(health)
            if found is None:
                found = _ROUTES[health] = Routes()
    return found
