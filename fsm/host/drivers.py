"""Thin drivers: carry out the core's actions with real I/O on a `Clock`.

`run` (sync) and `arun` (asyncio) have the same semantics and share the core
and the host loop (`fsm.host.loop`; `ahost_run` for asyncio): attempt -> classify ->
feed; wait -> sleep on the clock -> waited; rebuild -> rebuilt. Cancellation (asyncio) and
KeyboardInterrupt end the turn in `aborted` and are re-raised. Without
``clock=`` a turn runs on `fsm.clock.default_clock()`: the system clock, or
the virtual clock of an active `instant_waits()` block.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypedDict, TypeVar, Unpack

import attrs

from ..catalogue.classify import classify_exception
from ..clock import Clock, default_clock, steady
from ..core.actions import Action, Attempt, Fail, Finish
from ..core.members import release, route, settle
from ..core.turn import Hook, Turn, TurnBase, TurnState
from ..errors import TurnFailed
from ..health.store import HealthStore
from ..kinds import Outcome, OutcomeKind
from ..policy.model import Credential, Policy, Target
from ..redact import redact
from ..trace import TraceEvent
from .loop import ahost_run, host_loop
from .notices import notice
from .observe import Telemetry

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
            "health must be a fallgate.HealthStore (HealthStore(), "
            "fallgate.SQLiteHealthStore(path), fallgate.RedisHealthStore(url)) or None, "
            f"got {type(health).__name__}"
        )


def check_policy(policy: object, who: str) -> None:
    """A TypeError naming what `who` was given instead of a `Policy`."""
    if not isinstance(policy, Policy):
        raise TypeError(
            f"{who}: policy must be a fallgate Policy (Policy.from_toml(path), "
            f"Policy.from_dict(data)), got {type(policy).__name__}"
        )


def _check(driver: str, policy: Policy, options: _Options) -> None:
    """A driver's keywords checked, as a signature would (TypeError naming `driver`)."""
    if not _NAMES.issuperset(options):
        name = min(set(options) - _NAMES)
        raise TypeError(
            f"{driver}: unexpected keyword argument {name!r} "
            f"(it takes: {', '.join(sorted(_NAMES))})"
        )
    check_policy(policy, driver)
    check_health(options.get("health"))
    random = options.get("random")
    if random is not None and not callable(random):
        raise TypeError(
            f"random must be a callable returning floats in [0, 1) such as "
            f"random.Random(7).random, got {type(random).__name__}"
        )
    affinity = options.get("affinity")
    if affinity is not None and not (isinstance(affinity, str) and affinity):
        raise TypeError(f"affinity must be a non-empty string or None, got {affinity!r}")
    engine = options.get("engine")
    if engine is not None and not callable(engine):
        raise TypeError(
            "engine must be an executor class such as fsm.Turn or fsm.TransitionsTurn, "
            f"got {type(engine).__name__}"
        )
    clock = options.get("clock")
    if clock is not None and not callable(getattr(clock, "now", None)):
        raise TypeError(
            "clock must be an fsm.Clock (now, sleep, asleep) such as fsm.VirtualClock(), "
            f"got {type(clock).__name__}"
        )


class DriverStep:
    """What every driver needs besides the loop: the turn (on the given clock),
    classified and scrubbed outcomes, and the end as a result or an exception."""

    __slots__ = ("_secrets", "classify", "clock", "policy", "routed", "turn")

    def __init__(
        self, driver: str, policy: Policy, options: _Options, checked: bool = False
    ) -> None:
        """The turn of one `driver`'s call (named in errors): its keywords checked, as a
        signature would (unless the host `checked` them itself), and applied."""
        if not checked:
            _check(driver, policy, options)
        health = options.get("health")
        clock = options.get("clock")
        self.classify = options.get("classify", classify_exception)
        #: The clock of this turn: the one given, else the default in force now.
        #: Time never runs backwards for the engine (`fsm.clock.steady`).
        self.clock: Clock = steady(clock) if clock is not None else default_clock()
        now = self.clock.now
        first = options.get("first", 0)
        affinity = options.get("affinity")
        #: The turn's chain: each group's members, and a conversation's key, in the order
        #: to try them now (`fsm.core.members`; the policy itself when there is no choice).
        cost = options.get("cost", 0.0) if policy.pacing else None
        store = health if health is not None else HealthStore.default()
        self.routed = route(policy, store, affinity, now(), first, cost)
        self.policy = policy = self.routed.policy
        self.turn = options.get("engine", Turn)(
            policy,
            health=health,
            clock=now,
            random=options.get("random"),
            on_transition=_hook(options.get("on_transition")),
            first=first,
        )
        self.turn.s.cost = cost
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
        s = self.turn.s
        release(self.routed)
        notice(s, self.policy, s.health, "failed")
        raise action.error from None

    def result(self, action: Finish) -> TurnResult:
        s = self.turn.s
        if self.routed.routes is not None:
            c = s.visit.credential
            cred = c.health_id if c is not None else ""
            settle(self.routed, s.target, cred, s.at - s.attempt_started, s.at)
        notice(s, self.policy, s.health, "done")
        t = s.target
        return TurnResult(action.result, s.state, t.name, t.model, s.total_attempts, s)


class _Options(TypedDict, total=False):
    """The keywords every driver takes, written once for the four of them (`run`, `drive`,
    `arun`, `adrive`); each is optional, its default in the comment."""

    #: Outcome of an attempt's exception (default `fsm.catalogue.classify.classify_exception`).
    classify: Classifier
    #: Cooldowns that outlive the turn (default: the process-wide `fsm.health.store.DEFAULT`).
    health: HealthStore | None
    #: Called with each `TraceEvent` (default None; DEBUG logging adds one).
    on_transition: Hook | None
    #: What waits sleep on (default: the system clock, or the virtual one of `instant_waits()`).
    clock: Clock | None
    #: Jitter's source of floats in [0, 1) (default: `random.random`).
    random: Callable[[], float] | None
    #: The turn class (default `fsm.Turn`).
    engine: type[TurnBase]
    #: The chain entry the turn starts at (default 0; earlier entries are not used).
    first: int
    #: The tokens one attempt is expected to use, for pacing (default 0: the request only).
    cost: float
    #: The turn's GenAI operation for OpenTelemetry, used while it is on (default None).
    telemetry: Telemetry | None
    #: The conversation this turn belongs to (default None): while the member and key
    #: that last answered it are free, they serve it again (`fsm.core.members`).
    affinity: str | None


class Options(_Options, total=False):
    """`run` / `drive`'s keywords: `_Options` and a sync `rebuild`."""

    #: Recreates the target's client after transport faults (default: none to recreate).
    rebuild: Callable[[Target], object] | None


class AsyncOptions(_Options, total=False):
    """`arun` / `adrive`'s keywords: `_Options` and an awaited `rebuild`."""

    rebuild: Callable[[Target], Awaitable[object]] | None


#: Every driver keyword (the async flavour's are the same names).
_NAMES: Final = Options.__optional_keys__


class _NotAwaitable(TypeError):
    """`arun`'s call returned something that cannot be awaited (a plain function's)."""


def run(
    policy: Policy, call: Callable[[Target, Credential], T], **options: Unpack[Options]
) -> TurnResult:
    """Run one turn synchronously; returns a `TurnResult` or raises `TurnFailed`.

    `call(target, credential)` makes one attempt (resolve the key with
    `credential.resolve(target.name)`); its exceptions are classified.
    The keywords (`Options`, each optional): ``rebuild(target)`` recreates the
    target's client after transport faults; ``classify``; `health` defaults to the
    process-wide `fsm.health.store.DEFAULT`, shared by every turn given no store;
    waits sleep on ``clock`` (default: the system clock, or the virtual one inside
    `instant_waits()`; pass a `fsm.VirtualClock` to run on virtual time);
    ``on_transition``, ``random``, ``engine``; ``first`` starts the chain at that
    entry (earlier entries are not used in this turn); ``telemetry`` names the turn's
    GenAI operation for OpenTelemetry (`fsm.host.observe.Telemetry`; used while it is on).
    """
    if not callable(call):
        raise TypeError(
            "fsm.run: call must be a function call(target, credential) making one attempt, "
            f"got {type(call).__name__}"
        )
    if inspect.iscoroutinefunction(call):
        raise TypeError(
            "fsm.run: call is a coroutine function (async def): await fsm.arun(policy, call) "
            "instead (run would take the unawaited coroutine for an answer)"
        )
    return drive(policy, lambda a: call(a.target, a.credential), **options)


def drive(
    policy: Policy, attempt: Callable[[Attempt], Any], **options: Unpack[Options]
) -> TurnResult:
    """Like `run`, but `attempt` receives the whole `Attempt` (timeout, number)."""
    return drive_checked(policy, attempt, options, checked=False)


def drive_checked(
    policy: Policy, attempt: Callable[[Attempt], Any], options: Options, *, checked: bool = True
) -> TurnResult:
    """`drive` for a host that `checked` its `options` itself (the openai wrappers check
    their health store and clock once, when made, and a call's affinity as it comes): the
    same turn without the keyword checks of every call."""
    st = DriverStep("fsm.run / fsm.drive", policy, options, checked)

    def outcome(a: Attempt) -> Outcome:
        try:
            value = attempt(a)
        except Exception as e:
            return st.outcome_of(e)
        return Outcome(_SUCCESS, value=value)

    steps = host_loop(
        st.turn,
        clock=st.clock,
        rebuild=options.get("rebuild"),
        attempt=outcome,
        telemetry=options.get("telemetry"),
    )
    return st.end(next(steps))


async def arun(
    policy: Policy,
    call: Callable[[Target, Credential], Awaitable[T]],
    **options: Unpack[AsyncOptions],
) -> TurnResult:
    """The asyncio driver: same semantics and keywords as `run` (`AsyncOptions`: an
    awaited ``rebuild``; waits ``await clock.asleep``); cancellation ends the turn
    `aborted`."""
    if not callable(call):
        raise TypeError(
            "fsm.arun: call must be an async function call(target, credential) making one "
            f"attempt, got {type(call).__name__}"
        )
    if not inspect.iscoroutinefunction(call) and not inspect.iscoroutinefunction(
        getattr(call, "__call__", None)  # noqa: B004 - an object with an async __call__
    ):
        sync = call

        async def checked(a: Attempt) -> Any:
            got = sync(a.target, a.credential)
            if not inspect.isawaitable(got):
                raise _NotAwaitable(
                    "fsm.arun: call returned "
                    f"{type(got).__name__}, not an awaitable: give arun an async function "
                    "(or use fsm.run for a plain one)"
                )
            return await got

        try:
            return await adrive(policy, checked, **options)
        except TurnFailed as e:  # the caller's mistake, not the targets': say it as such
            last = e.last_outcome.error if e.last_outcome is not None else None
            if isinstance(last, _NotAwaitable):
                raise TypeError(str(last)) from None
            raise
    return await adrive(policy, lambda a: call(a.target, a.credential), **options)


async def adrive(
    policy: Policy, attempt: Callable[[Attempt], Awaitable[Any]], **options: Unpack[AsyncOptions]
) -> TurnResult:
    """Like `arun`, but `attempt` receives the whole `Attempt`."""
    st, outcome = _async_step(policy, attempt, options, checked=False)
    end = await ahost_run(
        st.turn,
        clock=st.clock,
        rebuild=options.get("rebuild"),
        attempt=outcome,
        telemetry=options.get("telemetry"),
    )
    return st.end(end)


async def adrive_checked(
    policy: Policy, attempt: Callable[[Attempt], Awaitable[Any]], options: AsyncOptions
) -> TurnResult:
    """The asyncio twin of `drive_checked` (not awaited by `adrive`: a coroutine between
    the caller and the SDK is resumed at every suspension of the request)."""
    st, outcome = _async_step(policy, attempt, options, checked=True)
    end = await ahost_run(
        st.turn,
        clock=st.clock,
        rebuild=options.get("rebuild"),
        attempt=outcome,
        telemetry=options.get("telemetry"),
    )
    return st.end(end)


def _async_step(
    policy: Policy,
    attempt: Callable[[Attempt], Awaitable[Any]],
    options: AsyncOptions,
    checked: bool,
) -> tuple[DriverStep, Callable[[Attempt], Awaitable[Outcome]]]:
    """The turn of an asyncio driver, and its attempt classified."""
    st = DriverStep("fsm.arun / fsm.adrive", policy, options, checked)

    async def outcome(a: Attempt) -> Outcome:
        try:
            value = await attempt(a)
        except Exception as e:
            return st.outcome_of(e)
        return Outcome(_SUCCESS, value=value)

    return st, outcome
