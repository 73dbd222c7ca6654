"""Thin drivers: carry out the core's actions with real I/O and real sleeps.

`run` (sync) and `arun` (asyncio) have the same semantics and share the core:
attempt -> classify -> feed; wait -> sleep -> waited; rebuild -> rebuilt.
Cancellation (asyncio) and KeyboardInterrupt end the turn in `aborted` and are
re-raised; with `instant_waits()` on, sleeps advance the virtual clock instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs

from . import clock as _clock
from .actions import Action, Attempt, Fail, Finish, Rebuild, Wait
from .classify import classify_exception
from .health import HealthStore
from .outcomes import Outcome, OutcomeKind
from .policy import Credential, Policy, Target
from .redact import redact
from .trace import TraceEvent
from .turn import Hook, Turn, TurnState, _TurnBase

logger = logging.getLogger("fallgate")
T = TypeVar("T")
Classifier = Callable[[BaseException], Outcome]


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


class _Step:
    """Shared bookkeeping of both drivers: build the turn, scrub outcomes, finish."""

    def __init__(
        self,
        policy: Policy,
        classify: Classifier,
        health: HealthStore | None,
        on_transition: Hook | None,
        clock: Callable[[], float] | None,
        random: Callable[[], float] | None,
        engine: type[_TurnBase],
    ) -> None:
        self.policy = policy
        self.classify = classify
        self.turn = engine(
            policy, health=health, clock=clock, random=random, on_transition=_hook(on_transition)
        )
        self.virtual = clock is None
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

    def instant(self, seconds: float) -> bool:
        if not _clock.is_instant():
            return False
        if self.virtual:
            _clock.advance(seconds)
        return True

    def answered(self, value: Any) -> Action:
        return self.turn.feed(Outcome(OutcomeKind.SUCCESS, value=value))

    def raised(self, e: BaseException) -> Action:
        return self.turn.feed(self.outcome_of(e))

    def must_sleep(self, wait: Wait) -> bool:
        """False when the wait is instant (testing switch) or zero."""
        return not self.instant(wait.seconds) and wait.seconds > 0

    def end(self, action: Action) -> TurnResult:
        """The result of a finished turn; a failed one raises its `TurnFailed`."""
        if isinstance(action, Finish):
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
    clock: Callable[[], float] | None = None,
    random: Callable[[], float] | None = None,
    sleep: Callable[[float], object] = time.sleep,
    engine: type[_TurnBase] = Turn,
) -> TurnResult:
    """Run one turn synchronously; returns a `TurnResult` or raises `TurnFailed`.

    `call(target, credential)` makes one attempt (resolve the key with
    `credential.resolve(target.name)`); its exceptions are classified.
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
        sleep=sleep,
        engine=engine,
    )


def drive(
    policy: Policy,
    attempt: Callable[[Attempt], Any],
    *,
    rebuild: Callable[[Target], object] | None = None,
    classify: Classifier = classify_exception,
    health: HealthStore | None = None,
    on_transition: Hook | None = None,
    clock: Callable[[], float] | None = None,
    random: Callable[[], float] | None = None,
    sleep: Callable[[float], object] = time.sleep,
    engine: type[_TurnBase] = Turn,
) -> TurnResult:
    """Like `run`, but `attempt` receives the whole `Attempt` (timeout, number)."""
    st = _Step(policy, classify, health, on_transition, clock, random, engine)
    turn = st.turn
    action: Action = turn.start()
    try:
        while True:
            if isinstance(action, Attempt):
                try:
                    value = attempt(action)
                except Exception as e:
                    action = st.raised(e)
                else:
                    action = st.answered(value)
            elif isinstance(action, Wait):
                if st.must_sleep(action):
                    sleep(action.seconds)
                action = turn.waited()
            elif isinstance(action, Rebuild):
                try:
                    if rebuild is not None:
                        rebuild(action.target)
                except Exception:
                    action = turn.rebuilt(False)
                else:
                    action = turn.rebuilt(True)
            else:
                return st.end(action)
    except KeyboardInterrupt:
        turn.cancel()
        raise


async def arun(
    policy: Policy,
    call: Callable[[Target, Credential], Awaitable[T]],
    *,
    rebuild: Callable[[Target], Awaitable[object]] | None = None,
    classify: Classifier = classify_exception,
    health: HealthStore | None = None,
    on_transition: Hook | None = None,
    clock: Callable[[], float] | None = None,
    random: Callable[[], float] | None = None,
    engine: type[_TurnBase] = Turn,
) -> TurnResult:
    """The asyncio driver: same semantics as `run`; cancellation ends the turn `aborted`."""
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
    )


async def adrive(
    policy: Policy,
    attempt: Callable[[Attempt], Awaitable[Any]],
    *,
    rebuild: Callable[[Target], Awaitable[object]] | None = None,
    classify: Classifier = classify_exception,
    health: HealthStore | None = None,
    on_transition: Hook | None = None,
    clock: Callable[[], float] | None = None,
    random: Callable[[], float] | None = None,
    engine: type[_TurnBase] = Turn,
) -> TurnResult:
    """Like `arun`, but `attempt` receives the whole `Attempt`."""
    st = _Step(policy, classify, health, on_transition, clock, random, engine)
    turn = st.turn
    action: Action = turn.start()
    try:
        while True:
            if isinstance(action, Attempt):
                try:
                    value = await attempt(action)
                except Exception as e:
                    action = st.raised(e)
                else:
                    action = st.answered(value)
            elif isinstance(action, Wait):
                if st.must_sleep(action):
                    await asyncio.sleep(action.seconds)
                action = turn.waited()
            elif isinstance(action, Rebuild):
                try:
                    if rebuild is not None:
                        await rebuild(action.target)
                except Exception:
                    action = turn.rebuilt(False)
                else:
                    action = turn.rebuilt(True)
            else:
                return st.end(action)
    except (asyncio.CancelledError, KeyboardInterrupt):
        turn.cancel()
        raise
