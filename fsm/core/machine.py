"""The turn machine, declared once, as data.

`declare(policy)` generates the states (one group per target of the user's
chain) and the ordered, guarded transitions, from the outcome kinds' traits
and the policy's rules. Everything else reads this declaration: the
`transitions` executor, the compiled fast executor, the diagrams and the model
checker. Nothing restates it.

Semantics of one event: the outcome is first *observed* (the observations the
declaration lists for its kind: streaks, benched keys, not-before times), then
the transitions declared for (state, trigger) are tried in order; the first
whose guard holds is taken and its effect returns the next action. The last
candidate of every group has no guard, so every declared (state, trigger) pair
always has a way out.

Where a transition picks one target among several (fall back to the next
eligible one, start at the first not cooling), the declaration holds one
`FanOut` standing for one edge per target, in chain order: so the declaration
grows linearly with the chain, not with its square (every target may fall back
to every later one). `Declaration.edges()` lists every edge.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Final, TypeAlias

import attrs

from ..kinds import (
    ABORTED,
    CANCELLED,
    DENIED,
    DONE,
    FAILED,
    FAULT_KINDS,
    IDLE,
    REBUILD_FAILED,
    REBUILT,
    START,
    SUCCESS,
    TERMINALS,
    TRAITS,
    WAITED,
    OutcomeKind,
    Phase,
)
from ..policy.model import Policy
from .guards import (
    ABORT,
    AFRESH,
    ATTEMPT,
    AWAIT_VERDICT,
    AWAIT_VERDICT_AFTER,
    BACK_OFF,
    CAN_RECOVER,
    CAN_ROTATE,
    CAN_WAIT,
    CONTINUE,
    CONTINUE_HERE,
    CONTINUE_ON,
    ENTER,
    FALL_BACK,
    FINISH,
    FIRST_IS,
    IN_TIME,
    NEXT_CONTINUES_IS,
    NEXT_IS,
    REBUILD,
    RECOVERED,
    ROTATE,
    SERVER_RETRY,
    SOONEST_IS,
    TRANSPORT_RETRY,
    WAIT_FOR_TARGET,
    WAIT_RATE_LIMIT,
    WAIT_VERDICT,
    Effect,
    Guard,
    Observation,
)
from .leaving import FAIL, LATE
from .observations import observations
from .pacing import PACE_WAIT, PACE_WAIT_EFFECT, SETTLE

__all__ = [
    "ABORTED",
    "CANCELLED",
    "DENIED",
    "DONE",
    "FAILED",
    "IDLE",
    "REBUILD_FAILED",
    "REBUILT",
    "START",
    "SUCCESS",
    "TERMINALS",
    "WAITED",
    "Declaration",
    "FanOut",
    "Phase",
    "State",
    "Transition",
    "declare",
    "state_name",
]

#: How a same-target retry enters each retry phase: its guard and effect.
RETRY_EDGES: Final[Mapping[Phase, tuple[Guard, Effect]]] = {
    Phase.TRANSPORT_BACKOFF: (TRANSPORT_RETRY, BACK_OFF),
    Phase.RATE_LIMITED: (CAN_WAIT, WAIT_RATE_LIMIT),
    Phase.SERVER_BACKOFF: (SERVER_RETRY, BACK_OFF),
}
#: Phases the host leaves with `waited`.
WAIT_PHASES: Final = (
    Phase.TRANSPORT_BACKOFF,
    Phase.RATE_LIMITED,
    Phase.SERVER_BACKOFF,
    Phase.COOLING,
)


@attrs.frozen(slots=True)
class State:
    name: str
    target: int | None = None  # index into policy.targets; None for idle/terminals
    phase: Phase = Phase.CALLING

    @property
    def terminal(self) -> bool:
        return self.name in TERMINALS


@attrs.frozen(slots=True)
class Transition:
    """One declared edge. `arg` is the target index its guard or effect is about."""

    trigger: str
    source: str
    dest: str
    guard: Guard | None
    effect: Effect
    arg: int = -1

    def label(self, policy: Policy) -> str:
        if self.guard is None:
            return self.trigger
        return f"{self.trigger} [{self.guard.label(policy, self.arg)}]"


@attrs.frozen(slots=True)
class FanOut:
    """One edge per target of ``among[lo:hi]`` (target indexes, ascending), in that
    order: edge j goes to ``dests[j]`` with guard and effect about target j.

    Listed one by one, the fall-back edges give each target an edge to every later
    one, per fault kind: n²/2 of them for a chain of n (4 million edges, 23 s and
    835 MB for 1,000 targets). As a fan-out each set is one object; `dests` (every
    target's state of one phase) and `among` are shared by the fan-outs."""

    trigger: str
    source: str
    guard: Guard
    effect: Effect
    dests: tuple[str, ...] = attrs.field(repr=False)
    among: Sequence[int] = attrs.field(repr=False)
    lo: int = 0
    hi: int = 0

    def edge(self, j: int) -> Transition:
        """The edge to target j (one of ``among[lo:hi]``)."""
        return Transition(self.trigger, self.source, self.dests[j], self.guard, self.effect, j)

    def edges(self) -> Iterator[Transition]:
        for k in range(self.lo, self.hi):
            yield self.edge(self.among[k])

    def covers(self, j: int) -> bool:
        """Is there an edge to target j?"""
        k = bisect.bisect_left(self.among, j, self.lo, self.hi)
        return k < self.hi and self.among[k] == j


#: What a declaration lists: an edge, or a fan-out standing for one edge per target.
Declared: TypeAlias = Transition | FanOut


def expand(items: Iterable[Declared]) -> Iterator[Transition]:
    """Every edge, fan-outs listed edge by edge in place."""
    for t in items:
        if isinstance(t, FanOut):
            yield from t.edges()
        else:
            yield t


def state_name(target_name: str, phase: Phase) -> str:
    return target_name if phase is Phase.CALLING else f"{target_name}_{phase.value}"


@attrs.frozen(slots=True)
class Declaration:
    """States, triggers, ordered transitions and per-kind observations of one machine.

    `transitions` is the declaration as listed (edges and fan-outs, linear in the
    chain); `edges()` is every edge, one by one (diagrams, the checker, the
    `transitions` executor)."""

    policy: Policy = attrs.field(repr=False)
    states: tuple[State, ...]
    transitions: tuple[Declared, ...]
    triggers: tuple[str, ...]
    #: trigger -> what `observe` records for it before any guard (fault kinds only)
    observes: Mapping[str, tuple[Observation, ...]] = attrs.field(repr=False)
    initial: str = IDLE
    _by_name: dict[str, State] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {s.name: s for s in self.states})

    def state(self, name: str) -> State:
        return self._by_name[name]

    def edges(self) -> Iterator[Transition]:
        """Every edge in declared order, fan-outs listed edge by edge."""
        return expand(self.transitions)

    def groups(self) -> dict[tuple[str, str], tuple[Transition, ...]]:
        """(source, trigger) -> candidates in declared order."""
        out: dict[tuple[str, str], list[Transition]] = {}
        for t in self.edges():
            out.setdefault((t.source, t.trigger), []).append(t)
        return {k: tuple(v) for k, v in out.items()}

    def replacing(
        self,
        guards: Mapping[Guard, Guard] | None = None,
        effects: Mapping[Effect, Effect] | None = None,
    ) -> Declaration:
        """The same machine with some guard or effect objects swapped (used to prove
        that the checker catches deliberately broken machines)."""
        g = guards or {}
        e = effects or {}

        def swap(t: Declared) -> Declared:
            if isinstance(t, FanOut):
                return attrs.evolve(
                    t, guard=g.get(t.guard, t.guard), effect=e.get(t.effect, t.effect)
                )
            guard = g.get(t.guard, t.guard) if t.guard is not None else None
            return attrs.evolve(t, guard=guard, effect=e.get(t.effect, t.effect))

        return attrs.evolve(self, transitions=tuple(swap(t) for t in self.transitions))


def declare(policy: Policy) -> Declaration:
    """Generate the machine for `policy` (memoised on the policy: built once)."""
    memo = policy.memo
    found = memo.get("declaration")
    if isinstance(found, Declaration):
        return found
    decl = _declare(policy)
    memo["declaration"] = decl
    return decl


def _states(policy: Policy) -> list[State]:
    phases = set(Phase)
    if not policy.recover_transport:
        phases.discard(Phase.RECOVERING)
    phases.discard(Phase.CONTINUING)  # only on the targets that can continue a stream
    states = [State(IDLE)]
    for t in policy.targets:
        here = phases | {Phase.CONTINUING} if _continues(policy, t.index) else phases
        states += [State(state_name(t.name, ph), t.index, ph) for ph in Phase if ph in here]
    return [*states, State(DONE), State(FAILED), State(ABORTED)]


def _dests(policy: Policy, phase: Phase) -> tuple[str, ...]:
    """Every target's state of `phase`, by index: shared by the fan-outs (memoised)."""
    key = f"dests:{phase.value}"
    found = policy.memo.get(key)
    if found is None:
        found = policy.memo[key] = tuple(state_name(t.name, phase) for t in policy.targets)
    return found  # type: ignore[return-value]


def _turn_start(policy: Policy) -> Iterator[Declared]:
    """The first target not cooling; if all are cooling, wait for the soonest."""
    n = len(policy.targets)
    every = range(n)
    yield FanOut(START, IDLE, FIRST_IS, ENTER, _dests(policy, Phase.CALLING), every, 0, n)
    cooling = _dests(policy, Phase.COOLING)
    yield FanOut(START, IDLE, SOONEST_IS, WAIT_FOR_TARGET, cooling, every, 0, n)
    yield Transition(START, IDLE, FAILED, None, FAIL)


def _continues(policy: Policy, i: int) -> bool:
    """Is a broken stream continued on target i (the policy's knob and the target's)?"""
    return policy.continues and policy.targets[i].continues


def _continuations(policy: Policy, i: int, trigger: str, source: str) -> Iterator[Declared]:
    """A committed stream broke (or its continuation failed) on target i: continue it
    on i itself when the stream broke there and i is healthy, else on the next eligible
    target that can continue it; then fail with the delivered text. Never a replay."""
    if not policy.continues:
        return
    here = policy.targets[i].name
    if trigger == OutcomeKind.STREAM_INTERRUPTED.value and _continues(policy, i):
        yield Transition(
            trigger, source, state_name(here, Phase.CONTINUING), CONTINUE_HERE, CONTINUE, i
        )
    able = _continuing_targets(policy)
    lo = bisect.bisect_right(able, i)
    if lo < len(able):
        cont = _dests(policy, Phase.CONTINUING)
        yield FanOut(trigger, source, NEXT_CONTINUES_IS, CONTINUE_ON, cont, able, lo, len(able))


def _continuing_targets(policy: Policy) -> tuple[int, ...]:
    """The targets a broken stream may be continued on, ascending (memoised)."""
    found = policy.memo.get("continuing_targets")
    if found is None:
        found = policy.memo["continuing_targets"] = tuple(
            t.index for t in policy.targets if _continues(policy, t.index)
        )
    return found  # type: ignore[return-value]


def _on_fault(policy: Policy, i: int, kind: OutcomeKind) -> Iterator[Declared]:
    """The ordered ways out of target i's calling state after a `kind` outcome."""
    here = policy.targets[i].name
    k = kind.value
    traits = TRAITS[kind]
    rule = policy.rule(kind)
    if traits.committed:  # the caller has some of the answer: continue it, or fail
        yield from _continuations(policy, i, k, here)
        yield Transition(k, here, FAILED, None, FAIL)
        return
    retry: Transition | None = None
    if rule.retry and traits.wait_phase is not None:
        guard, effect = RETRY_EDGES[traits.wait_phase]
        retry = Transition(k, here, state_name(here, traits.wait_phase), guard, effect)
    if retry is not None and traits.retry_first:
        yield retry
    if traits.streak and rule.retry and policy.recover_transport:
        yield Transition(k, here, state_name(here, Phase.RECOVERING), CAN_RECOVER, REBUILD)
    if rule.rotate and len(policy.targets[i].pool()) > 1:  # one key: nothing to rotate to
        yield Transition(k, here, here, CAN_ROTATE, ROTATE)
    # Any other retry waits, so it comes after the fallbacks: never sleep while an
    # eligible fallback is available now, unless the policy prefers waiting.
    late = retry is not None and not traits.retry_first
    if late and policy.prefer_waiting:
        yield retry  # type: ignore[misc]
    if rule.fall_back:
        yield from _fallbacks(policy, i, k, here)
    if late and not policy.prefer_waiting:
        yield retry  # type: ignore[misc]
    if rule.retry:  # no way left while the breaker is open or probed: wait for its verdict
        cooling = state_name(here, Phase.COOLING)
        yield Transition(k, here, cooling, AWAIT_VERDICT_AFTER, WAIT_VERDICT)
    yield Transition(k, here, FAILED, None, FAIL)


def _fallbacks(policy: Policy, i: int, trigger: str, source: str) -> Iterator[Declared]:
    """To the next eligible target: one edge per later target, then (after a context
    overflow) the moves back up the chain `_back_targets` allows."""
    n = len(policy.targets)
    calling = _dests(policy, Phase.CALLING)
    here = policy.targets[i].context_length
    if i + 1 < n:
        ahead: Sequence[int] = range(n)
        lo = i + 1
        if trigger == OutcomeKind.CONTEXT_TOO_LONG.value and here is not None:
            # the overflow sets the floor to this target's length at least: a later one
            # known to be no larger is never eligible, so it gets no edge
            larger = _larger_ahead(policy, i, here)
            if larger is not None:
                ahead, lo = larger, 0
        if lo < len(ahead):
            yield FanOut(trigger, source, NEXT_IS, FALL_BACK, calling, ahead, lo, len(ahead))
    if here is None:
        return
    back = _back_targets(policy)
    below = bisect.bisect_left(back, i)
    if below:
        yield FanOut(trigger, source, NEXT_IS, FALL_BACK, calling, back, 0, below)


def _larger_ahead(policy: Policy, i: int, length: int) -> tuple[int, ...] | None:
    """The targets after i a context overflow on i (known `length`) may fall back to:
    every later one but those known to be no larger (None when that is all of them)."""
    targets = policy.targets
    out = []
    for j in range(i + 1, len(targets)):
        known = targets[j].context_length
        if known is None or known > length:
            out.append(j)
    return None if len(out) == len(targets) - i - 1 else tuple(out)


def _back_targets(policy: Policy) -> tuple[int, ...]:
    """The only moves back up the chain (`TurnState.next_eligible`): after a context
    overflow, from a target of known context_length to an untried one of unknown
    length that was passed over for it. So: the targets j of unknown context_length
    with a known one before them (the overflow that set the floor); a target i of
    known length may move back to those before it. Shared by every fan-out (memoised)."""
    found = policy.memo.get("back_targets")
    if found is None:
        out, known_before = [], False
        for j, t in enumerate(policy.targets):
            if t.context_length is not None:
                known_before = True
            elif known_before:
                out.append(j)
        found = policy.memo["back_targets"] = tuple(out)
    return found  # type: ignore[return-value]


def _target(policy: Policy, i: int) -> Iterator[Declared]:
    here = policy.targets[i].name
    yield Transition(SUCCESS, here, DONE, None, FINISH)
    for kind in FAULT_KINDS:
        yield from _on_fault(policy, i, kind)
    # The health store refused the attempt (another turn holds the half-open target's
    # probe lease, or its retry budget is empty): move on as if it were not eligible;
    # with no fallback eligible, a refusal by the breaker waits for its verdict.
    yield from _fallbacks(policy, i, DENIED, here)
    yield Transition(DENIED, here, state_name(here, Phase.COOLING), AWAIT_VERDICT, WAIT_VERDICT)
    if policy.pacing:  # refused for headroom another turn took: wait for the soonest reset
        cooling = state_name(here, Phase.COOLING)
        yield Transition(DENIED, here, cooling, PACE_WAIT, PACE_WAIT_EFFECT)
    yield Transition(DENIED, here, FAILED, None, FAIL)
    # A committed stream being continued may only finish, be continued (here after a
    # new break, else on the next target that can) or fail: no rotation, no fallback,
    # no replay (its output already reached the caller).
    if _continues(policy, i):
        cont = state_name(here, Phase.CONTINUING)
        yield Transition(SUCCESS, cont, DONE, None, FINISH)
        for trigger in (*(kind.value for kind in FAULT_KINDS), DENIED):
            yield from _continuations(policy, i, trigger, cont)
            yield Transition(trigger, cont, FAILED, None, FAIL)
    # A wait or a rebuild may overrun the deadline (a late wake-up, a slow rebuild):
    # then no attempt follows.
    # After a wait for the target to be free (turn start, a breaker's verdict) the
    # attempt is a first one, as a turn starting then would make.
    for phase in WAIT_PHASES:
        effect = AFRESH if phase is Phase.COOLING else ATTEMPT
        yield Transition(WAITED, state_name(here, phase), here, IN_TIME, effect)
        yield Transition(WAITED, state_name(here, phase), FAILED, None, LATE)
    if policy.recover_transport:
        rec = state_name(here, Phase.RECOVERING)
        yield Transition(REBUILT, rec, here, IN_TIME, RECOVERED)
        yield Transition(REBUILT, rec, FAILED, None, LATE)
        if policy.rule(OutcomeKind.TRANSPORT).fall_back:  # a failed rebuild is transport
            yield from _fallbacks(policy, i, REBUILD_FAILED, rec)
        yield Transition(REBUILD_FAILED, rec, FAILED, None, FAIL)


def _declare(policy: Policy) -> Declaration:
    states = _states(policy)
    tr: list[Declared] = list(_turn_start(policy))
    for i in range(len(policy.targets)):
        tr += _target(policy, i)
    tr += [Transition(CANCELLED, s.name, ABORTED, None, ABORT) for s in states if not s.terminal]
    triggers = (START, *[k.value for k in OutcomeKind], WAITED, REBUILT, REBUILD_FAILED, DENIED)
    observes = {k.value: observations(t) for k, t in TRAITS.items() if t.fault}
    if policy.pacing:  # every way an attempt ends releases its headroom reservation
        observes = {k.value: (SETTLE, *observes.get(k.value, ())) for k in OutcomeKind}
    return Declaration(policy, tuple(states), tuple(tr), triggers, observes)
