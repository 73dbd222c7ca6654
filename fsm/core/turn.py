"""The pure core: one turn, fed events, returning actions.

Two executors run the declaration (`machine.py`) with exactly the same guard,
effect and observation objects (`guards.py`) on the same `TurnState`:

* `Turn` — a table compiled from the declaration (the default, fast path);
* `TransitionsTurn` — a real `transitions.Machine` built once per policy.

No I/O, no sleeping, no wall clock, no global randomness: clock and random
source are injected.
"""

from __future__ import annotations

import logging
import random as _random
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

from .. import clock as _clock
from ..health.store import HealthStore
from ..kinds import CANCELLED_OUTCOME, Outcome
from ..policy.model import Policy
from ..trace import TraceEvent
from .actions import Action, Attempt, Fail
from .guards import Effect, Guard, Observation, pick_of
from .machine import (
    CANCELLED,
    DENIED,
    DONE,
    FAILED,
    IDLE,
    REBUILD_FAILED,
    REBUILT,
    START,
    TERMINALS,
    WAITED,
    Declaration,
    FanOut,
    Transition,
    declare,
)
from .pacing import SETTLE, settle
from .state import UNSET, TurnState

Hook = Callable[[TraceEvent], None]
_logger = logging.getLogger("fallgate")
_NOTHING: Final[tuple[Observation, ...]] = ()


class ProtocolError(RuntimeError):
    """The host fed an event the machine does not declare in the current state."""


def observe(s: TurnState, trigger: str, outcome: Outcome | None) -> None:
    """Before any guard: read the clock once for the event and record what the
    outcome says (the observations its kind's traits call for)."""
    s._next = s._ready_first = UNSET
    s.at = s.clock()  # one event, one instant: guards and effects all read `at`
    if outcome is None:
        return
    s.outcome = outcome
    for ob in s.decl.observes.get(trigger, _NOTHING):
        ob.apply(s, outcome)


def apply(
    s: TurnState,
    t: Transition,
    trigger: str,
    run: Callable[[TurnState, int], Action] | None = None,
) -> Action:
    """Take transition `t`: move, run its effect, record the trace event."""
    return take(s, t.source, t.dest, t.arg, trigger, run or t.effect.run)


def take(
    s: TurnState,
    source: str,
    dest: str,
    arg: int,
    trigger: str,
    run: Callable[[TurnState, int], Action],
) -> Action:
    """Take the edge `source` -> `dest` (its effect `run`, about target `arg`): move, run
    the effect, record the trace event.

    The event is recorded as a plain tuple and only turned into a `TraceEvent`
    when someone looks (a hook, `trace`, a failure): most turns never pay for it.
    """
    s.state = dest
    # the transition ends a request when the last action was an attempt that went out
    sent = s.at - s.attempt_started if type(s.action) is Attempt and trigger != DENIED else None
    action = run(s, arg)
    s.action = action
    s.seq = seq = s.seq + 1
    v = s.visit
    # the raw facts only; what the trace shows of them is worked out in
    # `fsm.core.events.trace_event`
    s._raw.append(
        (
            seq,
            s.at - s.started,
            source,
            trigger,
            dest,
            action,
            v.index,
            v.credential,
            s.outcome,
            sent,
        )
    )
    if type(action) is Fail:
        action.error.trace = tuple(s.trace)
    if s.hook is not None:
        s.hook(s.trace[-1])
    return action


def _observing(hook: Hook) -> Hook:
    """`hook` as the turn calls it: it observes, never steers, so an exception it raises
    is logged (a WARNING, the first of a turn) and the turn goes on: a buggy observer does
    not throw away an answer already paid for, nor leave a turn unended."""
    failed = False

    def observe_safely(ev: TraceEvent) -> None:
        nonlocal failed
        try:
            hook(ev)
        except Exception:
            if not failed:
                failed = True
                _logger.warning(
                    "fallgate: the on_transition hook raised on %s --%s--> %s; the turn goes "
                    "on (later raises of this turn are not logged)",
                    ev.source,
                    ev.event,
                    ev.dest,
                    exc_info=True,
                )

    return observe_safely


Observer = Callable[[TurnState, Outcome], None]
#: A compiled fan-out: does it have an edge to target j, and every target's destination.
Fan = tuple[Callable[[int], bool], tuple[str, ...]]
#: One way out of a (state, trigger), tried in declared order: (check, its argument,
#: destination, effect, None) for an edge, taken when ``check(s, arg)`` holds (no check:
#: always); (pick, -1, "", effect, fan) for a fan-out whose guard picks its target,
#: taken to ``dests[j]`` when the fan has an edge to ``j = pick(s)``.
Candidate = tuple[Callable[..., Any] | None, int, str, Callable[..., Action], Fan | None]
#: (state, trigger) -> (observers, candidates, whether the trigger releases a reservation)
Compiled = dict[tuple[str, str], tuple[tuple[Observer, ...], tuple[Candidate, ...], bool]]


def _fan(fan: FanOut) -> Fan:
    """A fan-out as its membership test and destinations: no `Transition` is built per
    call (`FanOut.edge`), and over a range the test is C (`range.__contains__`)."""
    among = fan.among
    covers = among[fan.lo : fan.hi].__contains__ if isinstance(among, range) else fan.covers
    return covers, fan.dests


def _candidates(t: Transition | FanOut) -> list[Candidate]:
    if isinstance(t, FanOut):
        pick = pick_of(t.guard)
        if pick is not None:  # one candidate for the whole fan-out: ask the pick once
            return [(pick, -1, "", t.effect.run, _fan(t))]
        return [c for e in t.edges() for c in _candidates(e)]
    return [(t.guard.check if t.guard else None, t.arg, t.dest, t.effect.run, None)]


def compile_table(decl: Declaration) -> Compiled:
    """The declaration as a lookup table: (state, trigger) -> the trigger's observations
    and the ordered candidates, as bare functions (the hot path saves the attribute
    lookups: the core bench's faulty turn is about 10% faster for it). A fan-out whose
    guard picks its target is one candidate: the table stays linear in the chain. The
    `SETTLE` observation is a flag of the entry, which `Turn._fire` runs only while a
    reservation is held (no call per outcome where no reply spoke of rate limits), and
    only where the declaration has it (a declaration without it leaks, and is caught)."""
    groups: dict[tuple[str, str], list[Candidate]] = {}
    for t in decl.transitions:
        groups.setdefault((t.source, t.trigger), []).extend(_candidates(t))
    return {
        (source, trigger): (
            tuple(ob.apply for ob in decl.observes.get(trigger, _NOTHING) if ob is not SETTLE),
            tuple(group),
            SETTLE in decl.observes.get(trigger, _NOTHING),
        )
        for (source, trigger), group in groups.items()
    }


def _compiled(decl: Declaration) -> Compiled:
    memo = decl.policy.memo
    if memo.get("declaration") is not decl:
        return compile_table(decl)
    found = memo.get("compiled")
    if found is None:
        found = memo["compiled"] = compile_table(decl)
    return found  # type: ignore[return-value]


class TurnBase:
    """The host-facing protocol shared by both executors."""

    # slotted: a turn is built per call, and a dict per turn is a block to allocate and free
    __slots__ = ("__weakref__", "s")
    s: TurnState

    def __init__(
        self,
        policy: Policy,
        *,
        health: HealthStore | None = None,
        clock: Callable[[], float] | None = None,
        random: Callable[[], float] | None = None,
        on_transition: Hook | None = None,
        declaration: Declaration | None = None,
        guards: Mapping[Guard, Guard] | None = None,
        effects: Mapping[Effect, Effect] | None = None,
        first: int = 0,
    ) -> None:
        """`health` defaults to the process-wide `fsm.health.store.DEFAULT` (shared by every
        turn given no store); `clock` (seconds, e.g. a `fsm.Clock`'s ``now``) to the
        `fsm.clock.default_clock()` in force when the turn is built. `declaration`, `guards`
        and `effects` replace the policy's own machine or some of its objects: the model
        checker uses them to prove it catches broken machines. `first` starts the turn's
        chain at that entry (the earlier ones are not used, e.g. a call naming a model)."""
        if not isinstance(policy, Policy):
            raise TypeError(
                "policy must be a fallgate Policy (Policy.from_toml(path), "
                f"Policy.from_dict(data)), got {type(policy).__name__}"
            )
        n = len(policy.targets)
        if not (isinstance(first, int) and 0 <= first < n):
            raise ValueError(f"first must be a chain position 0..{n - 1}, got {first!r}")
        decl = declaration if declaration is not None else declare(policy)
        if guards or effects:
            decl = decl.replacing(guards, effects)
        self.s = TurnState(
            policy,
            health if health is not None else HealthStore.default(),
            clock if clock is not None else _clock.default_clock().now,
            random or _random.random,
            _observing(on_transition) if on_transition is not None else None,
            decl,
            first,
        )
        self._ready()

    def _ready(self) -> None:
        """The executor's own setup, once the turn state exists."""

    def _fire(self, trigger: str, outcome: Outcome | None) -> Action:
        raise NotImplementedError

    # The protocol: start, then feed back what each action produced.
    def start(self) -> Action:
        return self._fire(START, None)

    def feed(self, outcome: Outcome) -> Action:
        """Feed the outcome of the last `Attempt`."""
        try:
            kind = outcome.kind  # a StrEnum: hashes like its value
        except AttributeError:
            raise TypeError(
                "feed takes the attempt's Outcome (Outcome.success(value), "
                f"Outcome(OutcomeKind.TRANSPORT), ...), got {type(outcome).__name__}"
            ) from None
        return self._fire(kind, outcome)

    def waited(self) -> Action:
        return self._fire(WAITED, None)

    def rebuilt(self, ok: bool = True) -> Action:
        return self._fire(REBUILT if ok else REBUILD_FAILED, None)

    def deny(self, why: str) -> Action:
        """The health store refused the pending `Attempt` (`HealthStore.grant`): it was not
        made. The turn moves on as if its target were not eligible."""
        s = self.s
        a = s.action
        s.denial = why
        if type(a) is Attempt:
            s.visit.refused += 1  # not sent: the failure's words do not count it
        if a is not None and not getattr(a, "retry", False):
            s.outcome = None  # a refused first attempt or probe: nothing was learnt here
        return self._fire(DENIED, None)

    def cancel(self) -> Action:
        """End the turn in `aborted` (from any non-terminal state)."""
        if self.done:
            assert self.s.action is not None
            return self.s.action
        return self._fire(CANCELLED, CANCELLED_OUTCOME)

    def fire(self, trigger: str, outcome: Outcome | None = None) -> Action:
        """Feed any declared trigger by name (used by the checker and tests)."""
        if trigger == DENIED:
            return self.deny(self.s.denial or "refused by the health store")
        return self._fire(trigger, outcome)

    @property
    def state(self) -> str:
        return self.s.state

    @property
    def done(self) -> bool:
        return self.s.state in TERMINALS

    @property
    def trace(self) -> list[TraceEvent]:
        return self.s.trace

    @property
    def attempts(self) -> int:
        return self.s.total_attempts

    def _undeclared(self, trigger: str) -> ProtocolError:
        return ProtocolError(
            f"event {trigger!r} is not declared in state {self.s.state!r} "
            f"(after {type(self.s.action).__name__ if self.s.action else 'nothing'})"
        )


class Turn(TurnBase):
    """One turn on the compiled table (the default executor)."""

    __slots__ = ("_table",)
    _table: Compiled

    def _ready(self) -> None:
        self._table = _compiled(self.s.decl)

    def _fire(self, trigger: str, outcome: Outcome | None) -> Action:
        s = self.s
        entry = self._table.get((s.state, trigger))
        if entry is None:
            raise self._undeclared(trigger)
        observers, candidates, settles = entry
        # `observe`, inlined with the compiled observers (hot path)
        s._next = s._ready_first = UNSET
        s.at = s.clock()
        if outcome is not None:
            s.outcome = outcome
            if settles and s.reserved is not None:  # `SETTLE`, when declared
                settle(s)
            for ob in observers:
                ob(s, outcome)
        source = s.state
        for check, arg, dest, run, fan in candidates:
            if fan is None:
                if check is None or check(s, arg):
                    return take(s, source, dest, arg, trigger, run)
            else:
                j = check(s)  # type: ignore[misc]
                covers, dests = fan
                if covers(j):
                    return take(s, source, dests[j], j, trigger, run)
        raise AssertionError("unreachable: every group ends with an unguarded transition")


class TransitionsTurn(TurnBase):
    """One turn on a real `transitions.Machine` (built once per declaration, shared)."""

    def _ready(self) -> None:
        self._machine, self._lock = _transitions_machine(self.s.decl)
        self._model = TransitionsModel(self.s)
        with self._lock:
            self._machine.add_model(self._model, initial=IDLE)

    def _fire(self, trigger: str, outcome: Outcome | None) -> Action:
        from transitions import MachineError

        before = self.s.seq
        try:
            self._model.trigger(trigger, outcome=outcome)
        except (MachineError, AttributeError):
            raise self._undeclared(trigger) from None
        if self.s.seq == before:  # pragma: no cover - the last candidate has no guard
            raise AssertionError("no transition taken")
        assert self.s.action is not None
        if self.done:
            self.close()
        return self.s.action

    def close(self) -> None:
        with self._lock:
            if self._model in self._machine.models:
                self._machine.remove_model(self._model)


class TransitionsModel:
    """The object `transitions` drives; it wraps the turn state."""

    trigger: Callable[..., bool]  # added by transitions.Machine.add_model

    def __init__(self, s: TurnState) -> None:
        self.s = s
        self.state = IDLE


def _transitions_machine(decl: Declaration) -> tuple[Any, threading.Lock]:
    """Built once for the policy's own declaration; a swapped one (the checker's broken
    machines) gets its own, uncached."""
    memo = decl.policy.memo
    own = memo.get("declaration") is decl
    found = memo.get("transitions") if own else None
    if found is not None:
        return found  # type: ignore[return-value]
    from transitions import Machine

    def prepare(ev: Any) -> None:
        observe(ev.model.s, ev.event.name, ev.kwargs.get("outcome"))

    def guard_cb(g: Guard, arg: int) -> Callable[[Any], bool]:
        return lambda ev: g.check(ev.model.s, arg)

    def after_cb(t: Transition) -> Callable[[Any], None]:
        return lambda ev: _after(ev, t)

    def _after(ev: Any, t: Transition) -> None:
        apply(ev.model.s, t, ev.event.name)

    specs = []
    for t in decl.edges():
        spec: dict[str, Any] = {
            "trigger": t.trigger,
            "source": t.source,
            "dest": t.dest,
            "after": [after_cb(t)],
        }
        if t.guard is not None:
            spec["conditions"] = [guard_cb(t.guard, t.arg)]
        specs.append(spec)
    machine = Machine(
        model=[],
        states=[st.name for st in decl.states],
        transitions=specs,
        initial=IDLE,
        auto_transitions=False,
        send_event=True,
        prepare_event=[prepare],
        ignore_invalid_triggers=False,
    )
    built = (machine, threading.Lock())
    if own:
        memo["transitions"] = built
    return built


__all__ = [
    "DONE",
    "FAILED",
    "Hook",
    "ProtocolError",
    "TransitionsTurn",
    "Turn",
    "TurnState",
    "apply",
    "compile_table",
    "observe",
]
