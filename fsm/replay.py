"""What-if replay: recorded provider behaviour fed to another policy's core on virtual time.

`replay(turns, policy)` runs every recorded turn (trace format 1, `fsm.trace`) again
under `policy`, on one virtual clock and one fresh health store, so what one turn
learns (a breaker, a budget, a cooldown) steers the turns after it as it would have.
The turns run together in start order, as they ran: each is one `fsm.Turn` driven like a
host loop drives it, its requests and waits taking virtual time.

What a request is answered with, in this order:

1. **On the recorded path** (every transition of the turn so far is the recorded one:
   same states, event, target, key and wait): the recorded answer of that request, with
   its recorded latency. Under the recording policy a turn never leaves its recorded
   path, so the replay reproduces the recording: the same transitions, waits, requests,
   end states and times. The host's own time on the recorded path is replayed as
   recorded too (a wait that overslept, a client rebuild, the turn's start), so a
   recording on the system clock replays to the microsecond (its rounding).
2. **Off it**, the backend's (endpoint and model) latest recorded request that started
   at or before this virtual time, in any turn (on a tie, the first in the file): its
   outcome and latency, its Retry-After shortened by the time since. Listed as an
   assumption.
3. **Nothing recorded at or before that time**: the target's `Assume` rule (``--assume``):
   ``recorded`` (the default) draws from the backend's recorded outcome mix with its
   median latency (a backend never recorded is ``unknown``); ``KIND:SECONDS[:RETRY_AFTER]``
   answers so (``success:0.4``); ``unknown`` stops the turn there (it ends ``unknown``).
   Listed as an assumption.

A request whose latency exceeds the new policy's attempt timeout times out (transport).
Jitter draws the turn's recorded random values first, in order, then a generator seeded
with ``seed`` and the turn's id; the mix draws use their own seeded generator: a replay
is deterministic given its seed. Pure: no I/O, no wall clock.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random as _random
import statistics
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from .actions import Action, Attempt, Rebuild, Wait
from .health import HealthStore
from .machine import TERMINALS
from .outcomes import Outcome, OutcomeKind
from .policy import Policy, Target
from .trace import FORMAT, TracedTurn, TraceError, TraceEvent, read_turns
from .turn import Turn

__all__ = ["Assume", "Assumption", "ReplayError", "ReplayReport", "TurnReport", "replay"]

_KINDS: Final = frozenset(k.value for k in OutcomeKind)
#: Trace times are rounded to the microsecond: differences below this are rounding.
_ROUNDING: Final = 2e-6
UNKNOWN: Final = "unknown"


class ReplayError(ValueError):
    """A trace or a policy a replay cannot use: `line` is the trace line at fault (0: none)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.message = message


def _seconds(text: str, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{what} must be a number of seconds, not {text!r}") from None
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{what} must be a finite number of seconds >= 0, not {text!r}")
    return v


@attrs.frozen(slots=True)
class Assume:
    """What to assume for a request the recording cannot answer (see the module)."""

    kind: str
    latency: float = 0.0
    retry_after: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.kind not in _KINDS | {"recorded", UNKNOWN} or self.kind == "cancelled":
            raise ValueError(
                f"assumption {self.kind!r}: expected recorded, unknown or an outcome kind "
                f"({', '.join(sorted(_KINDS - {'cancelled'}))})"
            )

    @classmethod
    def parse(cls, text: str | Assume) -> Assume:
        """``recorded``, ``unknown``, ``KIND:SECONDS`` or ``KIND:SECONDS:RETRY_AFTER``."""
        if isinstance(text, Assume):
            return text
        parts = text.strip().split(":")
        if parts[0] in ("recorded", UNKNOWN):
            if len(parts) > 1:
                raise ValueError(f"assumption {text!r}: {parts[0]} takes no seconds")
            return cls(parts[0])
        if not 2 <= len(parts) <= 3:
            raise ValueError(
                f"assumption {text!r}: expected KIND:SECONDS[:RETRY_AFTER] (e.g. success:0.4), "
                "recorded or unknown"
            )
        ra = _seconds(parts[2], "Retry-After") if len(parts) == 3 else None
        return cls(parts[0], _seconds(parts[1], "the latency"), ra)

    def __str__(self) -> str:
        if self.kind in ("recorded", UNKNOWN):
            return self.kind
        ra = f":{self.retry_after:g}" if self.retry_after is not None else ""
        return f"{self.kind}:{self.latency:g}{ra}"


@attrs.frozen(slots=True)
class Assumption:
    """A request the recording did not answer as such, and what the replay assumed."""

    turn: str
    at: float  # seconds into the turn
    target: str  # the replayed policy's target name
    backend: str  # its label (model, or model@endpoint)
    what: str

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen(slots=True)
class Path:
    """One turn's run, recorded or replayed."""

    seconds: float
    requests: Mapping[str, int]
    end: str
    waits: tuple[float, ...]
    trace: tuple[TraceEvent, ...] = attrs.field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "requests": dict(self.requests),
            "end": self.end,
            "waits": list(self.waits),
        }


@attrs.frozen(slots=True)
class TurnReport:
    """One turn: as recorded, as replayed, and what the replay assumed."""

    turn: str
    start: float  # seconds after the first turn started
    recorded: Path
    replayed: Path
    assumptions: tuple[Assumption, ...]
    stopped: str | None = None

    @property
    def same_path(self) -> bool:
        """The replay took the recorded transitions, one for one (times aside)."""
        a, b = self.recorded.trace, self.replayed.trace
        return len(a) == len(b) and all(x.same_step(y) for x, y in zip(a, b, strict=True))

    @property
    def saved(self) -> float | None:
        """Seconds the replay answered sooner (None: the replay stopped, unknown)."""
        if self.stopped is not None:
            return None
        return round(self.recorded.seconds - self.replayed.seconds, 6)

    def as_dict(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "start": round(self.start, 6),
            "recorded": self.recorded.as_dict(),
            "replayed": {**self.replayed.as_dict(), "stopped": self.stopped},
            "assumptions": [a.as_dict() for a in self.assumptions],
            "same_path": self.same_path,
            "saved_seconds": self.saved,
        }


def _total(paths: Iterable[Path]) -> dict[str, Any]:
    seconds = 0.0
    requests: dict[str, int] = {}
    ends: dict[str, int] = {}
    for p in paths:
        seconds += p.seconds
        for k, n in p.requests.items():
            requests[k] = requests.get(k, 0) + n
        ends[p.end] = ends.get(p.end, 0) + 1
    return {"seconds": round(seconds, 6), "requests": requests, "ends": ends}


@attrs.frozen(slots=True)
class ReplayReport:
    """Every turn, recorded and replayed, and the totals."""

    turns: tuple[TurnReport, ...]
    seed: int

    @property
    def assumptions(self) -> tuple[Assumption, ...]:
        return tuple(a for t in self.turns for a in t.assumptions)

    @property
    def recorded(self) -> dict[str, Any]:
        """Totals as recorded: seconds (summed over turns), requests per backend, ends."""
        return _total(t.recorded for t in self.turns)

    @property
    def replayed(self) -> dict[str, Any]:
        return _total(t.replayed for t in self.turns)

    def text(self) -> str:
        """The report as a table: per turn and in total, then waits and assumptions."""
        rows = [("turn", "start", "recorded", "replayed", "saved", "requests recorded", "replayed")]

        def reqs(r: Mapping[str, int]) -> str:
            return ", ".join(f"{k} {n}" for k, n in sorted(r.items())) or "-"

        for t in self.turns:
            rows.append(
                (
                    t.turn,
                    f"+{t.start:.1f}s",
                    f"{t.recorded.seconds:.3f}s {t.recorded.end}",
                    f"{t.replayed.seconds:.3f}s {t.replayed.end}",
                    f"{t.saved:.3f}s" if t.saved is not None else "?",
                    reqs(t.recorded.requests),
                    reqs(t.replayed.requests),
                )
            )
        a, b = self.recorded, self.replayed

        def ends(e: Mapping[str, int]) -> str:
            return ", ".join(f"{n} {k}" for k, n in sorted(e.items()))

        rows.append(
            (
                "total",
                "",
                f"{a['seconds']:.3f}s {ends(a['ends'])}",
                f"{b['seconds']:.3f}s {ends(b['ends'])}",
                f"{a['seconds'] - b['seconds']:.3f}s" if UNKNOWN not in b["ends"] else "?",
                reqs(a["requests"]),
                reqs(b["requests"]),
            )
        )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
        waits = [
            f"  {t.turn}: recorded {_list(t.recorded.waits)}; replayed {_list(t.replayed.waits)}"
            for t in self.turns
            if t.recorded.waits or t.replayed.waits
        ]
        if waits:
            lines += ["", "waits (seconds):", *waits]
        same = sum(t.same_path for t in self.turns)
        lines += ["", f"{same} of {len(self.turns)} turns took their recorded path"]
        found = self.assumptions
        lines += ["", f"assumptions ({len(found)}):" if found else "assumptions: none"]
        lines += [f"  {x.turn} +{x.at:.3f}s {x.target} ({x.backend}): {x.what}" for x in found]
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "recorded": self.recorded,
            "replayed": {**self.replayed, "assumptions": [a.as_dict() for a in self.assumptions]},
            "turns": [t.as_dict() for t in self.turns],
        }


# -- the recording, as the replay reads it ------------------------------------------------------


@attrs.frozen(slots=True)
class _Answer:
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


def _asked(events: Iterable[TraceEvent]) -> list[tuple[str | None, TraceEvent]]:
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


def _check_turns(turns: list[TracedTurn]) -> None:
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
        names = {x.name for x in t.header.targets}
        for (asked, e), n in zip(_asked(t.events), _request_lines(t), strict=True):
            if asked not in names:
                raise ReplayError(f"a request to {asked!r}, not a target of turn {t.id}", n)
            if e.event not in _KINDS:
                raise ReplayError(f"event {e.event!r} of a request is not an outcome kind", n)
            if e.latency is None or not (math.isfinite(e.latency) and e.latency >= 0):
                raise ReplayError(f"latency {e.latency!r} must be seconds >= 0", n)
            if e.status is not None and isinstance(e.status, bool):
                raise ReplayError("status must be an integer", n)


def _request_lines(t: TracedTurn) -> list[int]:
    lines = t.lines or tuple(t.line for _ in t.events)
    return [n for e, n in zip(t.events, lines, strict=False) if e.request]


def _starts(turns: list[TracedTurn]) -> list[float]:
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


# -- the replay ---------------------------------------------------------------------------------


class _Now:
    """The replay's virtual clock (one for every turn)."""

    __slots__ = ("t",)

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class _Draws:
    """The turn's recorded random values in order, then a seeded generator."""

    __slots__ = ("i", "more", "values")

    def __init__(self, values: list[float], seed: str) -> None:
        self.values = values
        self.i = 0
        self.more = _random.Random(seed).random

    def __call__(self) -> float:
        if self.i < len(self.values):
            self.i += 1
            return self.values[self.i - 1]
        return self.more()


class _Run:
    """One turn being replayed."""

    def __init__(self, rec: TracedTurn, start: float, first: int, seed: int) -> None:
        self.rec = rec
        self.start = start
        self.first = first
        draws = [x for e in rec.events for x in e.draws]
        self.random = _Draws(draws, f"{seed}/{rec.id}")
        self.mix = _random.Random(f"{seed}/{rec.id}/mix")
        self.turn: Turn | None = None
        self.pending: Outcome | None = None
        self.cancel = False
        self.on_script = True
        self.checked = 0
        self.assumptions: list[Assumption] = []
        self.stopped: str | None = None
        self.rebuilding: bool | None = None  # a rebuild under way, and how it ends
        self.due = start  # when the turn goes on next

    def follow(self) -> None:
        """Is the turn still on its recorded path?"""
        assert self.turn is not None
        trace = self.turn.trace
        rec = self.rec.events
        while self.checked < len(trace):
            i = self.checked
            if self.on_script and (i >= len(rec) or not trace[i].same_step(rec[i])):
                self.on_script = False
            self.checked += 1

    def took(self, nxt: TraceEvent | None, event: str) -> float:
        """How long the host took, as recorded, to carry out the action the recorded path
        asked for last, when `nxt` (the recorded transition after it) is `event`; else 0."""
        if nxt is None or nxt.event != event:
            return 0.0
        assert self.turn is not None
        i = len(self.turn.trace)
        return nxt.time - self.rec.events[i - 1].time if i > 0 else 0.0

    def recorded_next(self) -> TraceEvent | None:
        """The recorded transition that comes next, while on the recorded path."""
        assert self.turn is not None
        i = len(self.turn.trace)
        return self.rec.events[i] if self.on_script and i < len(self.rec.events) else None


class _Replay:
    def __init__(
        self,
        turns: list[TracedTurn],
        policy: Policy,
        seed: int,
        rules: Mapping[str, Assume],
        default: Assume,
    ) -> None:
        self.policy = policy
        self.rules = rules
        self.default = default
        self.health = HealthStore()
        starts = _starts(turns)
        self.origin = min(starts)
        self.clock = _Now(self.origin)
        self.keys = {t.key for t in policy.targets}
        # every recorded request by backend, in start order (then file order)
        self.answers: dict[tuple[str, str], list[_Answer]] = {}
        self.recorded_keys: set[tuple[str, str]] = set()
        for t, start in zip(turns, starts, strict=True):
            assert t.header is not None
            by_name = {x.name: x.key for x in t.header.targets}
            self.recorded_keys.update(by_name.values())
            for asked, e in _asked(t.events):
                assert asked is not None and e.latency is not None
                a = _Answer(
                    start + e.time - e.latency,
                    t.id,
                    e.time - e.latency,
                    e.event,
                    e.status,
                    e.retry_after,
                    e.latency,
                    bool(e.partial),
                )
                self.answers.setdefault(by_name[asked], []).append(a)
        for lst in self.answers.values():
            lst.sort(key=lambda a: a.start)  # stable: file order on a tie
        self.starts_of = {k: [a.start for a in v] for k, v in self.answers.items()}
        self.runs = []
        index: dict[tuple[str, str], int] = {}
        for x in policy.targets:
            index.setdefault(x.key, x.index)
        for t, start in zip(turns, starts, strict=True):
            assert t.header is not None
            h = t.header
            first = 0
            if 0 < h.first < len(h.targets):  # a turn that started down the chain
                key = h.targets[h.first].key
                same = h.first < len(policy.targets) and policy.targets[h.first].key == key
                first = h.first if same else index.get(key, 0)
            self.runs.append(_Run(t, start, first, seed))
        self.labels = _labels(self.keys | self.recorded_keys)

    def label(self, key: tuple[str, str]) -> str:
        return self.labels[key]

    def run(self) -> None:
        # in time order to the microsecond (a recording's resolution), then in start order:
        # a turn that starts as another's event happens comes after it
        heap: list[tuple[float, int, int, _Run]] = []
        tick = 0
        order = sorted(range(len(self.runs)), key=lambda i: (self.runs[i].start, i))
        for rank, i in enumerate(order):
            heapq.heappush(heap, (_tick(self.runs[i].start), rank, tick, self.runs[i]))
            tick += 1
        while heap:
            _, rank, _, r = heapq.heappop(heap)
            self.clock.t = r.due
            nxt = self.step(r)
            if nxt is not None:
                tick += 1
                r.due = nxt
                heapq.heappush(heap, (_tick(nxt), rank, tick, r))

    def step(self, r: _Run) -> float | None:
        """Carry the turn on until it needs time to pass; when it goes on (None: ended)."""
        now = self.clock.t
        t = r.turn
        action: Action
        if t is None:
            t = r.turn = Turn(
                self.policy, health=self.health, clock=self.clock, random=r.random, first=r.first
            )
            events = r.rec.events
            if events and events[0].time > _ROUNDING:  # the host started it that much later
                return now + events[0].time
            action = t.start()
        elif not t.trace:
            action = t.start()
        elif r.cancel:
            action = t.cancel()
        elif r.pending is not None:
            o, r.pending = r.pending, None
            action = t.feed(o)
        elif r.rebuilding is not None:
            ok, r.rebuilding = r.rebuilding, None
            action = t.rebuilt(ok)
        else:
            action = t.waited()
        health = self.health
        while True:
            r.follow()
            if t.done:
                return None
            nxt = r.recorded_next()
            if nxt is not None and nxt.event == "cancelled" and type(action) is not Rebuild:
                r.cancel = True  # the recorded turn was cancelled here
                return r.start + nxt.time
            if type(action) is Attempt:
                if action.probe or action.retry or not health.quiet():
                    why = health.grant(t.s, action)
                    if why is not None:
                        action = t.deny(why)
                        continue
                answer = self.answer(r, action, now, nxt)
                if answer is None:
                    action = t.cancel()
                    continue
                o, latency = answer
                if latency > action.timeout:
                    o = Outcome(
                        OutcomeKind.TRANSPORT,
                        detail=f"timed out: the recorded answer took {latency:g}s",
                    )
                    latency = action.timeout
                r.pending = o
                return now + latency
            if type(action) is Wait:
                took = r.took(nxt, "waited")
                if took > action.seconds + _ROUNDING:  # the recording overslept: as it did
                    return now + took
                if action.seconds > 0:
                    return now + action.seconds
                action = t.waited()
                continue
            if type(action) is Rebuild:
                ok = not (nxt is not None and nxt.event == "rebuild_failed")
                took = r.took(nxt, "rebuilt" if ok else "rebuild_failed")
                if took > _ROUNDING:  # the recorded rebuild took time: so does this one
                    r.rebuilding = ok
                    return now + took
                action = t.rebuilt(ok)
                continue
            return None  # Finish or Fail: `done` on the next look

    def answer(
        self, r: _Run, a: Attempt, now: float, nxt: TraceEvent | None
    ) -> tuple[Outcome, float] | None:
        """The answer to request `a` at `now` and its latency; None stops the turn."""
        if nxt is not None and nxt.request and nxt.latency is not None:
            o = Outcome(
                OutcomeKind(nxt.event),
                status=nxt.status,
                retry_after=nxt.retry_after,
                partial="(recorded partial answer)" if nxt.partial else None,
            )
            return o, nxt.latency
        key = a.target.key
        at = now - r.start
        label = self.label(key)

        def note(what: str) -> None:
            r.assumptions.append(Assumption(r.rec.id, round(at, 6), a.target.name, label, what))

        found = self.answers.get(key, [])
        starts = self.starts_of.get(key, [])
        i = bisect.bisect_right(starts, now)
        if i > 0:
            j = bisect.bisect_left(starts, starts[i - 1])  # the first on a tie
            ans = found[j]
            o = ans.outcome(now)
            note(
                f"answered as {label} answered turn {ans.turn} at +{ans.at:.3f}s "
                f"({_words(o)}, {ans.latency:.3f}s)"
            )
            return o, ans.latency
        rule = self.rule(a.target)
        if rule.kind == "recorded":
            if found:
                pick = found[int(r.mix.random() * len(found)) % len(found)]
                latency = statistics.median(x.latency for x in found)
                o = pick.outcome()
                kinds = sorted({x.kind for x in found})
                note(
                    f"nothing recorded before this time: drawn from {label}'s recorded "
                    f"mix ({', '.join(kinds)} over {len(found)} "
                    f"request{'s' if len(found) > 1 else ''}): {_words(o)}, "
                    f"median latency {latency:.3f}s"
                )
                return o, latency
            rule = Assume(UNKNOWN)
        if rule.kind == UNKNOWN:
            never = "never recorded" if key not in self.answers else "not recorded before this"
            r.stopped = f"{a.target.name} ({label}) was {never}; turn stopped (assume unknown)"
            note(f"unknown: {label} {never}; the turn stopped here")
            return None
        o = Outcome(OutcomeKind(rule.kind), retry_after=rule.retry_after)
        note(f"assumed {rule} (given)")
        return o, rule.latency

    def rule(self, t: Target) -> Assume:
        for name in (t.name, f"{t.model}@{t.key[0]}", t.model, t.provider):
            found = self.rules.get(name)
            if found is not None:
                return found
        return self.default


def _tick(t: float) -> float:
    """`t` to the microsecond, for ordering events of different turns."""
    return round(t, 6)


def _list(xs: Iterable[float]) -> str:
    return " ".join(f"{x:.3f}" for x in xs) or "-"


def _words(o: Outcome) -> str:
    text = o.kind.value
    if o.status is not None:
        text += f" {o.status}"
    if o.retry_after is not None:
        text += f", Retry-After {o.retry_after:g}s"
    return text


def _labels(keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Each backend's label: its model, or model@endpoint where two share a model."""
    keys = list(keys)
    models: dict[str, int] = {}
    for _, m in keys:
        models[m] = models.get(m, 0) + 1
    return {k: k[1] if models[k[1]] == 1 else f"{k[1]}@{k[0]}" for k in keys}


def _path(
    events: Iterable[TraceEvent], key_of: Mapping[str, tuple[str, str]], labels: Mapping[Any, str]
) -> Path:
    events = tuple(events)
    requests: dict[str, int] = {}
    for asked, _ in _asked(events):
        if asked is None:
            continue
        label = labels[key_of[asked]]
        requests[label] = requests.get(label, 0) + 1
    end = events[-1].dest if events and events[-1].dest in TERMINALS else "unfinished"
    waits = tuple(e.wait for e in events if e.action == "Wait" and e.wait is not None)
    return Path(round(events[-1].time, 6) if events else 0.0, requests, end, waits, events)


def replay(
    turns: str | Iterable[TracedTurn],
    policy: Policy,
    *,
    seed: int = 0,
    assume: Mapping[str, Assume | str] | None = None,
    default: Assume | str = "recorded",
) -> ReplayReport:
    """Replay recorded turns (trace JSON lines, or `fsm.trace.read_turns`'s turns) under
    `policy`. `assume` maps a target (the policy's name for it, ``model@endpoint``, its
    model or its provider) to what to assume for requests the recording cannot answer;
    `default` is the rule for the others. Raises `ReplayError` (naming the trace line)
    for a trace that cannot be replayed, ValueError for a bad assumption."""
    if isinstance(turns, str):
        try:
            turns = read_turns(turns)
        except TraceError as e:
            raise ReplayError(e.message, e.line) from None
    got = list(turns)
    _check_turns(got)
    rules = {k: Assume.parse(v) for k, v in (assume or {}).items()}
    names = {
        n for t in policy.targets for n in (t.name, f"{t.model}@{t.key[0]}", t.model, t.provider)
    }
    unknown = sorted(set(rules) - names)
    if unknown:
        raise ValueError(
            f"--assume names no target of the policy: {', '.join(unknown)} (targets: "
            f"{', '.join(t.name + ' ' + t.model for t in policy.targets)})"
        )
    r = _Replay(got, policy, seed, rules, Assume.parse(default))
    if not r.keys & r.recorded_keys:
        rec = sorted(f"{m}@{e}" for e, m in r.recorded_keys)
        new = sorted(f"{t.model}@{t.key[0]}" for t in policy.targets)
        raise ReplayError(
            f"the policy's targets ({', '.join(new)}) match no recorded target "
            f"({', '.join(rec)}): targets are matched by model and base_url"
        )
    r.run()
    new_keys = {t.name: t.key for t in policy.targets}
    out = []
    for run in r.runs:
        h = run.rec.header
        assert h is not None and run.turn is not None
        recorded = _path(run.rec.events, {x.name: x.key for x in h.targets}, r.labels)
        if run.stopped is None:
            replayed = _path(run.turn.trace, new_keys, r.labels)
        else:  # its last transition is the stop: no request went out
            replayed = _path(run.turn.trace[:-1], new_keys, r.labels)
            replayed = attrs.evolve(replayed, end=UNKNOWN, trace=tuple(run.turn.trace))
        out.append(
            TurnReport(
                run.rec.id,
                run.start - r.origin,
                recorded,
                replayed,
                tuple(run.assumptions),
                run.stopped,
            )
        )
    out.sort(key=lambda t: t.start)
    return ReplayReport(tuple(out), seed)
