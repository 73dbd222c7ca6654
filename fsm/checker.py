"""An exhaustive model checker for the turn machine (SPEC section 5).

The checker does not model the machine: it drives the real executor (`fsm.Turn`,
the same guards and effects users run, or `TransitionsTurn`) breadth-first over
every reachable configuration of a bounded policy. A configuration is the
machine state, the per-turn counters, the health store's facts relative to the
clock, and the credential states; the event alphabet is finite (every outcome
class, Retry-After in {none, 0, below the cap, above the cap}, and the host's
replies to Wait and Rebuild). The clock is virtual (advanced by each Wait), the
random source fixed (worst-case jitter), and the health store fresh per
initial configuration; a terminal configuration may start a next turn on the
same health store.

Every transition is checked against the ten properties by the checker's own
bookkeeping (it does not ask the engine whether the engine is right). Because
the search is breadth-first, the first violation of a property found is a
shortest event sequence that breaks it; it is reported as a list of steps that
`replay()` feeds to a fresh turn, so it can be pasted into a test. After the
search, the whole graph is checked for cycles and over-long runs (termination)
and for fallback-triggering outcomes that, repeated, never leave a target (the
fallback gate as reachability).

What keeps the search small (each is sound for the rest of the turn):
* facts about targets already left are not part of a running configuration
  (no ping-pong is itself checked, so they are never read again in that turn);
* time is relative (cooldowns as seconds left), "seconds left" beyond the whole
  search's horizon are one value, and the turn's elapsed time is dropped once
  the deadline can no longer bind (a correct engine waits at most
  max_attempts-1 times per target; if an engine waits more or longer, the search
  reruns with exact time);
* initial configurations: all free, the primary (or one key of it) cooling
  briefly, any one target (`max_cooling=1`) or runs of targets cooling for good,
  everything cooling; a turn end continues into a next turn on the same health
  store (one per class of end-of-turn health), checked from its start for
  `follow_events` events.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from .actions import Action, Attempt, Fail, Finish, Rebuild, Wait
from .errors import PolicyError
from .health import HealthStore
from .machine import (
    CANCELLED,
    DONE,
    FAILED,
    REBUILD_FAILED,
    REBUILT,
    START,
    TERMINALS,
    WAITED,
    Declaration,
    declare,
)
from .outcomes import Outcome, OutcomeKind
from .policy import Credential, Policy, Secret, Target
from .testing import FakeClock
from .turn import Effect, Guard, ProtocolError, TransitionsTurn, Turn, TurnState, _TurnBase

#: The ten properties of SPEC section 5, in order (the names used in JSON output).
PROPERTIES: Final = (
    "fallback_gate",
    "termination",
    "no_ping_pong",
    "honest_waits",
    "non_retryable_not_retried",
    "bounded_rotation",
    "clean_turn_start",
    "committed_streams_not_replayed",
    "secrets_never_leak",
    "declaration_equals_execution",
)

#: Host-side steps of a counterexample besides the machine's triggers.
NEXT_TURN: Final = "next_turn"
ADVANCE: Final = "advance"  # time passes between turns
COOL_TARGET: Final = "cool_target"
COOL_CREDENTIAL: Final = "cool_credential"

Args = tuple[tuple[str, Any], ...]
Step = tuple[str, Args]

_EPS: Final = 1e-6
_START_TIME: Final = 1000.0
_CANARY: Final = "sk-live-CHECK"
_CRED_LEVEL: Final = (OutcomeKind.RATE_LIMITED, OutcomeKind.QUOTA, OutcomeKind.AUTH)
_TARGET_LEVEL: Final = (OutcomeKind.TRANSPORT, OutcomeKind.OVERLOADED, OutcomeKind.NOT_FOUND)
_STATUS: Final = {
    OutcomeKind.RATE_LIMITED: 429,
    OutcomeKind.QUOTA: 429,
    OutcomeKind.OVERLOADED: 503,
    OutcomeKind.AUTH: 401,
    OutcomeKind.NOT_FOUND: 404,
    OutcomeKind.CONTEXT_TOO_LONG: 400,
    OutcomeKind.CONTENT_FILTERED: 400,
    OutcomeKind.BAD_REQUEST: 400,
}
_PARTIAL: Final = "partial answer, already delivered"
_KINDS: Final = {k.value: k for k in OutcomeKind}

Executor = type[_TurnBase]
_Facts = tuple[Mapping[Any, float], Mapping[Any, float], Mapping[Any, float]]


# -- steps: what the host feeds, printable and replayable ----------------------------------------


def step(trigger: str, **args: Any) -> Step:
    """One event of a counterexample: ``step("rate_limited", retry_after=61.0)``."""
    return (trigger, tuple(sorted(args.items())))


def steps_to_json(steps: Iterable[Step]) -> list[list[Any]]:
    return [[t, dict(a)] for t, a in steps]


def steps_from_json(data: Iterable[Sequence[Any]]) -> list[Step]:
    return [step(str(item[0]), **(dict(item[1]) if len(item) > 1 else {})) for item in data]


def format_steps(steps: Sequence[Step]) -> str:
    """Steps as Python source: ``[("start", {}), ("transport", {}), ...]``."""
    inner = ", ".join(f"({t!r}, {dict(a)!r})" for t, a in steps)
    return f"[{inner}]"


def outcome_for(trigger: str, args: Mapping[str, Any]) -> Outcome | None:
    """The `Outcome` an outcome step stands for (None for host replies)."""
    kind = _KINDS.get(trigger)
    if kind is None:
        return None
    if kind is OutcomeKind.SUCCESS:
        return Outcome(kind, status=200, value="answer")
    if kind is OutcomeKind.CANCELLED:
        return Outcome(kind, detail="cancelled")
    status = _STATUS.get(kind)
    return Outcome(
        kind,
        status=status,
        retry_after=args.get("retry_after"),
        detail=kind.value,
        partial=args.get("partial"),
    )


class Replay:
    """Feeds steps to turns of one policy on one health store and one virtual clock."""

    def __init__(
        self,
        policy: Policy,
        *,
        health: HealthStore | None = None,
        clock: FakeClock | None = None,
        attempt_seconds: float = 0.0,
        executor: Executor = Turn,
        declaration: Declaration | None = None,
        guards: Mapping[str, Guard] | None = None,
        effects: Mapping[str, Effect] | None = None,
    ) -> None:
        self.policy = policy
        self.health = health if health is not None else HealthStore()
        self.clock = clock if clock is not None else FakeClock(_START_TIME)
        self.attempt_seconds = attempt_seconds
        self.executor = executor
        self.declaration = declaration
        self.guards = guards
        self.effects = effects
        self.turns: list[_TurnBase] = []

    def new_turn(self) -> _TurnBase:
        kw: dict[str, Any] = {}
        if self.declaration is not None or self.guards is not None or self.effects is not None:
            if self.executor is not Turn:
                raise ValueError("broken declarations, guards and effects need the Turn executor")
            kw = {"declaration": self.declaration, "guards": self.guards, "effects": self.effects}
        t = self.executor(
            self.policy, health=self.health, clock=self.clock, random=_worst_jitter, **kw
        )
        self.turns.append(t)
        return t

    def feed(self, st: Step) -> Action | None:
        """Apply one step; returns the turn's next action (None for setup steps)."""
        trigger, raw = st
        args = dict(raw)
        if trigger == COOL_TARGET:
            t = self._target(args["target"])
            now = self.clock()
            self.health.cool_target(t.key, now + float(args["seconds"]), now)
            return None
        if trigger == COOL_CREDENTIAL:
            t = self._target(args["target"])
            now = self.clock()
            self.health.cool_credential(
                t.key, str(args["credential"]), now + float(args["seconds"]), now
            )
            return None
        if trigger == ADVANCE:
            self.clock.advance(float(args["seconds"]))
            return None
        if trigger == NEXT_TURN or not self.turns:
            turn = self.new_turn()
            if trigger == NEXT_TURN:
                return None
        turn = self.turns[-1]
        if trigger == WAITED:
            a = turn.s.action
            if isinstance(a, Wait) and a.seconds > 0 and math.isfinite(a.seconds):
                self.clock.advance(a.seconds)
        elif trigger in _KINDS and trigger != CANCELLED and self.attempt_seconds:
            self.clock.advance(self.attempt_seconds)
        return turn.fire(trigger, outcome_for(trigger, args))

    def _target(self, name: str) -> Target:
        for t in self.policy.targets:
            if t.name == name:
                return t
        raise ValueError(f"no target named {name!r} in the policy")


def replay(policy: Policy, steps: Iterable[Step], **kw: Any) -> list[_TurnBase]:
    """Feed a counterexample to fresh turns; returns the turns (the last may be running).

    Keyword arguments are those of `Replay` (health, clock, attempt_seconds,
    executor, declaration, guards, effects).
    """
    r = Replay(policy, **kw)
    for st in steps:
        r.feed(st)
    return r.turns


def _worst_jitter() -> float:
    return 1.0


# -- the policy under check -----------------------------------------------------------------------


def default_policy() -> Policy:
    """The default policy (primary + 3 fallbacks, 2 keys each, 3 attempts)."""
    from .defaults import default_policy as _default

    return _default()


def with_canaries(policy: Policy) -> Policy:
    """`policy` with every credential holding a literal canary key (same ids).

    The engine never reads key values, so behaviour is unchanged; the secrets
    property then scans every trace, action, repr and error for the canaries.
    """
    targets = []
    for t in policy.targets:
        creds = tuple(
            c
            if c.key is not None
            else Credential(id=c.id, key=Secret(f"{_CANARY}-{t.index}-{n}-7f3a9c"))
            for n, c in enumerate(t.credentials)
        )
        targets.append(attrs.evolve(t, credentials=creds))
    return attrs.evolve(policy, targets=tuple(targets))


@attrs.frozen
class Bounds:
    """Limits computed from the policy (Property 2) and the checker's alphabet."""

    per_target: tuple[int, ...]  # attempts on one target in one turn
    attempts: int  # attempts in one turn
    events: int  # events in one turn
    wait: float  # total waiting in one turn (the deadline)
    single_wait: float  # the longest single wait
    small: float | None  # a Retry-After below the cap (None when the cap is 0)
    large: float  # a Retry-After above the cap

    @classmethod
    def of(cls, p: Policy) -> Bounds:
        per = tuple(
            p.max_attempts + (len(t.pool()) - 1) + (1 if p.recover_transport else 0)
            for t in p.targets
        )
        cap = p.retry_after_cap
        return cls(
            per_target=per,
            attempts=sum(per),
            events=2 * sum(per) + 2,
            wait=p.deadline,
            single_wait=max(cap, p.backoff.cap),
            small=round(cap / 4, 6) if cap > 0 else None,
            large=round(2 * cap + 1, 6),
        )


# -- the report -----------------------------------------------------------------------------------


@attrs.frozen
class Violation:
    """A broken property and a shortest event sequence that breaks it."""

    prop: str
    why: str
    steps: tuple[Step, ...]

    @property
    def length(self) -> int:
        """Events fed to the machine (setup steps that cool targets are not counted)."""
        return sum(1 for t, _ in self.steps if t not in (COOL_TARGET, COOL_CREDENTIAL))

    def python(self) -> str:
        return format_steps(self.steps)


@attrs.frozen
class CheckReport:
    policy: Policy = attrs.field(repr=False)
    states: int
    transitions: int
    seconds: float
    violations: Mapping[str, Violation]
    unreachable: tuple[str, ...]
    initial: int
    turns: int
    complete: bool
    bounds: Bounds

    @property
    def ok(self) -> bool:
        return not self.violations and self.complete

    def holds(self, prop: str) -> bool:
        if prop not in PROPERTIES:
            raise KeyError(prop)
        return prop not in self.violations

    def to_json(self) -> dict[str, Any]:
        props: dict[str, Any] = {}
        for name in PROPERTIES:
            v = self.violations.get(name)
            props[name] = "holds" if v is None else {"counterexample": steps_to_json(v.steps)}
        return {
            "states": self.states,
            "transitions": self.transitions,
            "seconds": round(self.seconds, 3),
            "properties": props,
            "unreachable": list(self.unreachable),
        }

    def text(self) -> str:
        p = self.policy
        rate = self.states / self.seconds if self.seconds > 0 else float("inf")
        chain = " -> ".join(f"{t.name} ({t.model}, {len(t.pool())} keys)" for t in p.targets)
        lines = [
            f"policy: {chain}; max_attempts {p.max_attempts}",
            f"explored {self.states} states, {self.transitions} transitions in "
            f"{self.seconds:.2f} s ({rate:,.0f} states/s); {self.initial} initial "
            f"configurations, {self.turns} turns per path",
            f"bounds: <= {self.bounds.attempts} attempts and {self.bounds.events} events per "
            f"turn, waits <= {self.bounds.wait:g} s",
        ]
        if not self.complete:
            lines.append("INCOMPLETE: the state limit was reached; properties are unproven")
        for name in PROPERTIES:
            v = self.violations.get(name)
            if v is None:
                lines.append(f"  holds   {name}")
            else:
                lines.append(f"  BROKEN  {name}: {v.why}")
                lines.append(
                    f"          counterexample ({v.length} events; "
                    "replay with fsm.checker.replay(policy, steps)):"
                )
                lines.append(f"          {v.python()}")
        if self.unreachable:
            lines.append(f"declared but never taken ({len(self.unreachable)}):")
            lines += [f"  {u}" for u in self.unreachable]
        else:
            lines.append("every declared transition was taken")
        return "\n".join(lines)


# -- the search -----------------------------------------------------------------------------------


class _Obs:
    """The checker's own record of one turn (independent of the engine's counters)."""

    __slots__ = (
        "attempts",
        "banned",
        "committed",
        "cred",
        "cur",
        "events",
        "expect",
        "floor",
        "last",
        "nb",
        "nwait",
        "rot",
        "since_wait",
        "tnb",
        "total",
        "tried",
        "turn",
        "waits",
    )

    def __init__(self, n: int, turn: int) -> None:
        self.turn = turn
        self.events = 0
        self.tried: list[int] = []
        self.nwait = [0] * n
        self.cur = -1
        self.cred: str | None = None
        self.attempts = [0] * n
        self.rot = [0] * n
        self.total = 0
        self.waits = 0.0
        self.banned: set[tuple[int, str]] = set()
        self.nb: dict[tuple[int, str], float] = {}
        self.tnb: dict[int, float] = {}
        self.floor: int | None = None
        self.committed: str | None = None
        self.last: Outcome | None = None
        self.since_wait = False
        self.expect = -1  # the target a turn-start wait is for

    def copy(self) -> _Obs:
        o = _Obs.__new__(_Obs)
        o.turn = self.turn
        o.events = self.events
        o.tried = self.tried.copy()
        o.nwait = self.nwait.copy()
        o.cur = self.cur
        o.cred = self.cred
        o.attempts = self.attempts.copy()
        o.rot = self.rot.copy()
        o.total = self.total
        o.waits = self.waits
        o.banned = self.banned.copy()
        o.nb = self.nb.copy()
        o.tnb = self.tnb.copy()
        o.floor = self.floor
        o.committed = self.committed
        o.last = self.last
        o.since_wait = self.since_wait
        o.expect = self.expect
        return o


class _Live:
    """An unexpanded configuration: a running turn, its clock, the checker's record."""

    __slots__ = ("clock", "obs", "turn")

    def __init__(self, turn: _TurnBase, clock: FakeClock, obs: _Obs) -> None:
        self.turn = turn
        self.clock = clock
        self.obs = obs


def _copy_health(h: HealthStore) -> HealthStore:
    """A copy of a health store (its class may be a deliberately broken subclass)."""
    if type(h) is HealthStore:
        new = object.__new__(HealthStore)
        new._lock = threading.Lock()
        new._target_until = h._target_until.copy()
        new._cred_until = h._cred_until.copy()
        new._streak = h._streak.copy()
        new._rr = h._rr.copy()
        return new
    new = object.__new__(type(h))
    for klass in type(h).__mro__:
        for name in getattr(klass, "__slots__", ()):
            if name == "_lock":
                value: Any = threading.Lock()
            else:
                try:
                    value = getattr(h, name)
                except AttributeError:
                    continue
                if isinstance(value, dict | set | list):
                    value = value.copy()
            object.__setattr__(new, name, value)
    if hasattr(h, "__dict__"):
        for name, value in vars(h).items():
            object.__setattr__(
                new, name, value.copy() if isinstance(value, dict | set | list) else value
            )
    return new


_STATE_SLOTS: Final = tuple(TurnState.__slots__)
_PER_TURN_SLOTS: Final = tuple(
    n for n in _STATE_SLOTS if n not in ("clock", "health", "hook", "policy", "random", "decl")
)
_Copier = Callable[[TurnState, HealthStore, FakeClock], TurnState]
_COPIER: list[_Copier] = []


def _copy_state(s: TurnState, health: HealthStore, clock: FakeClock) -> TurnState:
    """A copy of a turn's state on its own health store and clock (the trace starts empty:
    the checker reads each transition's record as it is made)."""
    if not _COPIER:
        _COPIER.append(_make_copier(s))
    return _COPIER[0](s, health, clock)


def _make_copier(sample: TurnState) -> _Copier:
    """Generate a straight-line copier for TurnState's slots (much faster than a loop)."""
    lines = ["def copy(s, health, clock):", "    n = new(TurnState)"]
    for name in _STATE_SLOTS:
        if name == "health":
            lines.append("    n.health = health")
        elif name == "clock":
            lines.append("    n.clock = clock")
        elif name in ("trace", "_raw", "_events"):
            lines.append(f"    n.{name} = []")
        elif isinstance(getattr(sample, name, None), dict | set | list):
            lines.append(f"    n.{name} = s.{name}.copy()")
        else:
            lines.append(f"    n.{name} = s.{name}")
    lines.append("    return n")
    ns: dict[str, Any] = {"new": object.__new__, "TurnState": TurnState}
    exec("\n".join(lines), ns)
    fn: _Copier = ns["copy"]
    return fn


def _unique(items: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(items))


def _rel(v: float, now: float, long: float = math.inf) -> float:
    """Seconds left of a not-before time (0 when over, inf when beyond the horizon)."""
    if v <= now:
        return 0.0
    left = v - now
    return round(left, 6) if left <= long else math.inf


class Checker:
    """Breadth-first exploration of one policy's machine; see `check_policy`."""

    def __init__(
        self,
        policy: Policy,
        *,
        declaration: Declaration | Callable[[Policy], Declaration] | None = None,
        guards: Mapping[str, Guard] | None = None,
        effects: Mapping[str, Effect] | None = None,
        health_factory: Callable[[], HealthStore] = HealthStore,
        executor: Executor = Turn,
        turns: int = 2,
        max_cooling: int = 1,
        attempt_seconds: float = 0.0,
        max_states: int = 400_000,
        record: bool = False,
        abstract_time: bool = True,
        follow_events: int = 2,
    ) -> None:
        self._args = dict(
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
        )
        self.follow_events = follow_events
        self.policy = with_canaries(policy)
        p = self.policy
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
        self.bounds = Bounds.of(p)
        self.abstract_time = abstract_time
        self.n = len(p.targets)
        self.names = [t.name for t in p.targets]
        self.keys = [t.key for t in p.targets]
        self.pools = [t.pool() for t in p.targets]
        self.sizes = {t.key: len(t.pool()) for t in p.targets}
        secrets = sorted({*p.secrets(), _CANARY}, key=len, reverse=True)
        self.leak = re.compile("|".join(re.escape(s) for s in secrets))
        self.triples = {(t.source, t.trigger, t.dest): t for t in self.decl.transitions}
        self.state_names = {st.name for st in self.decl.states}
        self.taken: set[tuple[str, str, str]] = set()
        self.sat = self._streak_saturation()
        self.start_max, self.step_max = self._wait_maxima()
        self.inexact = False
        per = self.bounds.per_target
        waits_per_target = p.max_attempts - 1
        self.rest_time = [
            (self.n - j) * waits_per_target * self.step_max + sum(per[j:]) * attempt_seconds
            for j in range(self.n)
        ]
        # No run of the whole search lasts longer than this; a cooldown with more left than
        # this never ends within it ("long"), and "large" Retry-After values are beyond it.
        self.horizon = float(math.ceil(self.turns * (self.start_max + self.rest_time[0]) + 1))
        self.bounds = attrs.evolve(
            self.bounds, large=max(self.bounds.large, 10 * self.horizon if abstract_time else 0)
        )
        self.long = self.horizon if abstract_time else math.inf
        self._alphabet()
        self.hk_targets: list[list[Any]] = []
        self.hk_creds: list[list[Any]] = []
        creds = _unique((t.key, c.id) for t in p.targets for c in t.pool())
        for lo in range(self.n):
            ahead = _unique(self.keys[lo:])
            self.hk_targets.append(ahead)
            self.hk_creds.append([ck for ck in creds if ck[0] in ahead])
        # the graph
        self.ids: dict[Any, int] = {}
        self.parent: list[int] = []
        self.via: list[Step | None] = []
        self.kind: list[tuple[str, int]] = []
        self.edges: list[dict[Step, int]] = []
        self.setup: dict[int, tuple[Step, ...]] = {}
        self.live: dict[int, _Live] = {}
        self.violations: dict[str, Violation] = {}
        self.transitions = 0
        self.complete = True
        self.edge_log: dict[tuple[Any, Step], tuple[Any, tuple[Any, ...]]] = {}
        self._repr_ok: set[int] = set()

    # -- alphabet -----------------------------------------------------------------------------
    def _alphabet(self) -> None:
        b = self.bounds
        ras: list[float | None] = [None, 0.0]
        if b.small is not None:
            ras.append(b.small)
        ras.append(b.large)
        out: list[Step] = [step("success"), step("transport")]
        out += [step("rate_limited", retry_after=r) for r in ras]
        out.append(step("quota"))
        out += [step("overloaded", retry_after=r) for r in (None, b.large)]
        for k in ("auth", "not_found", "context_too_long", "content_filtered", "bad_request"):
            out.append(step(k))
        out.append(step("stream_interrupted", partial=_PARTIAL))
        cancel = step(CANCELLED)
        self.on_attempt = (*out, cancel)
        self.on_wait = (step(WAITED), cancel)
        self.on_rebuild = (step(REBUILT), step(REBUILD_FAILED), cancel)
        self.on_idle = (step(START), cancel)
        self.on_end = (step(NEXT_TURN),)
        self.outcomes: dict[Step, Outcome | None] = {
            st: outcome_for(st[0], dict(st[1]))
            for st in (*self.on_attempt, *self.on_wait, *self.on_rebuild, *self.on_idle)
        }
        p = self.policy
        self.fallback_steps = tuple(
            st
            for st in out
            if st[0] != "success" and p.rule(OutcomeKind(st[0])).fall_back and st[0] in _KINDS
        )

    def _wait_maxima(self) -> tuple[float, float]:
        """The longest single wait a correct engine can ask for with this alphabet: at turn
        start (every target cooling), and before any other attempt."""
        from .backoff import cooldown_for

        p = self.policy
        cap = p.retry_after_cap
        b = self.bounds
        spans = [b.large, p.cooldown.cap] + ([b.small] if b.small is not None else [])
        step_max = max([p.backoff.cap, *[x for x in spans if x <= cap]])
        cools = [cooldown_for(p.cooldown, n) for n in range(1, self.sat + 1)]
        start_max = max([step_max, *[x for x in cools if x <= cap]])
        return start_max, step_max

    def _streak_saturation(self) -> int:
        from .backoff import cooldown_for

        c = self.policy.cooldown
        for n in range(1, 200):
            if cooldown_for(c, n) >= c.cap:
                return n
        return 200

    # -- turns --------------------------------------------------------------------------------
    def _new_turn(self, health: HealthStore, clock: FakeClock) -> _TurnBase:
        if self.custom:
            return Turn(
                self.policy,
                health=health,
                clock=clock,
                random=_worst_jitter,
                declaration=self.decl,
                guards=self.guards,
                effects=self.effects,
            )
        return self.executor(self.policy, health=health, clock=clock, random=_worst_jitter)

    def _clone(self, live: _Live) -> _Live:
        clock = FakeClock(live.clock.t)
        old = live.turn
        health = _copy_health(old.s.health)
        s = _copy_state(old.s, health, clock)
        if isinstance(old, TransitionsTurn):
            from .turn import _Model

            t: _TurnBase = object.__new__(TransitionsTurn)
            t.__dict__.update(old.__dict__)
            t.s = s
            model = _Model(s)
            t._model = model  # type: ignore[attr-defined]
            with t._lock:  # type: ignore[attr-defined]
                t._machine.add_model(model, initial=s.state)  # type: ignore[attr-defined]
        else:
            t = object.__new__(type(old))
            t._table = old._table  # type: ignore[attr-defined]
            t.s = s
        return _Live(t, clock, live.obs.copy())

    @staticmethod
    def _release(live: _Live) -> None:
        close = getattr(live.turn, "close", None)
        if close is not None:
            close()

    # -- canonical keys -----------------------------------------------------------------------
    # A key holds everything the rest of the turn can depend on, and nothing else:
    # * facts about targets already left (no ping-pong is itself checked) are dropped from
    #   running configurations, except which of their cooldowns are running (what the next
    #   turn's start depends on);
    # * time is relative: cooldowns as "seconds left"; the turn's elapsed time only while
    #   the deadline can still bind (elapsed + the most the rest of the turn can wait).
    def _health_key(self, h: HealthStore, now: float, lo: int) -> tuple[Any, ...]:
        tu = h._target_until
        cu = h._cred_until
        long = self.long
        out: list[Any] = []
        for k in self.hk_targets[lo]:
            v = tu.get(k, 0.0)
            out.append(_rel(v, now, long))
        for ck in self.hk_creds[lo]:
            v = cu.get(ck, 0.0)
            out.append(_rel(v, now, long))
        sat = self.sat
        streak = h._streak
        rr = h._rr
        for k in self.hk_targets[lo]:
            out.append(min(streak.get(k, 0), sat))
            n = rr.get(k)
            out.append(None if n is None else n % self.sizes[k])
        return tuple(out)

    def _health_class(self, h: HealthStore, now: float) -> tuple[Any, ...]:
        """What a next turn can depend on, coarsely: which cooldowns run (and whether they
        outlast the search), failure streaks, round-robin positions. Turn ends in one class
        continue from one representative health store."""
        tu = h._target_until
        cu = h._cred_until
        long = self.long
        out: list[Any] = []
        for k in self.hk_targets[0]:
            v = tu.get(k, 0.0)
            out.append(0 if v <= now else (2 if v - now > long else 1))
        for ck in self.hk_creds[0]:
            v = cu.get(ck, 0.0)
            out.append(0 if v <= now else (2 if v - now > long else 1))
        for k in self.hk_targets[0]:
            out.append(min(h._streak.get(k, 0), self.sat))
            n = h._rr.get(k)
            out.append(None if n is None else n % self.sizes[k])
        return tuple(out)

    def _far(self, o: _Obs, lo: int, elapsed: float) -> bool:
        """True when the deadline can no longer bind in this turn, whatever happens: a
        correct engine waits at most max_attempts-1 times per target (every retry needs
        attempts < max_attempts; rotations and fallbacks do not wait), each wait at most
        `step_max`, plus one wait at turn start."""
        if not self.abstract_time:
            return False
        most = self.rest_time[lo] + (self.start_max if o.cur < 0 else 0.0)
        return elapsed + most <= self.policy.deadline - _EPS

    def _key(self, live: _Live) -> tuple[Any, ...]:
        s = live.turn.s
        o = live.obs
        now = live.clock.t
        state = s.state
        if state in TERMINALS:
            if o.turn >= self.turns:
                return (o.turn, state)
            return (o.turn, "end", self._health_class(s.health, now))
        cur = s.ti
        lo = cur if cur > 0 else 0
        a = s.action
        cls = type(a)
        if cls is Attempt:
            ak: tuple[Any, ...] = ("A", a.target.index, a.credential.id)  # type: ignore[union-attr]
            out = None  # overwritten by the next outcome before anything reads it
        else:
            if cls is Wait:
                ak = ("W", a.seconds)  # type: ignore[union-attr]
            elif cls is Rebuild:
                ak = ("R",)
            else:
                ak = (cls.__name__,)
            so = s.outcome
            out = (so.kind, so.retry_after) if so is not None else None
        long = self.long
        elapsed = now - s.started
        time_k = None if self._far(o, lo, elapsed) else (round(elapsed, 6), round(o.waits, 6))
        oc = o.cur
        core = (
            state,
            cur,
            s.cred.id if s.cred is not None else None,
            s.attempts,
            s.streak,
            s.recovered,
            s.rotations,
            s.rr,
            tuple(sorted(s.spent)) if s.spent else (),
            tuple(
                sorted(
                    (k[1], _rel(v, now, long))
                    for k, v in s.cred_nb.items()
                    if k[0] == cur and v > now
                )
            ),
            _rel(s.target_nb, now, long),
            tuple(s.tried),
            s.ctx_floor,
            out,
            s.partial,
        )
        mine = (
            o.turn,
            tuple(o.tried),
            oc,
            o.cred,
            o.attempts[oc] if oc >= 0 else 0,
            o.rot[oc] if oc >= 0 else 0,
            tuple(sorted(c for j, c in o.banned if j == oc)) if o.banned else (),
            tuple(
                sorted(
                    (k[1], _rel(v, now, long)) for k, v in o.nb.items() if k[0] == oc and v > now
                )
            ),
            _rel(o.tnb.get(oc, 0.0), now, long),
            o.floor,
            o.committed,
            (o.last.kind, o.last.retry_after) if o.last is not None else None,
            o.since_wait,
            o.expect,
        )
        hk = self._health_key(s.health, now, lo)
        return (ak, time_k, core, mine, hk)

    # -- the graph ----------------------------------------------------------------------------
    def _add(self, live: _Live, parent: int, via: Step | None) -> int:
        key = self._key(live)
        found = self.ids.get(key)
        if found is not None:
            return found
        nid = len(self.parent)
        self.ids[key] = nid
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

    def path(self, nid: int, *extra: Step) -> tuple[Step, ...]:
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

    # -- initial configurations -------------------------------------------------------------------
    def initial_configurations(self) -> list[tuple[Step, ...]]:
        """Health facts at turn start: all free, one target partly/fully cooling, all cooling."""
        b = self.bounds
        short = b.small if b.small is not None else 1.0
        per: list[list[tuple[Step, ...]]] = []
        for t, pool in zip(self.policy.targets, self.pools, strict=True):
            opts: list[tuple[Step, ...]] = [
                (step(COOL_TARGET, target=t.name, seconds=b.large),),
            ]
            if t.index == 0:  # the primary: also a key cooling, and cooling briefly
                opts.append((step(COOL_TARGET, target=t.name, seconds=short),))
                if len(pool) > 1:
                    opts.append(
                        (
                            step(
                                COOL_CREDENTIAL,
                                target=t.name,
                                credential=pool[0].id,
                                seconds=short,
                            ),
                        )
                    )
            per.append(opts)
        configs: list[tuple[Step, ...]] = [()]
        if self.max_cooling >= 1:
            for opts in per:
                configs += opts
        if self.max_cooling >= 2:
            for i in range(self.n):
                for j in range(i + 1, self.n):
                    for a in per[i]:
                        for c in per[j]:
                            configs.append(a + c)
        if self.n > 1 or self.max_cooling < 1:
            for secs in (short, b.large):
                configs.append(
                    tuple(
                        step(COOL_TARGET, target=t.name, seconds=secs) for t in self.policy.targets
                    )
                )
        # runs of targets cooling for good: the turn starts further down the chain, or a
        # target has no eligible fallback left
        names = [t.name for t in self.policy.targets] if self.max_cooling >= 1 else []
        for k in range(1, len(names) - 1):
            configs.append(
                tuple(step(COOL_TARGET, target=x, seconds=b.large) for x in names[: k + 1])
            )
        for k in range(1, len(names)):
            configs.append(tuple(step(COOL_TARGET, target=x, seconds=b.large) for x in names[k:]))
        for k in range(2, len(names) - 1):
            configs.append(
                tuple(step(COOL_TARGET, target=x, seconds=b.large) for x in names[1 : k + 1])
            )
        # the soonest-free target is not the first one
        if self.n > 1:
            configs.append(
                tuple(
                    step(COOL_TARGET, target=t.name, seconds=short if t.index else b.large)
                    for t in self.policy.targets
                )
            )
        return _unique(configs)

    # -- run ----------------------------------------------------------------------------------
    def run(self) -> CheckReport:
        t0 = time.perf_counter()
        queue: deque[int] = deque()
        inits = self.initial_configurations()
        for setup in inits:
            r = Replay(self.policy, health=self.health_factory(), clock=FakeClock(_START_TIME))
            for st in setup:
                r.feed(st)
            turn = self._new_turn(r.health, r.clock)
            live = _Live(turn, r.clock, _Obs(self.n, 1))
            before = len(self.parent)
            nid = self._add(live, -1, None)
            if len(self.parent) > before:
                self.setup[nid] = setup
                queue.append(nid)
        while queue:
            nid = queue.popleft()
            live = self.live.pop(nid)
            for child in self._expand(nid, live):
                queue.append(child)
            if len(self.parent) > self.max_states:
                self.complete = False
                break
        for live in self.live.values():
            self._release(live)
        self.live.clear()
        if self.inexact and self.abstract_time:
            return self._exact().run()
        if self.complete:
            self._gate_chains()
            self._longest_runs()
        seconds = time.perf_counter() - t0
        unreachable = tuple(
            _describe(t, self.policy)
            for t in self.decl.transitions
            if (t.source, t.trigger, t.dest) not in self.taken
        )
        return CheckReport(
            self.policy,
            len(self.parent),
            self.transitions,
            seconds,
            dict(sorted(self.violations.items(), key=lambda kv: PROPERTIES.index(kv[0]))),
            unreachable,
            len(inits),
            self.turns,
            self.complete,
            self.bounds,
        )

    def _expand(self, nid: int, live: _Live) -> list[int]:
        kind = self.kind[nid][0]
        if kind == "A":
            events = self.on_attempt
        elif kind == "W":
            events = self.on_wait
        elif kind == "R":
            events = self.on_rebuild
        elif kind == "I":
            events = self.on_idle
        elif kind == "T":
            if live.obs.turn >= self.turns:
                self._release(live)
                return []
            events = self.on_end
        else:
            self._release(live)
            return []
        if live.obs.turn > 1 and live.obs.events >= self.follow_events and kind != "T":
            self._release(live)  # a next turn is checked from its start, this far
            return []
        if live.obs.events >= self.bounds.events and kind != "T":
            self._broken(
                "termination",
                f"the turn is still running after {live.obs.events} events "
                f"(bound from the policy: {self.bounds.events})",
                nid,
            )
            self._release(live)
            return []
        s = live.turn.s
        h = s.health
        pre = (
            dict(h._target_until),
            dict(h._cred_until),
            dict(h._streak),
        )
        new: list[int] = []
        last = len(events) - 1
        for i, ev in enumerate(events):
            child = live if i == last else self._clone(live)
            self.transitions += 1
            ok = self._fire(nid, child, ev, pre)
            if not ok:
                self._release(child)
                continue
            before = len(self.parent)
            cid = self._add(child, nid, ev)
            self.edges[nid][ev] = cid
            if len(self.parent) > before:
                new.append(cid)
            else:
                self._release(child)
        return new

    # -- one transition, checked ------------------------------------------------------------------
    def _fire(
        self,
        nid: int,
        child: _Live,
        ev: Step,
        pre: _Facts,
    ) -> bool:
        trigger = ev[0]
        turn = child.turn
        clock = child.clock
        o = child.obs
        if trigger == NEXT_TURN:
            return self._next_turn(nid, child, ev)
        s = turn.s
        source = s.state
        prev_action = s.action
        now0 = clock.t
        outcome = self.outcomes[ev] if ev in self.outcomes else outcome_for(trigger, dict(ev[1]))
        if trigger == WAITED:
            if isinstance(prev_action, Wait) and math.isfinite(prev_action.seconds):
                clock.advance(prev_action.seconds)
        elif outcome is not None and trigger != CANCELLED and self.attempt_seconds:
            clock.advance(self.attempt_seconds)
        n_trace = len(s.trace)
        record_key = self._key(child) if self.record else None
        try:
            action = turn.fire(trigger, outcome)
        except ProtocolError as e:
            self._broken(
                "declaration_equals_execution", f"the machine rejected a host event: {e}", nid, ev
            )
            return False
        except Exception as e:  # a crash inside the engine is a finding, not a checker error
            self._broken("termination", f"the engine raised {type(e).__name__}: {e}", nid, ev)
            return False
        s = turn.s
        now = clock.t
        o.events += 1
        dest = s.state

        # 10. declaration = execution --------------------------------------------------------
        new_events = s.trace[n_trace:]
        if len(new_events) != 1:
            self._broken(
                "declaration_equals_execution",
                f"{len(new_events)} trace records for one event {trigger!r} in {source!r}",
                nid,
                ev,
            )
            return False
        te = new_events[0]
        triple = (te.source, te.event, te.dest)
        if triple not in self.triples or te.source != source or te.dest != dest:
            self._broken(
                "declaration_equals_execution",
                f"executed {source} --{trigger}--> {dest} (trace: {te.source} --{te.event}--> "
                f"{te.dest}), which the declaration does not have",
                nid,
                ev,
            )
            return False
        if dest not in self.state_names:
            self._broken("declaration_equals_execution", f"undeclared state {dest!r}", nid, ev)
            return False
        self.taken.add(triple)
        terminal = dest in TERMINALS
        if terminal != isinstance(action, Finish | Fail) or (
            isinstance(action, Finish) != (dest == DONE)
        ):
            self._broken(
                "declaration_equals_execution",
                f"state {dest!r} with action {type(action).__name__}",
                nid,
                ev,
            )
            return False
        if self.record:
            self.edge_log[(record_key, ev)] = (
                self._key(child),
                (te.source, te.event, te.dest, te.action, te.target, te.credential, te.wait),
            )

        # 9. secrets never leak ------------------------------------------------------------------
        self._scan(nid, ev, te, action)

        # what the host saw: the outcome of the attempt in flight -----------------------------
        kind = _KINDS.get(trigger)
        cur, cred = o.cur, o.cred
        policy = self.policy
        if outcome is not None and kind is not None and kind is not OutcomeKind.CANCELLED:
            o.last = outcome
            o.since_wait = False
            rule = policy.rule(kind) if kind is not OutcomeKind.SUCCESS else None
            if cur >= 0 and cred is not None and rule is not None:
                ra = outcome.retry_after
                retryable = rule.retry
                if not retryable:
                    o.banned.add((cur, cred))
                if kind is OutcomeKind.RATE_LIMITED and ra is not None:
                    k = (cur, cred)
                    o.nb[k] = max(o.nb.get(k, 0.0), now + ra)
                elif kind is OutcomeKind.OVERLOADED and ra is not None:
                    o.tnb[cur] = max(o.tnb.get(cur, 0.0), now + ra)
                elif kind is OutcomeKind.CONTEXT_TOO_LONG:
                    known = policy.targets[cur].context_length
                    if known is not None:
                        o.floor = max(o.floor or 0, known)
                elif kind is OutcomeKind.STREAM_INTERRUPTED:
                    o.committed = outcome.partial or ""

        # 6 (attribution) and 4 (cooldowns never extend themselves): the health store ----------
        self._health_changes(nid, ev, kind, cur, cred, now0, pre, s.health)

        # 1. the fallback gate: a fallback-triggering outcome may not end the turn while an
        # eligible fallback exists ------------------------------------------------------------
        falls_back = self._falls_back(trigger, kind)
        if dest == FAILED and isinstance(action, Fail):
            err = action.error
            missing = [t for t in self.names if t not in err.reasons]
            if missing:
                self._broken(
                    "fallback_gate",
                    f"the turn failed without a reason for {', '.join(missing)}",
                    nid,
                    ev,
                )
            if falls_back and o.committed is None and cur >= 0:
                eligible = self._eligible(o, s.health, now, cur)
                if eligible:
                    self._broken(
                        "fallback_gate",
                        f"{trigger} on {self.names[cur]} ended the turn `failed` although "
                        f"{self.names[eligible[0]]} was eligible",
                        nid,
                        ev,
                    )
            if o.committed is not None and err.partial != o.committed:
                self._broken(
                    "committed_streams_not_replayed",
                    "the turn failed after a committed stream without its partial output",
                    nid,
                    ev,
                )

        # 4. waits ------------------------------------------------------------------------------
        if isinstance(action, Wait):
            w = action.seconds
            if not (math.isfinite(w) and w >= 0):
                self._broken("honest_waits", f"asked to wait {w!r} s", nid, ev)
            else:
                o.waits += w
                if trigger == START:
                    if w > self.start_max + _EPS:
                        self.inexact = True  # the time abstraction assumed shorter waits
                elif cur >= 0:
                    o.nwait[cur] += 1
                    if w > self.step_max + _EPS or o.nwait[cur] >= policy.max_attempts:
                        self.inexact = True
                if w > self.bounds.single_wait + _EPS:
                    self._broken(
                        "honest_waits",
                        f"a single wait of {w:g} s exceeds the cap ({self.bounds.single_wait:g} s)",
                        nid,
                        ev,
                    )
                if o.waits > policy.deadline + _EPS:
                    self._broken(
                        "honest_waits",
                        f"waits total {o.waits:g} s, beyond the deadline ({policy.deadline:g} s)",
                        nid,
                        ev,
                    )
            o.since_wait = True
            if (
                kind is OutcomeKind.RATE_LIMITED
                and policy.rule(kind).fall_back
                and not policy.prefer_waiting
                and o.committed is None
                and cur >= 0
            ):
                eligible = self._eligible(o, s.health, now, cur)
                if eligible:
                    self._broken(
                        "fallback_gate",
                        f"slept {w:g} s on a 429 from {self.names[cur]} although "
                        f"{self.names[eligible[0]]} was eligible now",
                        nid,
                        ev,
                    )

        # 7. a turn starts at the first target not cooling ---------------------------------------
        if trigger == START:
            ready = [j for j in range(self.n) if self._ready_at(s.health, j) <= now]
            if ready:
                if not (isinstance(action, Attempt) and action.target.index == ready[0]):
                    self._broken(
                        "clean_turn_start",
                        f"the turn started with {_show(action)}, not on {self.names[ready[0]]} "
                        "(the first target not cooling)",
                        nid,
                        ev,
                    )
            elif isinstance(action, Wait) and s.ti >= 0:
                o.expect = s.ti
            elif isinstance(action, Attempt):
                self._broken(
                    "clean_turn_start",
                    f"the turn started with {_show(action)} while every target was cooling",
                    nid,
                    ev,
                )

        # the next attempt --------------------------------------------------------------------
        if isinstance(action, Attempt):
            self._attempt(nid, ev, o, action, kind, falls_back, s.health, now)
        return True

    def _next_turn(self, nid: int, child: _Live, ev: Step) -> bool:
        old = child.turn.s
        health = old.health
        turn = self._new_turn(health, child.clock)
        s = turn.s
        fresh = TurnState(self.policy, HealthStore(), FakeClock(child.clock.t), _worst_jitter, None)
        fresh.decl = s.decl
        for name in _PER_TURN_SLOTS:
            mine, ref = getattr(s, name), getattr(fresh, name)
            if mine != ref:
                self._broken(
                    "clean_turn_start",
                    f"a new turn on a used health store starts with {name}={mine!r} "
                    f"(a brand-new turn has {ref!r})",
                    nid,
                    ev,
                )
            prev = getattr(old, name)
            if isinstance(mine, dict | set | list) and mine is prev:
                self._broken(
                    "clean_turn_start", f"the new turn shares {name} with the last one", nid, ev
                )
        self._release(child)
        child.turn = turn
        child.obs = _Obs(self.n, child.obs.turn + 1)
        return True

    # -- checks on an Attempt ---------------------------------------------------------------------
    def _attempt(
        self,
        nid: int,
        ev: Step,
        o: _Obs,
        a: Attempt,
        kind: OutcomeKind | None,
        falls_back: bool,
        health: HealthStore,
        now: float,
    ) -> None:
        j = a.target.index
        c = a.credential.id
        key = self.keys[j]
        policy = self.policy
        name = self.names[j]
        # 3. no ping-pong
        if j != o.cur and j in o.tried:
            self._broken("no_ping_pong", f"returned to {name} after leaving it", nid, ev)
        if j < o.cur:
            self._broken("no_ping_pong", f"went back from {self.names[o.cur]} to {name}", nid, ev)
        # 1. a fallback goes to the first eligible target, and only on a rule that says so
        if o.cur >= 0 and j != o.cur:
            eligible = self._eligible(o, health, now, o.cur)
            if not falls_back:
                self._broken(
                    "fallback_gate",
                    f"fell back to {name} on {ev[0]}, which the policy does not fall back on",
                    nid,
                    ev,
                )
            elif not eligible or eligible[0] != j:
                first = self.names[eligible[0]] if eligible else "none"
                self._broken(
                    "fallback_gate",
                    f"fell back to {name}; the first eligible fallback was {first}",
                    nid,
                    ev,
                )
        if o.expect >= 0 and j != o.expect and o.cur < 0:
            self._broken(
                "clean_turn_start",
                f"waited for {self.names[o.expect]} at turn start, then called {name}",
                nid,
                ev,
            )
        # 4. honest waits: not before any not-before time, in the turn or the health store
        late = max(
            health.target_until(key),
            health.credential_until(key, c),
            o.nb.get((j, c), 0.0),
            o.tnb.get(j, 0.0),
        )
        if late > now + _EPS:
            self._broken(
                "honest_waits",
                f"called {name} with {c} {late - now:g} s before its not-before time",
                nid,
                ev,
            )
        # 5. non-retryable means not retried on the same target and credential
        if (j, c) in o.banned:
            last = o.last.kind.value if o.last is not None else "a non-retryable outcome"
            self._broken(
                "non_retryable_not_retried",
                f"called {name} with {c} again after {last} (not retryable)",
                nid,
                ev,
            )
        # 8. committed streams
        if o.committed is not None:
            rule = policy.rule(OutcomeKind.STREAM_INTERRUPTED)
            if not (policy.continue_streams and rule.retry and j == o.cur):
                self._broken(
                    "committed_streams_not_replayed",
                    f"called {name} after a stream had delivered output (a replay)",
                    nid,
                    ev,
                )
        # 6. rotation: bounded, and only for the credential that failed
        if j == o.cur and o.cred is not None and c != o.cred:
            last_kind = o.last.kind if o.last is not None else None
            if last_kind not in _CRED_LEVEL:
                why = last_kind.value if last_kind is not None else "nothing"
                self._broken(
                    "bounded_rotation",
                    f"switched {name} from {o.cred} to {c} after {why} (not the key's fault)",
                    nid,
                    ev,
                )
            if not o.since_wait:
                o.rot[j] += 1
                if last_kind is not None and not policy.rule(last_kind).rotate:
                    self._broken(
                        "bounded_rotation",
                        f"rotated {name} to {c} on {last_kind.value}, which the policy does "
                        "not rotate on",
                        nid,
                        ev,
                    )
                if o.rot[j] > len(self.pools[j]) - 1:
                    self._broken(
                        "bounded_rotation",
                        f"rotated {name}'s credential {o.rot[j]} times (pool of "
                        f"{len(self.pools[j])})",
                        nid,
                        ev,
                    )
        # 2. termination: attempts bounded by the policy
        o.attempts[j] += 1
        o.total += 1
        if o.attempts[j] > self.bounds.per_target[j]:
            self._broken(
                "termination",
                f"{o.attempts[j]} attempts on {name} in one turn (bound "
                f"{self.bounds.per_target[j]})",
                nid,
                ev,
            )
        if o.total > self.bounds.attempts:
            self._broken(
                "termination",
                f"{o.total} attempts in one turn (bound {self.bounds.attempts})",
                nid,
                ev,
            )
        if j not in o.tried:
            o.tried.append(j)
        o.cur = j
        o.cred = c
        o.since_wait = False
        o.last = None

    # -- helpers ------------------------------------------------------------------------------
    def _falls_back(self, trigger: str, kind: OutcomeKind | None) -> bool:
        p = self.policy
        if trigger == REBUILD_FAILED:
            return p.rule(OutcomeKind.TRANSPORT).fall_back
        if kind is None or kind in (OutcomeKind.SUCCESS, OutcomeKind.CANCELLED):
            return False
        return p.rule(kind).fall_back

    def _ready_at(self, h: HealthStore, j: int) -> float:
        key = self.keys[j]
        creds = min(h.credential_until(key, c.id) for c in self.pools[j])
        return max(h.target_until(key), creds)

    def _eligible(self, o: _Obs, h: HealthStore, now: float, cur: int) -> list[int]:
        """Fallbacks after `cur` that could be entered now (the checker's own reading)."""
        out = []
        targets = self.policy.targets
        for j in range(cur + 1, self.n):
            t = targets[j]
            if j in o.tried or any(targets[k].same_as(t) for k in o.tried):
                continue
            if o.floor is not None and (t.context_length is None or t.context_length <= o.floor):
                continue
            if self._ready_at(h, j) > now:
                continue
            out.append(j)
        return out

    def _health_changes(
        self,
        nid: int,
        ev: Step,
        kind: OutcomeKind | None,
        cur: int,
        cred: str | None,
        now: float,
        pre: _Facts,
        h: HealthStore,
    ) -> None:
        post: _Facts = (
            h._target_until,
            h._cred_until,
            h._streak,
        )
        if pre[0] == post[0] and pre[1] == post[1] and pre[2] == post[2]:
            return
        key = self.keys[cur] if cur >= 0 else None
        trigger = ev[0]
        is_outcome = kind is not None and kind is not OutcomeKind.CANCELLED
        for which in range(3):
            a = pre[which]
            b = post[which]
            for k in a.keys() | b.keys():
                old, new = a.get(k, 0), b.get(k, 0)
                if old == new:
                    continue
                if which < 2 and old > now + _EPS and new > old + _EPS:
                    self._broken(
                        "honest_waits",
                        f"a cooldown of {_show_key(k)} still running was extended by "
                        f"{new - old:g} s (cooldowns never extend themselves)",
                        nid,
                        ev,
                    )
                if kind is OutcomeKind.SUCCESS:
                    ok = new == 0 and (k == key or k == (key, cred))
                elif which == 0:  # a target cooldown
                    ok = k == key and (
                        (is_outcome and kind not in _CRED_LEVEL) or trigger == REBUILD_FAILED
                    )
                elif which == 1:  # a credential cooldown
                    ok = k == (key, cred) and kind in _CRED_LEVEL
                else:  # a failure streak
                    ok = k == key and (is_outcome or trigger == REBUILD_FAILED)
                if not ok:
                    self._broken(
                        "bounded_rotation",
                        f"{trigger} on {self.names[cur] if cur >= 0 else 'no target'}"
                        f"{f' ({cred})' if cred else ''} changed the health of {_show_key(k)}",
                        nid,
                        ev,
                    )

    def _scan(self, nid: int, ev: Step, te: Any, action: Action) -> None:
        """Every string a transition produces: its trace record, its action, its error."""
        parts = [
            te.source,
            te.event,
            te.dest,
            te.action,
            te.detail,
            te.target or "",
            te.model or "",
            te.credential or "",
        ]
        cls = type(action)
        if cls is Fail:
            err = action.error  # type: ignore[union-attr]
            parts += [str(err), repr(err), repr(err.reasons), err.summary]
        elif cls is Attempt or cls is Rebuild:
            objs: tuple[Any, ...] = (action.target,)  # type: ignore[union-attr]
            if cls is Attempt:
                objs = (action.target, action.credential)  # type: ignore[union-attr]
            for obj in objs:
                if id(obj) not in self._repr_ok:
                    parts += [repr(obj), str(obj)]
                    self._repr_ok.add(id(obj))
        elif cls is Wait:
            parts.append(action.reason)  # type: ignore[union-attr]
        text = "\x00".join(parts)
        m = self.leak.search(text)
        if m is not None:
            at = max(0, m.start() - 40)
            self._broken(
                "secrets_never_leak",
                "a key appears in "
                + repr(self.leak.sub("***", text[at : m.end() + 20]).replace(chr(0), " | ")),
                nid,
                ev,
            )

    def _exact(self) -> Checker:
        """The same check without the time abstraction (an engine waited longer than a
        correct one could, so elapsed time is kept exactly)."""
        c = Checker(**self._args, abstract_time=False)  # type: ignore[arg-type]
        return c

    # -- 2. termination over the whole graph: no cycle, no run longer than the bound ---------
    def _longest_runs(self) -> None:
        """Within a turn, the configuration graph must be acyclic and its longest run from a
        turn start must stay within the policy's event bound."""
        n = len(self.kind)
        longest = [-1] * n  # events to the end of the turn; -1 unknown
        best: list[Step | None] = [None] * n
        on_stack = [False] * n
        nt = NEXT_TURN
        edges = self.edges
        for root in range(n):
            if longest[root] >= 0:
                continue
            stack: list[tuple[int, Any]] = [(root, iter(edges[root].items()))]
            on_stack[root] = True
            while stack:
                node, it = stack[-1]
                advanced = False
                for ev, child in it:
                    if ev[0] == nt:
                        continue
                    if on_stack[child]:
                        cycle = self._cycle_steps(stack, child, ev)
                        self._broken(
                            "termination",
                            "a run can go round a cycle of configurations forever",
                            child,
                            *cycle,
                        )
                        continue
                    if longest[child] < 0:
                        on_stack[child] = True
                        stack.append((child, iter(edges[child].items())))
                        advanced = True
                        break
                if advanced:
                    continue
                stack.pop()
                on_stack[node] = False
                top, arg = 0, None
                for ev, child in edges[node].items():
                    if ev[0] == nt or longest[child] < 0:
                        continue
                    if longest[child] + 1 > top:
                        top, arg = longest[child] + 1, ev
                longest[node] = top
                best[node] = arg
        limit = self.bounds.events
        worst = max(
            (nid for nid, k in enumerate(self.kind) if k[0] == "I"),
            key=lambda nid: longest[nid],
            default=None,
        )
        if worst is not None and longest[worst] > limit:
            steps: list[Step] = []
            cur = worst
            while True:
                ev2 = best[cur]
                if ev2 is None:
                    break
                steps.append(ev2)
                cur = edges[cur][ev2]
            self._broken(
                "termination",
                f"a turn can take {longest[worst]} events (bound from the policy: {limit})",
                worst,
                *steps,
            )

    def _cycle_steps(self, stack: list[tuple[int, Any]], entry: int, closing: Step) -> list[Step]:
        nodes = [nid for nid, _ in stack]
        at = nodes.index(entry)
        steps: list[Step] = []
        for a, b in zip(nodes[at:], nodes[at + 1 :], strict=False):
            for ev, child in self.edges[a].items():
                if child == b and ev[0] != NEXT_TURN:
                    steps.append(ev)
                    break
        steps.append(closing)
        return steps

    # -- 1. the gate, as reachability: repeating a fallback-triggering outcome must leave ------
    def _gate_chains(self) -> None:
        """From every configuration with an attempt on target i in flight, feeding the same
        fallback-triggering outcome again and again (the host answering waits and rebuilds)
        must reach another target or end the turn within the per-target bound."""
        memo: dict[tuple[int, Step], int] = {}
        best: tuple[int, int, Step] | None = None
        kinds = self.kind
        edges = self.edges
        waited = step(WAITED)
        rebuilt = step(REBUILT)
        for nid, (k, i) in enumerate(kinds):
            if k != "A":
                continue
            for fb in self.fallback_steps:
                if (nid, fb) in memo:
                    continue
                chain: list[int] = []
                cur = nid
                attempts = 0
                result = 0
                while True:
                    kk, ti = kinds[cur]
                    m = memo.get((cur, fb))
                    if m is not None:
                        result = m
                        break
                    if kk == "A":
                        if ti != i:
                            result = 1
                            break
                        attempts += 1
                        if attempts > self.bounds.per_target[i]:
                            result = -1
                            break
                        e = fb
                    elif kk == "W":
                        e = waited
                    elif kk == "R":
                        e = rebuilt
                    else:
                        result = 1
                        break
                    nxt = edges[cur].get(e)
                    if nxt is None or nxt in chain or nxt == cur:
                        result = -1 if nxt is not None else 1
                        break
                    chain.append(cur)
                    cur = nxt
                for c in chain:
                    memo[(c, fb)] = result
                memo[(nid, fb)] = result
                if result < 0:
                    depth = len(self.path(nid))
                    cand = (depth + len(chain) + 1, nid, fb)
                    if best is None or cand[0] < best[0]:
                        best = cand
        if best is not None and "fallback_gate" not in self.violations:
            _, nid, fb = best
            # rebuild the chain's steps for the report
            steps: list[Step] = []
            cur = nid
            attempts = 0
            i = kinds[nid][1]
            seen: set[int] = set()
            while True:
                kk, _ti = kinds[cur]
                if kk == "A":
                    attempts += 1
                    e = fb
                elif kk == "W":
                    e = waited
                else:
                    e = rebuilt
                steps.append(e)
                nxt = edges[cur].get(e)
                if nxt is None or nxt in seen or attempts > self.bounds.per_target[i]:
                    break
                seen.add(cur)
                cur = nxt
            self._broken(
                "fallback_gate",
                f"repeating {fb[0]}{_args(fb)} on {self.names[i]} never reaches a fallback",
                nid,
                *steps,
            )


def _args(st: Step) -> str:
    return f" {dict(st[1])}" if st[1] else ""


def _show(a: Action) -> str:
    if isinstance(a, Attempt):
        return f"an attempt on {a.target.name}"
    if isinstance(a, Wait):
        return f"a wait of {a.seconds:g} s"
    return type(a).__name__


def _show_key(k: Any) -> str:
    if isinstance(k, tuple) and len(k) == 2 and isinstance(k[1], str) and isinstance(k[0], tuple):
        return f"credential {k[1]} of {'/'.join(x for x in k[0] if x)}"
    if isinstance(k, tuple):
        return f"target {'/'.join(str(x) for x in k if x)}"
    return str(k)


def _describe(t: Any, policy: Policy) -> str:
    guard = (
        f" [{t.guard}{'=' + policy.targets[t.arg].name if t.arg >= 0 else ''}]" if t.guard else ""
    )
    return f"{t.source} --{t.trigger}{guard}--> {t.dest}"


class Monitor(Checker):
    """The checker's per-transition property checks along one run, step by step (for
    fuzzing: Hypothesis drives it with random policies and random outcomes).

    `feed(step)` applies one step (any trigger, any Retry-After, ``next_turn``) and
    checks it; `violations` holds what broke, each with the steps so far.
    """

    def __init__(self, policy: Policy, **kw: Any) -> None:
        super().__init__(policy, abstract_time=False, **kw)
        self.clock = FakeClock(_START_TIME)
        self.health = self.health_factory()
        self.steps: list[Step] = []
        self.live = {0: _Live(self._new_turn(self.health, self.clock), self.clock, _Obs(self.n, 1))}

    @property
    def turn(self) -> _TurnBase:
        return self.live[0].turn

    @property
    def obs_events(self) -> int:
        return self.live[0].obs.events

    def allowed(self) -> str:
        """What the host may feed now: "start", "outcome", "waited", "rebuilt" or "end"."""
        s = self.turn.s
        if s.state in TERMINALS:
            return "end"
        a = s.action
        if a is None:
            return "start"
        if isinstance(a, Wait):
            return "waited"
        if isinstance(a, Rebuild):
            return "rebuilt"
        return "outcome"

    def feed(self, st: Step) -> None:
        live = self.live[0]
        h = live.turn.s.health
        pre: _Facts = (dict(h._target_until), dict(h._cred_until), dict(h._streak))
        self.transitions += 1
        self._fire(-1, live, st, pre)
        self.steps.append(st)

    def advance(self, seconds: float) -> None:
        """Let time pass between turns (cooldowns run out)."""
        self.clock.advance(seconds)
        self.steps.append(step(ADVANCE, seconds=seconds))

    def path(self, nid: int, *extra: Step) -> tuple[Step, ...]:
        return (*self.steps, *extra)


# -- public entry points --------------------------------------------------------------------------


def check_policy(
    policy: Policy,
    *,
    declaration: Declaration | Callable[[Policy], Declaration] | None = None,
    guards: Mapping[str, Guard] | None = None,
    effects: Mapping[str, Effect] | None = None,
    health_factory: Callable[[], HealthStore] = HealthStore,
    executor: Executor = Turn,
    turns: int = 2,
    max_cooling: int = 1,
    attempt_seconds: float = 0.0,
    max_states: int = 400_000,
) -> CheckReport:
    """Explore every reachable configuration of `policy` and check SPEC section 5.

    `declaration` (or a function of the policy returning one), `guards` and
    `effects` replace the machine's own, to show the checker failing on broken
    machines; `health_factory` may build a broken health store. `turns` bounds
    how many consecutive turns share one health store; `max_cooling` how many
    targets are cooling in an initial configuration.
    """
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
    ).run()


def check_main(path: str | None, as_json: bool) -> int:
    """`fallgate check [POLICY.toml] [--json]`: 0 when every property holds, 1 when one is
    broken (or the search was cut short), 2 when the policy is invalid."""
    try:
        policy = default_policy() if path is None else Policy.from_toml(path)
    except PolicyError as e:
        first = str(e).splitlines()
        text = "; ".join(x.strip() for x in first)
        print(f"fallgate check: {text}", file=sys.stderr)
        return 2
    report = check_policy(policy)
    if as_json:
        print(json.dumps(report.to_json()))
    else:
        where = path or "the default policy"
        print(f"fallgate check: {where}")
        print(report.text())
    return 0 if report.ok else 1
