"""An adaptive limit on a client's attempts in flight, engaged when the process starves.

A thousand turns on one event loop with little CPU to share (other processes on the
machine, a burst of work) make every loop iteration long: each step of every attempt
waits for everyone else's, connects and replies sit unobserved in their sockets, and
timers fire seconds late. More attempts in flight only make each one slower, so
retrying them all at once (what the bare SDK does) answers few. A timer that fired
late (`bounds.AttemptBound.late`) says the process is starved; then the limit here
halves the attempts allowed in flight (at most once per the lateness seen, the time
the process is behind), and every success raises it by one, until it no longer binds
and is lifted: additive increase, multiplicative decrease, as TCP does for a
congested link, on the one resource the client itself congests. Attempts over the
limit wait for a slot before they reach the network, within their own time bound:
one that runs out waiting was never sent (a client-side fault, `AttemptTimeout.unsent`).

At a normal load the limit is not engaged: one comparison and a counter per attempt.
"""

from __future__ import annotations

import asyncio
import collections
import math
import threading
import time
from typing import Any

from .bounds import STARVED_AFTER, AttemptBound, AttemptTimeout

__all__ = ["MIN_LIMIT", "Admission", "AsyncAdmission"]

#: The limit never goes below this many attempts in flight.
MIN_LIMIT = 8


class _Limit:
    """The arithmetic both flavours share (under their own lock or loop)."""

    __slots__ = ("_quiet_until", "cuts", "in_flight", "limit", "peak")

    def __init__(self) -> None:
        self.limit = math.inf
        self.in_flight = 0
        #: The most attempts in flight since the limit was last lifted.
        self.peak = 0
        #: Times the limit was cut (for stats and tests).
        self.cuts = 0
        self._quiet_until = 0.0

    def open(self) -> bool:
        return self.in_flight < self.limit

    def take(self) -> None:
        self.in_flight += 1
        if self.in_flight > self.peak:
            self.peak = self.in_flight

    def give(self, ok: bool, late: float) -> None:
        """An attempt ended: `ok` (it was answered), and a timer of it fired `late`
        seconds past its due time (0: none fired)."""
        self.in_flight -= 1
        if late > STARVED_AFTER:
            now = time.monotonic()
            if now >= self._quiet_until:  # once per lateness: the others saw the same
                base = self.in_flight + 1 if self.limit == math.inf else self.limit
                self.limit = max(MIN_LIMIT, math.floor(base / 2))
                self.cuts += 1
                self._quiet_until = now + late
        elif ok and self.limit != math.inf:
            self.limit += 1
            if self.limit > self.peak:  # it no longer binds
                self.limit = math.inf
                self.peak = self.in_flight


class _Slots:
    """What both flavours show of their `_Limit` (read without their lock: a float and an
    int, for stats and tests)."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = _Limit()

    @property
    def limit(self) -> float:
        return self._state.limit

    @property
    def cuts(self) -> int:
        return self._state.cuts


class AsyncAdmission(_Slots):
    """The limit for one asyncio client (`AsyncClientPool`)."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        super().__init__()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def admit_now(self) -> bool:
        """Take a slot if one is free and nobody waits (the common case: no await)."""
        s = self._state
        if s.in_flight < s.limit and not self._waiters:
            s.take()
            return True
        return False

    async def admit(self, bound: AttemptBound, until_deadline: float) -> None:
        """Take a slot for the attempt `bound` bounds, waiting at most `until_deadline`
        (what is left of the turn's deadline); the bound restarts once the slot came
        (the wait was the client's, not the target's time). Raises an unsent
        `AttemptTimeout` when no slot came before the deadline."""
        start = time.monotonic()
        if not await self.acquire(until_deadline):
            raise _no_slot(self._state)
        bound.restart(min(bound.seconds, until_deadline - (time.monotonic() - start)))

    async def acquire(self, seconds: float) -> bool:
        """Take a slot, waiting at most `seconds`; False when none came in time."""
        s = self._state
        if s.open() and not self._waiters:
            s.take()
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            async with asyncio.timeout(max(0.0, seconds)):
                await fut
        except TimeoutError:
            return False
        except BaseException:
            if fut.done() and not fut.cancelled():  # the slot came with the cancellation
                self.release(False, 0.0)
            raise
        finally:
            if not fut.done():
                fut.cancel()
            if fut in self._waiters:
                self._waiters.remove(fut)
        return True

    def release(self, ok: bool, late: float) -> None:
        """The attempt ended: `ok` (answered); `late`: how late its timers fired at most
        (`AttemptBound.lag`). Hands freed slots to the attempts waiting, oldest first."""
        s = self._state
        s.give(ok, late)
        waiters = self._waiters
        while waiters and s.open():
            fut = waiters.popleft()
            if not fut.done():
                s.take()
                fut.set_result(None)


class Admission(_Slots):
    """The limit for one threaded client (`ClientPool`'s turns, on any thread)."""

    __slots__ = ("_cond", "_waiting")

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition(threading.Lock())
        self._waiting = 0

    def admit(self, bound: AttemptBound, until_deadline: float) -> None:
        """See `AsyncAdmission.admit`."""
        s = self._state
        with self._cond:
            if s.in_flight < s.limit and not self._waiting:
                s.take()
                return
            start = time.monotonic()
            self._waiting += 1
            try:
                came = self._cond.wait_for(s.open, timeout=max(0.0, until_deadline))
            finally:
                self._waiting -= 1
            if not came:
                raise _no_slot(s)
            s.take()
        bound.restart(min(bound.seconds, until_deadline - (time.monotonic() - start)))

    def release(self, ok: bool, late: float) -> None:
        """See `AsyncAdmission.release`."""
        with self._cond:
            self._state.give(ok, late)
            if self._waiting:
                self._cond.notify_all()

    def admitted(self, bound: AttemptBound, until_deadline: float) -> _Admitted:
        """`admit`, and `release` when the block ends (answered: it ended without an
        exception): ``with admission.admitted(bound, a.until_deadline): ...``."""
        return _Admitted(self, bound, until_deadline)


class _Admitted:
    """A threaded attempt's slot, held for a ``with`` block (`Admission.admitted`)."""

    __slots__ = ("_admission", "_bound", "_until")

    def __init__(self, admission: Admission, bound: AttemptBound, until_deadline: float) -> None:
        self._admission = admission
        self._bound = bound
        self._until = until_deadline

    def __enter__(self) -> None:
        self._admission.admit(self._bound, self._until)

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: Any) -> None:
        self._admission.release(et is None, self._bound.lag)


def _no_slot(s: _Limit) -> AttemptTimeout:
    return AttemptTimeout(
        f"no slot for the attempt before the turn's deadline ({s.in_flight} attempts in "
        "flight, limited while the process is starved)",
        unsent=True,
    )
