"""The meaning of the declaration's edges: guards, effects and observations as objects.

Each object carries its code *and* the words for it, so a diagram label and
the predicate it names cannot drift: a guard's label is formatted from the
policy fields its predicate reads (a test records what each predicate reads
and fails if the label does not name it). Observations are what `observe`
records before any guard, chosen per outcome kind from its traits.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from operator import methodcaller
from typing import TYPE_CHECKING, Final

import attrs

from .actions import Action, Fail, new_finish
from .backoff import backoff_delay
from .outcomes import CANCELLED as CANCELLED_OUTCOME
from .outcomes import Outcome, OutcomeKind
from .policy import Backoff, Policy, RetryBudget
from .traits import ABORTED, FAILED, TRAITS, BenchSpan, Level, Traits

if TYPE_CHECKING:
    from .state import TurnState

_SECONDS: Final = frozenset({"deadline", "retry_after_cap", "attempt_timeout"})


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


class _Words(dict[str, str]):
    """Renders `{field}` placeholders from a policy (and `{target}` from the edge)."""

    def __init__(self, policy: Policy, arg: int) -> None:
        super().__init__()
        self.policy = policy
        self.arg = arg

    def __missing__(self, name: str) -> str:
        if name == "target":
            return self.policy.targets[self.arg].name if self.arg >= 0 else "?"
        value = getattr(self.policy, name)
        if isinstance(value, Backoff):
            return f"backoff ≤{_num(value.cap)}s"
        if isinstance(value, RetryBudget):
            return f"a retry token (of {_num(value.size)})" if value.enabled else "(no budget)"
        if name in _SECONDS:
            return f"{_num(value)}s"
        return _num(value) if isinstance(value, int | float) else str(value)


def placeholders(text: str) -> frozenset[str]:
    """The `{names}` a template uses."""
    return frozenset(f for _, f, _, _ in string.Formatter().parse(text) if f)


@attrs.frozen(slots=True)
class Guard:
    """A pure predicate over the turn state; `arg` is the target index an edge is about."""

    name: str
    check: Callable[[TurnState, int], bool] = attrs.field(repr=False, eq=False)
    text: str  # `{policy_field}` / `{target}` placeholders: what the predicate reads

    def label(self, policy: Policy, arg: int = -1) -> str:
        return self.text.format_map(_Words(policy, arg))

    @property
    def reads(self) -> frozenset[str]:
        """The policy fields the label names (the predicate may read no others)."""
        return placeholders(self.text) - {"target"}


@attrs.frozen(slots=True)
class Effect:
    """What taking an edge does to the turn; returns the next action."""

    name: str
    run: Callable[[TurnState, int], Action] = attrs.field(repr=False, eq=False)
    text: str


@attrs.frozen(slots=True)
class Observation:
    """What an outcome records before any guard reads the state."""

    name: str
    apply: Callable[[TurnState, Outcome], None] = attrs.field(repr=False, eq=False)
    text: str


# -- observations ---------------------------------------------------------------------------------


def _count_fault(s: TurnState, o: Outcome) -> None:
    s.visit.streak += 1


def _reset_streak(s: TurnState, o: Outcome) -> None:
    s.visit.streak = 0


def _bench_key(s: TurnState, o: Outcome) -> None:
    v = s.visit
    cred = v.credential
    if v.index < 0 or cred is None:
        return
    policy = s.policy
    rule = policy.rules[o.kind]  # `policy.rule`, without the call (every rate limit)
    ra = o.retry_after
    if ra is not None:
        span = ra
    elif TRAITS[o.kind].bench_span is BenchSpan.BACKOFF:
        span = s.backoff_ceiling(v.attempts - 1)
    else:
        span = policy.cooldown.cap
    if not rule.retry:  # not retried: rotation never comes back to it in this turn
        v.spent.add(cred.id)
    now = s.at
    until = now + span
    nb = v.key_not_before
    held = nb.get(cred.id, 0.0)
    nb[cred.id] = held if held > until else until
    if rule.cooldown:
        s.health.cool_credential(v.target.key, cred.health_id, until, now, o.cause)


def _hold_target(s: TurnState, o: Outcome) -> None:
    if o.retry_after is not None and s.visit.index >= 0:
        v = s.visit
        v.not_before = max(v.not_before, s.at + o.retry_after)


def _keep_partial(s: TurnState, o: Outcome) -> None:
    s.partial = o.partial


def _raise_context_floor(s: TurnState, o: Outcome) -> None:
    if s.visit.index < 0:
        return
    known = s.target.context_length
    if known is not None:
        if s.context_floor is None:
            s.context_from = s.visit.index
        s.context_floor = max(s.context_floor or 0, known)


COUNT_FAULT: Final = Observation("count_fault", _count_fault, "transport streak + 1")
RESET_STREAK: Final = Observation("reset_streak", _reset_streak, "transport streak = 0")
BENCH_KEY: Final = Observation(
    "bench_key",
    _bench_key,
    "bench the key for Retry-After (else {span}); spend it unless retried; "
    "cross-turn cooldown if the rule says so",
)
HOLD_TARGET: Final = Observation(
    "hold_target", _hold_target, "no attempt on this target before its Retry-After"
)
KEEP_PARTIAL: Final = Observation("keep_partial", _keep_partial, "keep the partial output")
RAISE_CONTEXT_FLOOR: Final = Observation(
    "raise_context_floor",
    _raise_context_floor,
    "later targets need a context_length above this one's (unknown ones are tried last)",
)


def observations(t: Traits) -> tuple[Observation, ...]:
    """What `observe` records for an outcome of this kind (from its traits)."""
    if not t.fault:
        return ()
    out = [COUNT_FAULT if t.streak else RESET_STREAK]
    if t.level is Level.CREDENTIAL:
        out.append(BENCH_KEY)
    if t.not_before:
        out.append(HOLD_TARGET)
    if t.committed:
        out.append(KEEP_PARTIAL)
    if t.narrows_context:
        out.append(RAISE_CONTEXT_FLOOR)
    return tuple(out)


def observation_text(ob: Observation, t: Traits) -> str:
    span = t.bench_span.value if t.bench_span is not None else ""
    return ob.text.format(span=span)


# -- guards ---------------------------------------------------------------------------------------


def may_retry(s: TurnState) -> bool:
    """A retry on the current target is allowed by the fleet: it is not a half-open
    target's probe (a probe gets one attempt), and its retry budget has a token, or the
    retry needs none (a client-side fault: not the target's)."""
    v = s.visit
    return not v.probe and (
        s.client_side_fault() or s.health.retry_tokens(v.target.key, s.policy) >= 1.0
    )


def _transport_retry(s: TurnState, arg: int) -> bool:
    p = s.policy
    v = s.visit
    # the turn's own counts first: the store is asked only when they allow it; a
    # client-side fault (not the target's) is retried after a backoff, never recovered
    # from: the client works, rebuilding it would not help
    return (
        not v.recovered
        and (v.streak < p.transport_faults_before_recovery or s.client_side_fault())
        and v.attempts < p.max_attempts
        and may_retry(s)
        and s.fits_deadline(s.backoff_ceiling(v.streak - 1))
    )


def _can_recover(s: TurnState, arg: int) -> bool:
    return (
        not s.visit.recovered and not s.client_side_fault() and may_retry(s) and s.before_deadline()
    )


def _server_retry(s: TurnState, arg: int) -> bool:
    p = s.policy
    o = s.outcome
    v = s.visit
    ra = o.retry_after if o is not None else None
    if v.attempts >= p.max_attempts or (ra is not None and ra > p.retry_after_cap):
        return False
    if not may_retry(s):
        return False
    return s.fits_deadline(max(s.backoff_ceiling(v.attempts - 1), ra or 0.0))


def _stream_retry(s: TurnState, arg: int) -> bool:
    return s.visit.attempts < s.policy.max_attempts and may_retry(s) and s.before_deadline()


def _can_rotate(s: TurnState, arg: int) -> bool:
    v = s.visit
    cur = v.credential.id if v.credential is not None else None
    return (
        v.rotations < len(v.target.pool()) - 1
        and s.before_deadline()
        and s.free_credential(exclude=cur) is not None
    )


def _can_wait(s: TurnState, arg: int) -> bool:
    if s.visit.attempts >= s.policy.max_attempts or not may_retry(s):
        return False
    at, cred = s.earliest_free()
    if cred is None:
        return False
    wait = max(0.0, at - s.at)
    return wait <= s.policy.retry_after_cap and s.fits_deadline(wait)


def _in_time(s: TurnState, arg: int) -> bool:
    return s.before_deadline()


def _next_eligible(s: TurnState) -> int:
    return s.next_eligible()


def _next_is(s: TurnState, arg: int) -> bool:
    return _next_eligible(s) == arg


def _first_free(s: TurnState) -> int:
    """The first target not cooling at turn start (cached per event)."""
    if s._ready_first == -2:
        if s.health.quiet():
            s._ready_first = s.first
        else:
            now = s.at
            s._ready_first = next(
                (j for j in range(s.first, len(s.policy.targets)) if s.target_ready_at(j) <= now),
                -1,
            )
    return s._ready_first


def _first_is(s: TurnState, arg: int) -> bool:
    return _first_free(s) == arg


def _soonest_free(s: TurnState) -> int:
    """When every target is cooling: the one free soonest, if waiting for it is
    allowed (within the Retry-After cap and the deadline); else -1."""
    if _first_free(s) >= 0:
        return -1
    best, at = -1, float("inf")
    for j in range(s.first, len(s.policy.targets)):
        r = s.target_ready_at(j)
        if r < at:
            best, at = j, r
    wait = max(0.0, at - s.at)
    if wait > s.policy.retry_after_cap or not s.fits_deadline(wait):
        return -1
    return best


def _soonest_is(s: TurnState, arg: int) -> bool:
    return _soonest_free(s) == arg


_FLEET = "{retry_budget} left, not probing"
# A client-side fault: a transport fault while the target answered other attempts, or
# one that never reached the network (`Outcome.client_side`, `Traits.connection_level`).
TRANSPORT_RETRY: Final = Guard(
    "transport_retry",
    _transport_retry,
    "attempts < {max_attempts}, not recovered, {backoff} fits the {deadline} deadline, "
    "not probing; streak < {transport_faults_before_recovery} and {retry_budget} left, "
    "or a client-side fault",
)
CAN_RECOVER: Final = Guard(
    "can_recover",
    _can_recover,
    f"recovery not yet used, not a client-side fault, elapsed < {{deadline}}, {_FLEET}",
)
SERVER_RETRY: Final = Guard(
    "server_retry",
    _server_retry,
    "attempts < {max_attempts}, Retry-After ≤ {retry_after_cap}, "
    f"{{backoff}} fits the {{deadline}} deadline, {_FLEET}",
)
STREAM_RETRY: Final = Guard(
    "stream_retry",
    _stream_retry,
    f"attempts < {{max_attempts}}, elapsed < {{deadline}}, {_FLEET}",
)
CAN_ROTATE: Final = Guard(
    "can_rotate",
    _can_rotate,
    "another key free, rotations < keys-1, elapsed < {deadline}",
)
CAN_WAIT: Final = Guard(
    "can_wait",
    _can_wait,
    f"attempts < {{max_attempts}}, wait ≤ {{retry_after_cap}}, fits the {{deadline}} deadline, "
    f"{_FLEET}",
)
IN_TIME: Final = Guard("in_time", _in_time, "elapsed < {deadline}")
NEXT_IS: Final = Guard("next_is", _next_is, "next eligible = {target}, elapsed < {deadline}")
FIRST_IS: Final = Guard("first_is", _first_is, "first not cooling = {target}")
SOONEST_IS: Final = Guard(
    "soonest_is",
    _soonest_is,
    "all cooling; soonest free = {target}, wait ≤ {retry_after_cap}, fits the {deadline} deadline",
)

#: The guards that pick one target among many: each holds for exactly the target
#: index its pick returns (for none when the pick is -1). The machine declares one
#: edge per target for them (a `machine.FanOut`); an executor may ask the pick once
#: instead of trying every edge. Keyed by identity: a swapped-in guard (the checker's
#: broken machines) has no pick and is tried edge by edge.
PICKS: Final[tuple[tuple[Guard, Callable[[TurnState], int]], ...]] = (
    (NEXT_IS, methodcaller("next_eligible")),  # `_next_eligible` without its own frame
    (FIRST_IS, _first_free),
    (SOONEST_IS, _soonest_free),
)


def pick_of(guard: Guard) -> Callable[[TurnState], int] | None:
    """The pick of one of the selecting guards above (this very object), else None."""
    for g, pick in PICKS:
        if g is guard:
            return pick
    return None


GUARDS: Final = (
    TRANSPORT_RETRY,
    CAN_RECOVER,
    SERVER_RETRY,
    STREAM_RETRY,
    CAN_ROTATE,
    CAN_WAIT,
    IN_TIME,
    NEXT_IS,
    FIRST_IS,
    SOONEST_IS,
)


# -- effects --------------------------------------------------------------------------------------


def leave(s: TurnState) -> None:
    """Record why the current target is being left; bench it if the rule says so."""
    v = s.visit
    if v.index < 0:
        return
    o = s.outcome
    t = v.target
    s.reasons[t.name] = (v.attempts, o) if s.denial is None or o is not None else s.denial
    if (
        o is not None
        and TRAITS[o.kind].level is Level.TARGET
        and s.policy.rule(o.kind).cooldown
        and not s.client_side_fault()  # not the target's: it is not failing
    ):
        at_once = TRAITS[o.kind].opens_breaker
        r = s.health.failed(t.key, s.at, s.policy, o.retry_after, s.owner, at_once)
        until = r.get("until", 0.0)
        if until > s.at:  # type: ignore[operator]
            s.health.note_cause(t.key, o.cause, until)  # type: ignore[arg-type]
    if v.probe:  # whatever the probe showed is reported: the lease goes back
        s.health.released(t.key, s.owner, s.at)
    for j, why in s._skips.items():
        s.reasons.setdefault(s.policy.targets[j].name, why)


def _enter(s: TurnState, j: int) -> Action:
    now = s.at
    for k in range(s.first, j):
        s.reasons.setdefault(
            s.policy.targets[k].name, f"skipped at turn start: {s.cooling(k, now)}"
        )
    s.go_to(j)
    return s.attempt()


def _fall_back(s: TurnState, j: int) -> Action:
    s.next_eligible()  # make sure skip reasons are known
    leave(s)
    s.go_to(j)
    return s.attempt()


def _back_off(s: TurnState, arg: int) -> Action:
    """A jittered backoff counted from the fault: turns that failed together (one
    timeout ending a burst of them) retry apart. A Retry-After is honoured in full,
    and its end spread like a cooldown's (`TurnState.until`)."""
    o = s.outcome
    v = s.visit
    b = s.policy.backoff
    if o is not None and o.kind is OutcomeKind.TRANSPORT:
        return s.wait(backoff_delay(b, v.streak - 1, s.random), "transport backoff")
    w = backoff_delay(b, v.attempts - 1, s.random)
    held = v.not_before - s.at
    if held >= w:
        w = s.until(held)
    return s.wait(w, "server error backoff")


def _rebuild(s: TurnState, arg: int) -> Action:
    return s.rebuild()


def _recovered(s: TurnState, arg: int) -> Action:
    s.visit.recovered = True
    s.visit.streak = 0
    return s.attempt()


def _attempt(s: TurnState, arg: int) -> Action:
    return s.attempt()


def _rotate(s: TurnState, arg: int) -> Action:
    v = s.visit
    cur = v.credential.id if v.credential is not None else None
    v.rotations += 1
    return s.attempt(s.free_credential(exclude=cur))


def _wait_rate_limit(s: TurnState, arg: int) -> Action:
    at, cred = s.earliest_free()
    s.visit.credential = cred
    return s.wait(s.until(max(0.0, at - s.at)), "rate limited: honouring Retry-After")


def _wait_for_target(s: TurnState, j: int) -> Action:
    now = s.at
    for k in range(s.first, len(s.policy.targets)):
        if k != j:
            s.reasons.setdefault(s.policy.targets[k].name, f"{s.cooling(k, now)} at turn start")
    s.go_to(j)
    wait = s.until(max(0.0, s.target_ready_at(j) - s.at))
    return s.wait(wait, "every target cooling: waiting for it")


def _finish(s: TurnState, arg: int) -> Action:
    o = s.outcome
    v = s.visit
    if v.index >= 0 and v.credential is not None:
        s.health.succeeded(v.target.key, v.credential.health_id, s.policy, s.at)
    return new_finish(o.value if o is not None else None)


def _fail(s: TurnState, arg: int) -> Action:
    if s.visit.index < 0:
        s.outcome = None
        return Fail(s.failure("every target is cooling beyond the Retry-After cap", FAILED))
    s.next_eligible()
    leave(s)
    if s.denial is not None:
        return Fail(s.failure(f"{s.target.name} not attempted: {s.denial}", FAILED))
    summary = f"{s.target.name} ended with {s.describe(s.outcome)}{_no_retry(s)}"
    if not s.before_deadline():
        summary += f"; the {s.policy.deadline:g}s deadline had passed"
    return Fail(s.failure(summary, FAILED))


def _no_retry(s: TurnState) -> str:
    """Why a retryable outcome was not retried, when the fleet said no."""
    o = s.outcome
    v = s.visit
    if o is None or not s.policy.rule(o.kind).retry or v.target is None:
        return ""
    if v.probe:
        return f"; no retry: it was the probe of {v.target.name}'s half-open breaker"
    if not s.client_side_fault() and s.health.retry_tokens(v.target.key, s.policy) < 1.0:
        return f"; no retry: the retry budget of {v.target.name} is empty"
    return ""


def _late(s: TurnState, arg: int) -> Action:
    """A wait or a rebuild that ran past the deadline: fail without another attempt.
    Only words are recorded (the host's reply is no outcome: no cooldown from it)."""
    v = s.visit
    t = s.target
    deadline = f"{s.policy.deadline:g}s"
    s.next_eligible()
    if v.attempts:
        s.reasons[t.name] = (v.attempts, s.outcome)
    else:
        s.reasons[t.name] = f"not tried: the {deadline} deadline passed while waiting for it"
    for j, why in s._skips.items():
        s.reasons.setdefault(s.policy.targets[j].name, why)
    last = f" (last: {s.describe(s.outcome)})" if v.attempts else ""
    summary = f"the {deadline} deadline passed before {t.name} could be called{last}"
    return Fail(s.failure(summary, FAILED))


def _abort(s: TurnState, arg: int) -> Action:
    v = s.visit
    if v.probe and v.index >= 0:
        s.health.released(s.target.key, s.owner, s.at)
    if s.outcome is None or s.outcome.kind is not OutcomeKind.CANCELLED:
        s.outcome = CANCELLED_OUTCOME
    return Fail(s.failure("cancelled", ABORTED))


ENTER: Final = Effect("enter", _enter, "call {target}")
FALL_BACK: Final = Effect("fall_back", _fall_back, "leave; call {target}")
BACK_OFF: Final = Effect("back_off", _back_off, "wait a jittered backoff")
REBUILD: Final = Effect("rebuild", _rebuild, "rebuild the client")
RECOVERED: Final = Effect("recovered", _recovered, "call again (recovery used)")
ATTEMPT: Final = Effect("attempt", _attempt, "call again")
ROTATE: Final = Effect("rotate", _rotate, "call with the next key")
WAIT_RATE_LIMIT: Final = Effect(
    "wait_rate_limit", _wait_rate_limit, "wait for the soonest free key"
)
WAIT_FOR_TARGET: Final = Effect("wait_for_target", _wait_for_target, "wait for {target}")
FINISH: Final = Effect("finish", _finish, "answer")
FAIL: Final = Effect("fail", _fail, "fail with every target's reason")
LATE: Final = Effect("late", _late, "fail: the deadline passed")
ABORT: Final = Effect("abort", _abort, "abort")

EFFECTS: Final = (
    ENTER,
    FALL_BACK,
    BACK_OFF,
    REBUILD,
    RECOVERED,
    ATTEMPT,
    ROTATE,
    WAIT_RATE_LIMIT,
    WAIT_FOR_TARGET,
    FINISH,
    FAIL,
    LATE,
    ABORT,
)


__all__ = [
    "EFFECTS",
    "GUARDS",
    "PICKS",
    "Effect",
    "Guard",
    "Observation",
    "observations",
    "pick_of",
]
