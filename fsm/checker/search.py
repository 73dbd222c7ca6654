"""The breadth-first search over every reachable configuration of one policy.

The search drives the real executor (`fsm.Turn`, or `TransitionsTurn`): each
configuration is a live turn on its own health store and virtual clock, copied once
per event fed to it. Each transition is checked as it is made (`properties`); the
graph it builds is checked as a whole at the end (`graph`). Breadth-first, so the
first violation of a property found is a shortest event sequence that breaks it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from ..clock import VirtualClock
from ..core.actions import Attempt, Rebuild, Wait
from ..core.guards import Effect, Guard
from ..core.machine import (
    TERMINALS,
    Declaration,
    declare,
)
from ..core.turn import ProtocolError, TransitionsTurn, Turn, TurnBase, TurnState
from ..health.store import HealthStore
from ..kinds import Outcome, OutcomeKind
from ..policy.model import Policy
from .alphabet import alphabet
from .analyses import gate_chains, longest_runs
from .audit import KeyAudit, summary_of
from .configuration import (
    Live,
    class_slots,
    copy_health,
    copy_state,
    health_slots,
    is_leaf,
    keep_behind,
    key,
)
from .context import Bounds, Context, with_canaries
from .initial import initial_configurations
from .oracle import Obs, observe
from .pacing import granted
from .progress import Progress
from .properties import (
    CHECKS,
    ON_ATTEMPT,
    PROPERTIES,
    clean_next_turn,
    declaration_equals_execution,
    ends_as_declared,
    engine_crashed,
    engine_rejected,
    still_running,
)
from .report import CheckReport, KeyAuditResult, Violation
from .steps import (
    KINDS,
    LATE,
    NEXT_TURN,
    SILENT,
    START_TIME,
    Executor,
    Replay,
    Step,
    event_time,
    outcome_for,
    worst_jitter,
)
from .timing import note_wait, time_abstraction
from .transition import Before, Finding, TransitionRecord, health_changes
from .untaken import untaken


class Checker:
    """Breadth-first exploration of one policy's machine; see `check_policy`."""

    # the time abstraction, set by `timing.time_abstraction`
    sat: int
    start_max: float
    step_max: float
    inexact: bool
    backoffs: float
    visit_cooling: list[float]
    cooling_anywhere: bool
    attempt_rest: list[float]
    silent_time: list[float]
    silent_rest: list[float]
    reserve_slack: float
    horizon: float
    bounds: Bounds
    long: float

    def __init__(
        self,
        policy: Policy,
        *,
        declaration: Declaration | Callable[[Policy], Declaration] | None = None,
        guards: Mapping[Guard, Guard] | None = None,
        effects: Mapping[Effect, Effect] | None = None,
        health_factory: Callable[[], HealthStore] = HealthStore,
        executor: Executor = Turn,
        turns: int = 2,
        max_cooling: int = 1,
        attempt_seconds: float = 0.0,
        max_states: int = 400_000,
        record: bool = False,
        abstract_time: bool = True,
        follow_events: int = 2,
        reduce: bool = True,
        audit_budget: int = 200,
        progress: Progress | None = None,
    ) -> None:
        self._args = dict(
            audit_budget=audit_budget,
            progress=progress,
            policy=policy,
            declaration=declaration,
            guards=guards,
            effects=effects,
            health_factory=health_factory,
            executor=executor,
            turns=turns,
            max_cooling=max_cooling,
            attempt_seconds=attempt_seconds,
            max_states=max_states,
            record=record,
            follow_events=follow_events,
            reduce=reduce,
        )
        self.follow_events = follow_events
        self.reduce = reduce  # the reductions of `configuration.key` (False: a test's)
        self.progress = progress
        self.policy = p = with_canaries(policy)
        if callable(declaration):
            declaration = declaration(p)
        self.decl = declaration if declaration is not None else declare(p)
        self.custom = declaration is not None or guards is not None or effects is not None
        self.guards = guards
        self.effects = effects
        self.health_factory = health_factory
        self.executor = executor
        self.turns = max(1, turns)
        self.max_cooling = max_cooling
        self.attempt_seconds = attempt_seconds
        self.max_states = max_states
        self.record = record
        self.abstract_time = abstract_time
        self.n = len(p.targets)
        self.names = [t.name for t in p.targets]
        self.sizes = {t.key: len(t.pool()) for t in p.targets}
        self.taken: set[tuple[str, str, str]] = set()
        self.entered: dict[str, int] = {}  # state -> the first turn that entered it
        time_abstraction(self, Bounds.of(p))
        # what a comparison with the deadline may add to elapsed (`timing.bands`)
        bound = {p.attempt_bound(t) for t in p.targets} | {p.attempt_timeout}
        self.band_adds = sorted(bound | {p.reserve_for(t) for t in p.targets} | {0.0})
        self.band_memo: dict[tuple[int, float], tuple[list[float], list[float], float]] = {}
        # Retry tokens from this many up are one value: more than a turn can spend on one
        # target (every attempt but its first is a retry), and the next turn's first one.
        self.tokens = (p.retry_budget.size, float(max(self.bounds.per_target) + 1))
        self.window = p.breaker.window
        self.ctx = Context.of(p, self.decl, self.bounds)
        self.alphabet = alphabet(p, self.bounds)
        self.hk_targets, self.hk_creds = ts, cs = health_slots(p)
        self.hk_sizes = [len(t) + len(c) for t, c in zip(ts, cs, strict=True)]
        # per chain position: where each target's entries are in `hk_targets` (twins share)
        self.hk_at = [
            {j: ahead.index(t.key) for j, t in enumerate(p.targets) if t.key in ahead}
            for ahead in self.hk_targets
        ]
        self.keep_behind = keep_behind(p)
        self.class_slots = class_slots(p)
        # the graph
        self.ids: dict[Any, int] = {}
        self.parent: list[int] = []
        self.via: list[Step | None] = []
        self.kind: list[tuple[str, int]] = []
        self.edges: list[dict[Step, int]] = []
        self.setup: dict[int, tuple[Step, ...]] = {}
        self.live: dict[int, Live] = {}
        self.violations: dict[str, Violation] = {}
        self.transitions = 0
        self.complete = True
        self.edge_log: dict[tuple[Any, Step], tuple[Any, tuple[Any, ...]]] = {}
        self.audit = KeyAudit(audit_budget, self._feed_copy, self._clone)
        self.end_memo: list[Any] | None = None  # see `configuration.end_class`
        self.read_events: dict[Step, tuple[Any, ...]] = {}  # see `_read`

    # -- turns --------------------------------------------------------------------------------
    def _new_turn(self, health: HealthStore, clock: VirtualClock) -> TurnBase:
        if self.custom:
            return Turn(
                self.policy,
                health=health,
                clock=clock,
                random=worst_jitter,
                declaration=self.decl,
                guards=self.guards,
                effects=self.effects,
            )
        return self.executor(self.policy, health=health, clock=clock, random=worst_jitter)

    def _clone(self, live: Live) -> Live:
        """A copy of a configuration to feed one more event to (the record is shared:
        it is never changed, only replaced)."""
        clock = VirtualClock(live.clock.t)
        old = live.turn
        health = copy_health(old.s.health)
        s = copy_state(old.s, health, clock)
        if isinstance(old, TransitionsTurn):
            from ..core.turn import TransitionsModel

            t: TurnBase = object.__new__(TransitionsTurn)
            t.__dict__.update(old.__dict__)
            t.s = s
            model = TransitionsModel(s)
            t._model = model  # type: ignore[attr-defined]
            with t._lock:  # type: ignore[attr-defined]
                t._machine.add_model(model, initial=s.state)  # type: ignore[attr-defined]
        else:
            t = object.__new__(type(old))
            t._table = old._table  # type: ignore[attr-defined]
            t.s = s
        return Live(t, clock, live.obs)

    @staticmethod
    def _release(live: Live) -> None:
        close = getattr(live.turn, "close", None)
        if close is not None:
            close()

    # -- the graph ----------------------------------------------------------------------------
    def _add(self, live: Live, parent: int, via: Step | None) -> int:
        k = key(self, live)
        found = self.ids.get(k)
        if found is not None:
            rep = self.live.get(found)
            if (
                rep is not None
                and rep is not live
                and self.audit.wants()
                and not is_leaf(self, live.obs)
            ):
                events = self._events_of(self.kind[found][0])
                self.audit.judge(rep, live, events, found)
            return found
        nid = len(self.parent)
        self.ids[k] = nid
        self.parent.append(parent)
        self.via.append(via)
        self.edges.append({})
        s = live.turn.s
        a = s.action
        if s.state in TERMINALS:
            kind = ("T", 0)
        elif a is None:
            kind = ("I", 0)
        elif isinstance(a, Attempt):
            kind = ("A", a.target.index)
        elif isinstance(a, Wait):
            kind = ("W", 0)
        elif isinstance(a, Rebuild):
            kind = ("R", 0)
        else:
            kind = ("?", 0)
        self.kind.append(kind)
        self.live[nid] = live
        return nid

    def _events_of(self, kind: str) -> tuple[Step, ...]:
        ab = self.alphabet
        return {"A": ab.on_attempt, "W": ab.on_wait, "R": ab.on_rebuild, "I": ab.on_idle}.get(
            kind, ()
        )

    def _feed_copy(self, live: Live, ev: Step) -> tuple[Any, ...]:
        """What the engine does on `ev` from a copy of `live` (nothing else is recorded)."""
        child = self._clone(live)
        trigger = ev[0]
        outcome = self.alphabet.outcomes.get(ev)
        a = child.turn.s.action
        child.clock.advance(event_time(self.policy, a, trigger, ev[1], self.attempt_seconds))
        try:
            action = child.turn.fire(trigger, outcome)
            return summary_of(child.turn.s.state, action)
        except Exception as e:  # judged like any answer: both must do the same
            return ("raised", type(e).__name__)
        finally:
            self._release(child)

    def path(self, nid: int, *extra: Step) -> tuple[Step, ...]:
        """The steps from an initial configuration (its setup included) to `nid`, then
        `extra`."""
        out: list[Step] = list(extra[::-1])
        while nid >= 0:
            v = self.via[nid]
            if v is None:
                out.extend(self.setup.get(nid, ())[::-1])
                break
            out.append(v)
            nid = self.parent[nid]
        return tuple(out[::-1])

    def _broken(self, prop: str, why: str, nid: int, *extra: Step) -> None:
        if prop in self.violations:
            return
        self.violations[prop] = Violation(prop, why, self.path(nid, *extra))

    def _report(self, f: Finding, nid: int, ev: Step) -> None:
        self._broken(f.prop, f.why, nid, ev)

    # -- initial configurations ---------------------------------------------------------------
    def initial_configurations(self) -> list[tuple[Step, ...]]:
        return initial_configurations(self.policy, self.bounds, self.max_cooling)

    # -- run ----------------------------------------------------------------------------------
    def run(self) -> CheckReport:
        t0 = time.perf_counter()
        queue: deque[int] = deque()
        inits = self.initial_configurations()
        for setup in inits:
            r = Replay(self.policy, health=self.health_factory(), clock=VirtualClock(START_TIME))
            for st in setup:
                r.feed(st)
            turn = self._new_turn(r.health, r.clock)
            live = Live(turn, r.clock, Obs(self.n, 1))
            before = len(self.parent)
            nid = self._add(live, -1, None)
            if len(self.parent) > before:
                self.setup[nid] = setup
                queue.append(nid)
        progress = self.progress
        while queue:
            nid = queue.popleft()
            live = self.live.pop(nid)
            queue.extend(self._expand(nid, live))
            if progress is not None:
                progress.tick(len(self.parent), self.transitions, len(queue))
            if len(self.parent) > self.max_states:
                self.complete = False
                break
            if self.inexact and self.abstract_time:
                break  # its findings are the exact search's to make (below): stop here
        for live in self.live.values():
            self._release(live)
        self.live.clear()
        if self.inexact and self.abstract_time:
            return self._exact().run()
        if self.complete:
            self._whole_graph()
        seconds = time.perf_counter() - t0
        found = untaken(
            self.policy, self.decl.edges(), self.taken, self.entered, self.follow_events
        )
        return CheckReport(
            self.policy,
            len(self.parent),
            self.transitions,
            seconds,
            dict(sorted(self.violations.items(), key=lambda kv: PROPERTIES.index(kv[0]))),
            tuple(u.edge for u in found),
            len(inits),
            self.turns,
            self.complete,
            self.bounds,
            KeyAuditResult(
                self.audit.checked,
                self.audit.finding,
                self.path(self.audit.where) if self.audit.where >= 0 else (),
            ),
            found,
        )

    def _whole_graph(self) -> None:
        """The fallback gate as reachability, then termination over the whole graph."""
        gate = gate_chains(
            self.edges,
            self.kind,
            self.bounds.per_target,
            self.alphabet.fallback_steps,
            self.names,
            lambda nid: len(self.path(nid)),
        )
        found = [gate] if gate is not None else []
        found += longest_runs(self.edges, self.kind, self.bounds.events)
        for f in found:
            self._broken(f.prop, f.why, f.at, *f.steps)

    def _exact(self) -> Checker:
        """The same check without the time abstraction (an engine waited longer than a
        correct one could, so elapsed time is kept exactly)."""
        return Checker(**self._args, abstract_time=False)  # type: ignore[arg-type]

    def _expand(self, nid: int, live: Live) -> list[int]:
        """Feed every event of the alphabet to a configuration; returns the new ones."""
        kind = self.kind[nid][0]
        ab = self.alphabet
        if kind == "A":
            events = ab.on_attempt
        elif kind == "W":
            events = ab.on_wait
        elif kind == "R":
            events = ab.on_rebuild
        elif kind == "I":
            events = ab.on_idle
        elif kind == "T" and live.obs.turn < self.turns:
            events = ab.on_end
        else:  # the last turn ended (or an unknown action): nothing to feed
            self._release(live)
            return []
        if kind != "T":
            o = live.obs
            if is_leaf(self, o):
                self._release(live)  # a next turn is checked from its start, this far
                return []
            f = still_running(self.ctx, o)
            if f is not None:
                self._broken(f.prop, f.why, nid)
                self._release(live)
                return []
        h = live.turn.s.health
        refused: dict[Step, Live] = {}
        if kind == "A":
            if 0 <= live.obs.silent != self.kind[nid][1]:
                events = ab.on_attempt_loud  # another target of this turn was the silent one
            events, refused = granted(self._clone, self._release, live, events, ab.on_headroom)
        pre = Before.of(h)
        # a plain store's records then, for the ends that change none (`end_class`)
        self.end_memo = [live.clock.t, *pre.raw, None] if type(h) is HealthStore else None
        new: list[int] = []
        last = len(events) - 1
        for i, ev in enumerate(events):
            if ev in refused:
                child = refused[ev]
            else:
                child = live if i == last else self._clone(live)
            self.transitions += 1
            if not self._fire(nid, child, ev, pre):
                self._release(child)
                continue
            before = len(self.parent)
            cid = self._add(child, nid, ev)
            self.edges[nid][ev] = cid
            if len(self.parent) > before:
                new.append(cid)
            else:
                self._release(child)
        if events and refused.get(events[-1], live) is not live:
            self._release(live)  # granted: every outcome went to a copy, `denied` to `refused`
        return new

    # -- one transition, checked --------------------------------------------------------------
    def _fire(self, nid: int, child: Live, ev: Step, pre: Before) -> bool:
        """Feed `ev` to `child` and judge the transition; False when there is no
        configuration to follow (the engine refused or crashed, or did something the
        declaration does not have)."""
        trigger = ev[0]
        if trigger == NEXT_TURN:
            return self._next_turn(nid, child, ev)
        turn, clock, before = child.turn, child.clock, child.obs
        s = turn.s
        source = s.state
        then = clock.t
        read = self.read_events.get(ev)
        if read is None:  # once per event: this runs once per transition
            read = self.read_events[ev] = self._read(ev)
        outcome, kind, late, silent = read
        clock.advance(event_time(self.policy, s.action, trigger, ev[1], self.attempt_seconds))
        n_trace = len(s.trace)
        record_key = key(self, child) if self.record else None
        try:
            action = turn.fire(trigger, outcome)
        except ProtocolError as e:
            self._report(engine_rejected(e), nid, ev)
            return False
        except Exception as e:  # a crash inside the engine is a finding, not a checker error
            self._report(engine_crashed(e), nid, ev)
            return False
        s = turn.s
        made = s.trace[n_trace:]
        bad = declaration_equals_execution(self.ctx, source, trigger, s.state, made)
        if bad is None:
            te = made[0]
            self.taken.add((te.source, te.event, te.dest))
            self.entered.setdefault(te.dest, before.turn)
            bad = ends_as_declared(s.state, action)
        if bad is not None:
            child.obs = before.counted()
            self._report(bad, nid, ev)
            return False
        if self.record:
            self.edge_log[(record_key, ev)] = (
                key(self, child),
                (te.source, te.event, te.dest, te.action, te.target, te.credential, te.wait),
            )
        now = clock.t
        h = s.health
        at = s.visit.index
        known, after = observe(
            self.ctx, before, trigger, kind, outcome, action, h, now, at, late, silent
        )
        changes = health_changes(pre, h)
        # built as a plain tuple (no Python-level __new__): this runs once per transition
        rec = tuple.__new__(TransitionRecord, (
            self.ctx, ev, trigger, kind, outcome, source, s.state, action, te,
            before, known, after, then, now, h, changes,
        ))  # fmt: skip
        child.obs = after
        if isinstance(action, Wait):
            note_wait(self, rec)
        for check in ON_ATTEMPT if isinstance(action, Attempt) else CHECKS:
            f = check(rec)
            if f is not None:
                self._broken(f.prop, f.why, nid, ev)
        return True

    def _read(self, ev: Step) -> tuple[Outcome | None, OutcomeKind | None, bool, bool]:
        """What `_fire` reads of an event: its outcome, the outcome's kind, and whether it
        is late or silent."""
        trigger, flags = ev
        known = self.alphabet.outcomes
        # a monitor may feed any Retry-After
        outcome = known[ev] if ev in known else outcome_for(trigger, dict(flags))
        return outcome, KINDS.get(trigger), (LATE, True) in flags, (SILENT, True) in flags

    def _next_turn(self, nid: int, child: Live, ev: Step) -> bool:
        """A next turn on the same health store and clock, checked against a brand-new
        turn's state."""
        old = child.turn.s
        turn = self._new_turn(old.health, child.clock)
        clock = VirtualClock(child.clock.t)
        fresh = TurnState(self.policy, HealthStore(), clock, worst_jitter, None)
        fresh.decl = turn.s.decl
        f = clean_next_turn(turn.s, fresh, old)
        if f is not None:
            self._report(f, nid, ev)
        self._release(child)
        child.turn = turn
        child.obs = Obs(self.n, child.obs.turn + 1)
        return True


def check_policy(
    policy: Policy,
    *,
    declaration: Declaration | Callable[[Policy], Declaration] | None = None,
    guards: Mapping[Guard, Guard] | None = None,
    effects: Mapping[Effect, Effect] | None = None,
    health_factory: Callable[[], HealthStore] = HealthStore,
    executor: Executor = Turn,
    turns: int = 2,
    max_cooling: int = 1,
    attempt_seconds: float = 0.0,
    max_states: int = 400_000,
    progress: Progress | None = None,
) -> CheckReport:
    """Explore every reachable configuration of `policy` and check the thirteen properties.

    `declaration` (or a function of the policy returning one), `guards` and
    `effects` replace the machine's own, to show the checker failing on broken
    machines; `health_factory` may build a broken health store. `turns` bounds
    how many consecutive turns share one health store; `max_cooling` how many
    targets are cooling in an initial configuration. `progress` is told how far the
    search got as it goes (`fallgate check` prints it on stderr past 2 s).
    """
    if not isinstance(policy, Policy):
        raise TypeError(
            "check_policy: policy must be a fallgate Policy (Policy.from_dict(...) or "
            f"Policy.from_toml(path)), not {type(policy).__name__}"
        )
    return Checker(
        policy,
        declaration=declaration,
        guards=guards,
        effects=effects,
        health_factory=health_factory,
        executor=executor,
        turns=turns,
        max_cooling=max_cooling,
        attempt_seconds=attempt_seconds,
        max_states=max_states,
        progress=progress,
    ).run()
