"""Thin drivers: carry out the core's actions with real I/O on a `Clock`.

`run` (sync) and `arun` (asyncio) have the same semantics and share the core
and the host loop (`fsm.host`; `ahost_run` for asyncio): attempt -> classify ->
feed; wait -> sleep on the clock -> waited; rebuild -> rebuilt. Cancellation (asyncio) and
KeyboardInterrupt end the turn in `aborted` and are re-raised. Without
``clock=`` a turn runs on `fsm.clock.default_clock()`: the system clock, or
the virtual clock of an active `instant_waits()` block.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs

from .actions import Action, Attempt, Fail, Finish
from .classify import classify_exception
from .clock import Clock, default_clock, steady
from .health import HealthStore
from .host import ahost_run, host_loop
from .otel import Telemetry
from .outcomes import Outcome, OutcomeKind
from .policy import Credential, Policy, Target
from .redact import redact
from .trace import TraceEvent
from .turn import Hook, Turn, TurnState, _TurnBase

logger = logging.getLogger("fallgate")
T = TypeVar("T")
Classifier = Callable[[BaseException], Outcome]
_SUCCESS = OutcomeKind.SUCCESS


@attrs.frozen(slots=True)
class TurnResult:
    """A turn that ended in `done`: the value, and the path it took (`trace`)."""

    value: Any = attrs.field(repr=False)
    state: str
    target: str
    model: str
    attempts: int
    _turn: TurnState = attrs.field(repr=False, eq=False, alias="turn")

    @property
    def trace(self) -> tuple[TraceEvent, ...]:
        """One `TraceEvent` per transition (built when first read)."""
        return tuple(self._turn.trace)


def _hook(user: Hook | None) -> Hook | None:
    if user is None and not logger.isEnabledFor(logging.DEBUG):
        return None

    def emit(ev: TraceEvent) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "%s --%s--> %s (%s)",
                ev.source,
                ev.event,
                ev.dest,
                ev.action,
                extra={"fallgate": ev.as_dict()},
            )
        if user is not None:
            user(ev)

    return emit


def check_health(health: object) -> None:
    """Refuse a `health=` that is not a `HealthStore` at once, naming it (a store's URL
    given as a string would otherwise fail inside the first turn)."""
    if health is not None and not isinstance(health, HealthStore):
        raise TypeError(
            "health must be a fallgate.fsm.health.HealthStore (HealthStore(), "
            "fallgate.SQLiteHealthStore(path), fallgate.RedisHealthStore(url)) or None, "
            f"got {type(health).__name__}"
        )


class _Step:
    """What every driver needs besides the loop: the turn (on the given clock),
    classified and scrubbed outcomes, and the end as a result or an exception."""

    __slots__ = ("_secrets", "classify", "clock", "policy", "turn")

    def __init__(
        self,
        policy: Policy,
        classify: Classifier,
        health: HealthStore | None,
        on_transition: Hook | None,
        clock: Clock | None,
        random: Callable[[], float] | None,
        engine: type[_TurnBase],
        first: int = 0,
    ) -> None:
        check_health(health)
        if random is not None and not callable(random):
            raise TypeError(
                f"random must be a callable returning floats in [0, 1) such as "
                f"random.Random(7).random, got {type(random).__name__}"
            )
        self.policy = policy
        self.classify = classify
        #: The clock of this turn: the one given, else the default in force now.
        if clock is not None and not callable(getattr(clock, "now", None)):
            raise TypeError(
                "clock must be an fsm.Clock (now, sleep, asleep) such as fsm.VirtualClock(), "
                f"got {type(clock).__name__}"
            )
        #: Time never runs backwards for the engine (`fsm.clock.steady`).
        self.clock: Clock = steady(clock) if clock is not None else default_clock()
        now = self.clock.now
        self.turn = engine(
            policy,
            health=health,
            clock=now,
            random=random,
            on_transition=_hook(on_transition),
            first=first,
        )
        self._secrets: list[str] | None = None

    def outcome_of(self, e: BaseException) -> Outcome:
        try:
            o = self.classify(e)
        except Exception as ce:  # a broken classifier must not crash the engine
            o = Outcome(
                OutcomeKind.BAD_REQUEST, detail=f"classifier raised {type(ce).__name__}", error=e
            )
        if not isinstance(o, Outcome):
            o = Outcome(
                OutcomeKind.BAD_REQUEST,
                detail=f"classifier returned {type(o).__name__}, not Outcome",
                error=e,
            )
        if o.detail:
            if self._secrets is None:
                self._secrets = self.policy.secrets()
            clean = redact(o.detail, self._secrets)
            if clean != o.detail:
                o = attrs.evolve(o, detail=clean)
        return o

    def end(self, action: Action) -> TurnResult:
        """The result of a finished turn; a failed one raises its `TurnFailed`."""
        if type(action) is Finish:
            return self.result(action)
        assert isinstance(action, Fail)
        raise action.error from None

    def result(self, action: Finish) -> TurnResult:
        s = self.turn.s
        t = s.target
        return TurnResult(action.result, s.state, t.name, t.model, s.total_attempts, s)


def run(
    policy: Policy,
    call: Callable[[Target, Credential], T],
    *,
    rebuild: Callable[[Target], object] | None = None,
    classify: Classifier = classify_exception,
    health: HealthStore | None = None,
    on_transition: Hook | None = None,
    clock: Clock | None = None,
    random: Callable[[], float] | None = None,
    engine: type[_TurnBase] = Turn,
    first: int = 0,
    telemetry: Telemetry | None = None,
) -> TurnResult:
    """Run one turn synchronously; returns a `TurnResult` or raises `TurnFailed`.

    `call(target, credential)` makes one attempt (resolve the key with
    `credential.resolve(target.name)`); its exceptions are classified.
    `rebuild(target)` recreates the target's client after transport faults.
    `health` defaults to the process-wide `fsm.health.DEFAULT`, shared by
    every turn given no store. Waits sleep on `clock` (default: the system
    clock, or the virtual one inside `instant_waits()`); pass a
    `fsm.VirtualClock` to run on virtual time. `first` starts the chain at that
    entry (earlier entries are not used in this turn). `telemetry` names the turn's
    GenAI operation for OpenTelemetry (`fsm.otel.Telemetry`; used while it is on).
    """
    return drive(
        policy,
        lambda a: call(a.target, a.credential),
        rebuild=rebuild,
        classify=classify,
        health=health,
        on_transition=on_transition,
        clock=clock,
        random=random,
        engine=engine,
        first=first,
        telemetry=telemetry,
    )


def drive(
    policy: Policy,
    attempt: Callable[[Attempt], Any],
    *,
    rebuild: Callable[[Target], object] | None = None,
    classify: Classifier = classify_exception,
    health: HealthStore | None = None,
    on_transition: Hook | None = None,
    clock: Clock | None = None,
    random: Callable[[], float] | None = None,
    engine: type[_TurnBase] = Turn,
    first: int = 0,
    telemetry: Telemetry | None = None,
) -> TurnResult:
    """Like `run`, but `attempt` receives the whole `Attempt` (timeout, number)."""
    st = _Step(policy, classify, health, on_transition, clock, random, engine, first)

    def outcome(a: Attempt) -> Outcome:
        try:
            value = attempt(a)
        except Exception as e:
            return st.outcome_of(e)
        return Outcome(_SUCCESS, value=value)

    steps = host_loop(
        st.turn, clock=st.clock, rebuild=rebuild, attempt=outcome, telemetry=telemetry
    )
    return st.end(next(steps))


async def arun(
    policy: Policy,
    call: Callable[[Target, Credential], Awaitable[T]],
    *,
    rebuild: Callable[[Target], Awaitable[object]] | None = None,
    classify: Classifier = classify_exception,
    health: HealthStore | None = None,
    on_transition: Hook | None = None,
    clock: Clock | None = None,
    random: Callable[[], float] | None = None,
    engine: type[_TurnBase] = Turn,
    first: int = 0,
    telemetry: Telemetry | None = None,
) -> TurnResult:
    """The asyncio driver: same semantics as `run` (waits ``await clock.asleep``);
    cancellation ends the turn `aborted`."""
    return await adrive(
        policy,
        lambda a: call(a.target, a.credential),
        rebuild=rebuild,
        classify=classify,
        health=health,
        on_transition=on_transition,
        clock=clock,
        random=random,
        engine=engine,
        first=first,
        telemetry=telemetry,
    )


async def adrive(
    policy: Policy,
    attempt: Callable[[Attempt], Awaitable[Any]],
    *,
    rebuild: Callable[[Target], Awaitable[object]] | None = None,
    classify: Classifier = classify_exception,
    health: HealthStore | None = None,
    on_transition: Hook | None = None,
    clock: Clock | None = None,
    random: Callable[[], float] | None = None,
    engine: type[_TurnBase] = Turn,
    first: int = 0,
    telemetry: Telemetry | None = None,
) -> TurnResult:
    """Like `arun`, but `attempt` receives the whole `Attempt`."""
    st = _Step(policy, classify, health, on_transition, clock, random, engine, first)

    async def outcome(a: Attempt) -> Outcome:
        try:
            value = await attempt(a)
        except Exception as e:
            return st.outcome_of(e)
        return Outcome(_SUCCESS, value=value)

    end = await ahost_run(
        st.turn, clock=st.clock, rebuild=rebuild, attempt=outcome, telemetry=telemetry
    )
    return st.end(end)
