"""The bounds of one attempt in progress: its phases, their deadlines, and what it raises.

An attempt moves through phases, each with a deadline of its own (the policy's fields):
connecting (``connect_timeout``, per TCP + TLS setup), waiting for the first byte of a
non-streamed reply (``first_byte_timeout``: its headers) or for a stream's first event
(``first_event_timeout``), then the rest of a non-streamed reply (the total,
``attempt_timeout``, or what the turn's deadline leaves) or, for a started stream, each
wait for its next event (``stream_idle_timeout``; until it commits, never past the
turn's deadline, nor, for a stream, into the time the next target's attempt needs:
`fsm.core.reserve.stream_hold`). Each is capped by the total. `AttemptBound` holds the one in force;
`providers.openai.http.bounds` enforces it at the socket.

A timer that fires much later than due says the process was starved (its event loop,
or its threads, did not run): the reply may have been sitting unread in the socket all
along, so the timeout is no evidence that the target is slow or down (`starved`,
`AttemptTimeout.starved`).
"""

from __future__ import annotations

import math
import time

from ..exceptions import MalformedReply

__all__ = [
    "STARVATION",
    "STARVED_AFTER",
    "STARVED_SHARE",
    "AttemptBound",
    "AttemptTimeout",
    "BodyTooLarge",
    "Spent",
    "starved",
]

_MONOTONIC = time.monotonic

#: A timer that fired later than this (seconds) past its due time, and by more than
#: `STARVED_SHARE` of its own length, fired late because the process was starved: 0.1 s
#: is asyncio's own threshold for a callback that blocks the loop
#: (``loop.slow_callback_duration``); the share keeps ordinary scheduling noise on a
#: busy machine (a few hundredths of a 4 s timeout) the target's.
STARVED_AFTER = 0.1
STARVED_SHARE = 0.25


def starved(late: float, length: float) -> bool:
    """Did a timer `length` seconds long that fired `late` seconds past its due time
    fire late because the process was starved?"""
    return late > STARVED_AFTER and late > STARVED_SHARE * length


class _Starvation:
    """When a timer of this process last fired late enough to say it was starved, and
    how late (starvation is the process's: every client in it shares the CPU). An
    attempt whose own timer fired on time, but that was out while the process starved,
    spent its time waiting for the process too (each of its steps waits for a loop
    iteration): its timeout is no more the target's than a late one."""

    __slots__ = ("at", "late")

    def __init__(self) -> None:
        self.at = -math.inf
        self.late = 0.0


STARVATION = _Starvation()


class AttemptTimeout(TimeoutError):
    """An attempt ran out of its total time (or a stream out of its idle time), or a
    timer of it fired late.
    `unsent`: it ran out before the attempt's first network operation (the client
    was busy: under a burst a thousand turns share one event loop), so the target
    never saw it. `starved`: the timer that ended it fired well past its due time
    (`starved()`): the process did not run meanwhile, so whatever the target did
    went unobserved. `cut_short`: the turn's deadline cut it before its
    `attempt_timeout` (it was given only what the turn had left), which says nothing
    of the target. Any of them makes it a client-side fault (`client_side`): no
    breaker or key is benched for it."""

    def __init__(
        self, message: str, unsent: bool = False, starved: bool = False, cut_short: bool = False
    ) -> None:
        super().__init__(message)
        self.unsent = unsent
        self.starved = starved
        self.cut_short = cut_short

    @property
    def client_side(self) -> bool:
        """The fault is this client's, not the target's (`fsm.Outcome.client_side`)."""
        return self.unsent or self.starved or self.cut_short


class BodyTooLarge(MalformedReply):
    """A reply larger than ``max_body_bytes`` (classified as a malformed reply)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the reply exceeded max_body_bytes ({limit} bytes)")
        self.limit = limit


class AttemptBound:
    """The bounds of one attempt in progress (mutable: its phase moves its deadline).

    The phases, each with its deadline (`deadline`, the one in force, is the least):
    ``connect`` (each TCP + TLS setup: `connect` seconds), ``first byte`` (a
    non-streamed reply's headers) or ``first event`` (a stream's), then ``total`` (the
    rest of a non-streamed reply, until `seconds` from the start) or ``idle`` (a
    started stream: each wait for its next event, `idle_s` seconds; capped by
    `turn_left` (the turn's deadline, or where the next target's reserve begins) until
    it commits)."""

    __slots__ = (
        "_attempt_s",
        "_deadline_s",
        "_first",
        "_first_field",
        "_hold_left",
        "committed",
        "connect",
        "deadline",
        "due",
        "end",
        "field",
        "hold_end",
        "idle_s",
        "lag",
        "late",
        "late_timer",
        "max_bytes",
        "phase",
        "progressed",
        "received",
        "seconds",
        "started",
        "stream",
        "timed_out",
        "touched",
        "tripped",
        "turn_end",
        "unsent",
    )

    def __init__(
        self,
        seconds: float,
        max_bytes: int,
        *,
        connect: float = math.inf,
        first: float = math.inf,
        first_field: str = "",
        idle: float = math.inf,
        stream: bool = False,
        turn_left: float = math.inf,
        hold_left: float = math.inf,
        attempt_timeout: float | None = None,
        deadline: float | None = None,
    ) -> None:
        #: The limit the deadline was last set from, the phase it bounds and the
        #: policy field it came from (for messages).
        self.seconds = seconds
        #: The policy's ``attempt_timeout`` and ``deadline`` (when known): a total shorter
        #: than ``attempt_timeout`` is what the turn's deadline left, and says so.
        self._attempt_s = attempt_timeout
        self._deadline_s = deadline
        self.phase = "total"
        self.field = "attempt_timeout"
        self.connect = connect
        self.idle_s = idle
        self.stream = stream
        self.committed = False
        #: The stream said something (output, reasoning): the hold no longer applies.
        self.progressed = False
        self._hold_left = hold_left
        self._first = first
        self._first_field = first_field
        self.max_bytes = max_bytes
        self.received = 0
        #: What ran out: "time", "bytes", or None.
        self.tripped: str | None = None
        #: A network operation (connect, read, write) has started under this bound.
        self.touched = False
        #: The time ran out before any did.
        self.unsent = False
        #: How late a timer of this attempt fired, when it fired late enough to say the
        #: process was starved (`starved()`); 0.0 otherwise. `late_timer` names it.
        self.late = 0.0
        self.late_timer = ""
        #: How late its timers fired at most, however little (`admission` reads it).
        self.lag = 0.0
        #: A timer of it fired (`fired`).
        self.timed_out = False
        self.started = self.end = self.deadline = self.due = self.turn_end = self.hold_end = 0.0
        self.restart(seconds, turn_left)

    def restart(self, seconds: float, turn_left: float | None = None) -> None:
        """Start the bound over from now, `seconds` long (the attempt waited for a slot
        before it began: `admission`)."""
        now = _MONOTONIC()
        self.seconds = seconds
        self.started = now
        self.end = now + seconds
        if turn_left is not None:
            self.turn_end = now + max(seconds, turn_left)
        elif self.turn_end < self.end:
            self.turn_end = self.end
        # a stream that has said nothing: no further than where the next target's reserve
        # begins (`fsm.core.reserve.stream_hold`), never short of its own bound
        self.hold_end = min(self.turn_end, max(self.end, now + self._hold_left))
        self.phase, self.field, self.deadline = "total", "attempt_timeout", self.end
        if self._first < seconds:
            self.phase = "first event" if self.stream else "first byte"
            self.field = self._first_field
            self.deadline = now + self._first
        self.due = self.deadline

    def first_byte(self) -> None:
        """A non-streamed reply's first byte came: from now on only its total bounds it."""
        if self.phase == "first byte":
            self.phase, self.field, self.deadline = "total", "attempt_timeout", self.end

    def event(self, committed: bool = False, progress: bool = False) -> None:
        """A stream's event came: the next must come within the idle bound (and, until
        the stream is `committed` to the caller, within the turn's deadline; until it has
        said something, `progress`: output or reasoning, within the hold)."""
        self.committed = self.committed or committed
        self.progressed = self.progressed or progress or committed
        now = _MONOTONIC()
        self.phase, self.field = "idle", "stream_idle_timeout"
        self.deadline = now + self.idle_s
        if self.committed:
            return
        cap = self.turn_end if self.progressed else self.hold_end
        if self.deadline > cap:
            self.phase, self.field, self.deadline = "deadline", "deadline", cap

    def left(self) -> float:
        return self.deadline - _MONOTONIC()

    def limit(self, timeout: float | None, connecting: bool = False) -> float:
        """The timeout for one socket operation starting now (noted as `due`); raises
        `Spent` once the deadline has passed (noting how long ago: no network
        operation was waiting then, so a deadline noticed long after it passed ran out
        while the process was kept from running)."""
        now = _MONOTONIC()
        left = self.deadline - now
        if left <= 0:
            if self.tripped is None:
                self.tripped = "time"
                self.unsent = not self.touched
                self.fired("total time bound", self.seconds, self.deadline)
            raise Spent
        self.touched = True
        t = left if timeout is None or timeout > left else timeout
        if connecting and self.connect < t:
            t = self.connect
        self.due = now + t
        return t

    def fired(self, timer: str, length: float, due: float) -> None:
        """A timer of this attempt (`timer`, `length` seconds, due at `due`) fired: note
        how late, when that says the process was starved."""
        now = _MONOTONIC()
        late = now - due
        self.timed_out = True
        if late > self.lag:
            self.lag = late
        if starved(late, length):
            STARVATION.at = now
            STARVATION.late = late
            if late > self.late:
                self.late = late
                self.late_timer = timer
        elif not self.late and STARVATION.at >= self.started:
            # on time, but the process starved while this attempt was out
            self.late = STARVATION.late
            self.late_timer = "process's timers"

    def starved(self) -> bool:
        """Was the process starved while this attempt was out, as far as it knows?"""
        return self.late > 0.0

    def error(self) -> Exception:
        """What the attempt raises once a bound has tripped, or once a timer of it fired
        late enough to say the process was starved."""
        if self.tripped == "bytes":
            return BodyTooLarge(self.max_bytes)
        starved = self.late > 0.0
        late = (
            f"the {self.late_timer} fired {self.late:.2g} s late (the process was starved)"
            if starved
            else ""
        )
        if self.tripped is None:  # a timer of the SDK's own (per phase), fired late
            return AttemptTimeout(late, starved=starved)
        late = f"; {late}" if starved else ""
        if self.phase == "idle":
            return AttemptTimeout(
                f"stream idle for {self.idle_s:g} s (stream_idle_timeout){late}", starved=starved
            )
        if self.phase == "connect":
            what = f"connecting took over {self.connect:g} s (connect_timeout)"
        elif self.phase in ("first byte", "first event"):
            what = f"no {self.phase} within {self._first:g} s ({self.field})"
        elif self.phase == "deadline":
            what = (
                "the stream delivered no output before the turn's deadline, or the time "
                "kept for the next target's attempt (reserve)"
            )
        else:
            what = self._total()
        if self.unsent:
            return AttemptTimeout(
                f"{what} before it reached the network{late}", unsent=True, starved=starved
            )
        cut = self.phase == "total" and self._cut_short()
        return AttemptTimeout(f"{what}{late}", starved=starved, cut_short=cut)

    def _cut_short(self) -> bool:
        """Did the turn's deadline end the attempt before its `attempt_timeout`?"""
        return self._attempt_s is not None and self.seconds < self._attempt_s

    def _total(self) -> str:
        """What ran out when the total did: ``attempt_timeout`` (its words as ever), or the
        turn's deadline when that is what cut the attempt short of it (the time left,
        rounded: the same cut reads the same from run to run)."""
        at = self._attempt_s
        if at is not None and self._cut_short():
            left = self.seconds
            about = f"{left:.0f}" if left >= 10 else f"{left:.2g}"
            turn = "" if self._deadline_s is None else f" {self._deadline_s:g} s"
            return (
                f"cut at the turn's{turn} deadline ({about} s were left; attempt_timeout {at:g} s)"
            )
        return f"attempt exceeded its {self.seconds:g} s total time bound"


class Spent(Exception):
    """The attempt's deadline passed before a socket operation began (`limit`)."""
