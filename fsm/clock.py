"""Time, injected: the `Clock` a turn reads and its host loop sleeps on.

The core never reads time itself: a turn is handed ``clock.now`` when it is
built, and the host loop (`fsm.host.loop`) sleeps with ``clock.sleep`` or
``clock.asleep``. Two clocks come with fallgate:

* `SystemClock` (`SYSTEM`): monotonic time and real, interruptible sleeps;
  the default.
* `VirtualClock`: time that only moves when told. Its sleeps return at once
  and advance it by the time slept, so cooldowns, deadlines and Retry-After
  stay honest in tests that take no real time; ``clock.advance(seconds)``
  lets time pass between turns. Pass one as ``clock=`` to `fsm.run`,
  `fsm.arun`, `providers.Fallgate` or `providers.AsyncFallgate`.

`instant_waits()` is the testing switch (like stamina's testing mode): inside
the block every turn that is given no clock runs on one fresh `VirtualClock`.

Time never runs backwards for the engine: a clock of your own is read through
`steady(clock)`, which treats a step back as no time passing (its later forward
steps count from where it landed). Without it a clock stepped back an hour
would keep a 5 s cooldown for an hour and five seconds, and let a turn's
deadline run an hour late.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Final, Protocol, runtime_checkable

__all__ = [
    "SYSTEM",
    "Clock",
    "SteadyClock",
    "SystemClock",
    "VirtualClock",
    "default_clock",
    "instant_waits",
    "steady",
]


@runtime_checkable
class Clock(Protocol):
    """What a turn needs of time: a monotonic `now` and a way to let time pass.

    The host loop never asks a clock to sleep for zero or less.
    """

    def now(self) -> float:
        """Seconds on a monotonic scale (only differences matter)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread until `seconds` have passed on this clock."""
        ...

    async def asleep(self, seconds: float) -> None:
        """Suspend the calling task until `seconds` have passed on this clock."""
        ...


class SystemClock:
    """Monotonic time and real sleeps (`time.sleep`, `asyncio.sleep`): the default.

    Sleeps are interruptible: KeyboardInterrupt and asyncio cancellation end
    the turn `aborted`. Calling the clock is `now()`.
    """

    __slots__ = ()

    now = staticmethod(time.monotonic)
    __call__ = staticmethod(time.monotonic)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


#: The system clock (stateless; one is enough).
SYSTEM: Final = SystemClock()


class VirtualClock:
    """Virtual time for tests: `now()` is the time it has been advanced to.

    ``sleep(s)`` and ``await asleep(s)`` return at once, having advanced the
    clock by `s`; ``advance(s)`` lets `s` seconds pass between turns (for
    example to let a cooldown run out). Time never goes backwards: zero,
    negative and NaN advances are ignored. Thread-safe (advances are
    serialised by a lock). Calling the clock is `now()`, so it also serves
    where a bare ``Callable[[], float]`` is expected.
    """

    __slots__ = ("_lock", "t")

    def __init__(self, start: float = 1000.0) -> None:
        if not isinstance(start, int | float) or not math.isfinite(start):
            raise ValueError(f"start must be a finite number of seconds, got {start!r}")
        #: The current virtual time (read it freely; move it with `advance`).
        self.t = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        return self.t

    __call__ = now

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass (ignored unless positive)."""
        if seconds > 0:
            with self._lock:
                self.t += seconds

    def sleep(self, seconds: float) -> None:
        if seconds > 0:  # advance(), inlined: this is a host loop's every wait
            with self._lock:
                self.t += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def __repr__(self) -> str:
        return f"VirtualClock(t={self.t:g})"


class SteadyClock:
    """A clock read through a ratchet: its forward steps count, a step back (or a
    reading that is not a finite number) counts as no time passing.

    `now()` starts at the wrapped clock's first reading; sleeps are the wrapped
    clock's. Thread-safe. Get one with `steady(clock)`, which shares one per clock.
    """

    __slots__ = ("__weakref__", "_inner", "_lock", "_raw", "_t")

    def __init__(self, inner: Clock) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._raw = math.nan  # the wrapped clock's last finite reading
        self._t = 0.0  # what this clock said last

    def now(self) -> float:
        raw = self._inner.now()
        with self._lock:
            if isinstance(raw, int | float) and math.isfinite(raw):
                if self._raw != self._raw:  # the first reading: start where the clock is
                    self._t = float(raw)
                elif raw > self._raw:
                    self._t += raw - self._raw
                self._raw = float(raw)  # a step back: from here on, forward steps count
            return self._t

    __call__ = now

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await self._inner.asleep(seconds)

    def __repr__(self) -> str:
        return f"SteadyClock({self._inner!r})"


_steady_lock = threading.Lock()
_steady: weakref.WeakKeyDictionary[Clock, SteadyClock] = weakref.WeakKeyDictionary()


def steady(clock: Clock) -> Clock:
    """`clock` as the engine reads it: never backwards. The system clock (monotonic)
    and virtual clocks (which only advance) are returned as they are; any other clock
    gets one `SteadyClock`, shared by every turn on it (so cooldowns recorded by one
    turn and read by the next agree on the time)."""
    if type(clock) in (SystemClock, VirtualClock, SteadyClock):
        return clock
    with _steady_lock:
        try:
            found = _steady.get(clock)
        except TypeError:  # not weakly referable (or not hashable): one per turn
            return SteadyClock(clock)
        if found is None:
            found = _steady[clock] = SteadyClock(clock)
        return found


# The virtual clocks of the active `instant_waits()` blocks, innermost last. Replaced
# (never mutated) under `_lock`, so a reader always sees a consistent tuple.
_lock = threading.Lock()
_active: tuple[VirtualClock, ...] = ()


def default_clock() -> Clock:
    """The clock of a turn that is given none: `SYSTEM`, or inside `instant_waits()`
    that block's `VirtualClock`. Read once when the turn starts."""
    active = _active
    return active[-1] if active else SYSTEM


@contextlib.contextmanager
def instant_waits() -> Iterator[VirtualClock]:
    """Make every wait instant while the block runs; yields its `VirtualClock`.

    Turns that are given no clock (``fsm.run``, ``fsm.arun``, ``Fallgate`` and
    ``AsyncFallgate`` without ``clock=``) run on one `VirtualClock` that starts
    at the current default clock's time: their sleeps advance it instead of
    waiting, so cooldowns and Retry-After stay honest while the tests take no
    time. ``clock.advance(s)`` on the yielded clock lets time pass between
    turns. Turns given an explicit clock are not affected.

    The switch is process-wide (every thread and task sees it, as worker
    threads must) and lock-protected; blocks may nest. On leaving a block the
    enclosing virtual clock, if any, is moved up to this block's time, so time
    never runs backwards for it. The system clock cannot be moved: cooldowns
    recorded inside the block stay in its virtual time, later than the system
    clock, and so last longer once the block ends. Use a fresh `HealthStore`
    (or ``fsm.health.store.DEFAULT.clear()``) per test.
    """
    global _active
    with _lock:
        clock = VirtualClock(default_clock().now())
        _active = (*_active, clock)
    try:
        yield clock
    finally:
        with _lock:
            _active = tuple(c for c in _active if c is not clock)
            if _active:
                outer = _active[-1]
                outer.advance(clock.t - outer.t)
