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

A request whose latency exceeds the new policy's attempt timeout times out (transport),
but a recorded timeout that ended a little past that bound (`_TIMEOUT_LAG`) replays as
recorded.
Jitter draws the turn's recorded random values first, in order, then a generator seeded
with ``seed`` and the turn's id; the mix draws use their own seeded generator: a replay
is deterministic given its seed. Pure: no I/O, no wall clock.

This module is the engine; `fsm.replay.assume` holds the ``--assume`` rules,
`fsm.replay.recording` reads and checks the recording, `fsm.replay.report` the result
and its text.
"""

from __future__ import annotations

import bisect
import heapq
import random as _random
import statistics
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from ..core.actions import Action, Attempt, Rebuild, Wait
from ..core.machine import TERMINALS
from ..core.turn import Turn
from ..health.store import HealthStore
from ..kinds import Outcome, OutcomeKind
from ..policy.model import Policy, Target
from ..trace import TracedTurn, TraceError, TraceEvent, read_turns
from .assume import UNKNOWN, Assume, Assumption
from .recording import Answer, ReplayError, asked_requests, check_turns, turn_starts
from .report import Path, ReplayReport, TurnReport

__all__ = ["Assume", "Assumption", "ReplayError", "ReplayReport", "TurnReport", "replay"]

#: Trace times are rounded to the microsecond: differences below this are rounding.
_ROUNDING: Final = 2e-6


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


#: How far past its bound a recorded timeout may end and still be that bound's: the
#: host's lag in noticing it (the bounds hold within some 50 ms on an idle machine).
_TIMEOUT_LAG: Final = 0.1


def _timed_out_at(o: Outcome, latency: float, a: Attempt) -> bool:
    """Is the recorded answer a timeout at this attempt's own bound (a transport fault
    that ended at most `_TIMEOUT_LAG` past it)? Then it replays as recorded, the host's
    lag included: under the recording policy a timeout is no time saved."""
    return o.kind is OutcomeKind.TRANSPORT and latency <= a.timeout + _TIMEOUT_LAG


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
        # one store per store the recording's turns used (turns of one learnt from each
        # other, those of two processes with their own stores did not); a recording that
        # does not name its stores shares one
        self.stores: dict[str | None, HealthStore] = {}
        starts = turn_starts(turns)
        self.origin = min(starts)
        self.clock = _Now(self.origin)
        self.keys = {t.key for t in policy.targets}
        # every recorded request by backend, in start order (then file order)
        self.answers: dict[tuple[str, str], list[Answer]] = {}
        self.recorded_keys: set[tuple[str, str]] = set()
        for t, start in zip(turns, starts, strict=True):
            assert t.header is not None
            by_name = {x.name: x.key for x in t.header.targets}
            self.recorded_keys.update(by_name.values())
            for asked, e in asked_requests(t.events):
                assert asked is not None and e.latency is not None
                a = Answer(
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
                self.policy,
                health=self.store_of(r.rec),
                clock=self.clock,
                random=r.random,
                first=r.first,
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
        health = t.s.health
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
                if latency > action.timeout + _ROUNDING and not _timed_out_at(o, latency, action):
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

    def store_of(self, rec: TracedTurn) -> HealthStore:
        """The replay's health store for the store `rec` was recorded on."""
        name = rec.header.store if rec.header is not None else None
        store = self.stores.get(name)
        if store is None:
            store = self.stores[name] = HealthStore()
        return store

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
    for asked, _ in asked_requests(events):
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
    if not isinstance(policy, Policy):
        raise TypeError(f"replay: policy must be a fallgate Policy, not {type(policy).__name__}")
    if isinstance(turns, bytes | bytearray):
        raise TypeError("replay: turns must be the trace file's text (str), not bytes: decode it")
    if isinstance(turns, str):
        try:
            turns = read_turns(turns)
        except TraceError as e:
            raise ReplayError(e.message, e.line) from None
    if not isinstance(turns, Iterable):
        raise TypeError(
            "replay: turns must be a trace file's text (str) or fsm.trace.read_turns's turns, "
            f"not {type(turns).__name__}"
        )
    got = list(turns)
    for t in got:
        if not isinstance(t, TracedTurn):
            raise TypeError(
                "replay: turns must be a trace file's text (str) or fsm.trace.read_turns's "
                f"turns; one is a {type(t).__name__} (join the lines into one str)"
            )
    check_turns(got)
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
