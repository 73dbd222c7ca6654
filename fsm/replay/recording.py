"""The recording as a replay reads it: its requests, its checks, each turn's virtual start.

A trace that cannot be replayed (no turn lines, a request to no target, a latency
that is not seconds) is refused here with a `ReplayError` naming its line, before
the engine (`fsm.replay.player`) runs a single turn.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

from ..kinds import Outcome, OutcomeKind
from ..trace import FORMAT, TracedTurn, TraceEvent
from .assume import KIND_NAMES


class ReplayError(ValueError):
    """A trace or a policy a replay cannot use: `line` is the trace line at fault (0: none)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.message = message


@attrs.frozen(slots=True)
class Answer:
    """One recorded request: when it started (virtual), which backend, what it produced."""

    start: float
    turn: str
    at: float  # seconds into its turn
    kind: str
    status: int | None
    retry_after: float | None
    latency: float
    partial: bool

    def outcome(self, now: float | None = None) -> Outcome:
        ra = self.retry_after
        if ra is not None and now is not None:
            ra = max(0.0, ra - (now - self.start))
        return Outcome(
            OutcomeKind(self.kind),
            status=self.status,
            retry_after=ra,
            partial="(recorded partial answer)" if self.partial else None,
        )


def asked_requests(events: Iterable[TraceEvent]) -> list[tuple[str | None, TraceEvent]]:
    """The requests of a trace: (the target name that was asked, the transition that ended
    the request). A transition names where it went; the request went to the target of
    the transition that asked for it."""
    out = []
    asked: str | None = None
    for e in events:
        if e.request:
            out.append((asked, e))
        if e.action == "Attempt":
            asked = e.target
    return out


def check_turns(turns: list[TracedTurn]) -> None:
    if not turns:
        raise ReplayError("the trace holds no turn")
    for t in turns:
        if t.header is None:
            raise ReplayError(
                f"a trace without turn lines (format {FORMAT} starts each turn with a line "
                '{"v": 1, "turn", "start", "clock", "domain", "first", "targets"}; its '
                "transitions carry latency, status and retry_after): replay needs one "
                "recorded by fallgate.record_traces",
                t.line,
            )
        _check_sequence(t)
        names = {x.name for x in t.header.targets}
        for (asked, e), n in zip(asked_requests(t.events), _request_lines(t), strict=True):
            if asked not in names:
                raise ReplayError(f"a request to {asked!r}, not a target of turn {t.id}", n)
            if e.event not in KIND_NAMES:
                raise ReplayError(f"event {e.event!r} of a request is not an outcome kind", n)
            if e.latency is None or not (math.isfinite(e.latency) and e.latency >= 0):
                raise ReplayError(f"latency {e.latency!r} must be seconds >= 0", n)
            if e.status is not None and isinstance(e.status, bool):
                raise ReplayError("status must be an integer", n)


def _check_sequence(t: TracedTurn) -> None:
    """A turn's transitions as the machine took them: numbered 1, 2, 3, ... in file
    order, each leaving the state the one before entered (a hand-edited or reordered
    file is named here, not by what replaying it would make of it)."""
    lines = t.lines or tuple(t.line for _ in t.events)
    before = "idle"
    for i, (e, n) in enumerate(zip(t.events, lines, strict=False), start=1):
        if e.seq != i:
            raise ReplayError(
                f"transition seq {e.seq} of turn {t.id} where seq {i} was due: its lines "
                "are out of order, repeated or missing",
                n,
            )
        if e.source != before:
            raise ReplayError(
                f"transition {i} of turn {t.id} leaves {e.source!r}, but the one before "
                f"it entered {before!r}",
                n,
            )
        before = e.dest


def _request_lines(t: TracedTurn) -> list[int]:
    lines = t.lines or tuple(t.line for _ in t.events)
    return [n for e, n in zip(t.events, lines, strict=False) if e.request]


def turn_starts(turns: list[TracedTurn]) -> list[float]:
    """Each turn's start on the replay's virtual clock. Turns of one clock domain keep
    their clock readings' differences exactly; domains are placed by wall-clock start.
    The domain of the earliest turn keeps its readings as they are."""
    heads = [t.header for t in turns]
    assert all(h is not None for h in heads)
    first = min(range(len(turns)), key=lambda i: (heads[i].start, i))  # type: ignore[union-attr]
    h0 = heads[first]
    assert h0 is not None
    shift: dict[str, float] = {h0.domain: 0.0}
    out = []
    for h in heads:
        assert h is not None
        if h.domain not in shift:
            shift[h.domain] = h0.clock + (h.start - h0.start) - h.clock
        out.append(h.clock + shift[h.domain])
    return out
