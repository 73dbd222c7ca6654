"""The meaning of the declaration's edges: guards, effects and observations as objects.

Each object carries its code *and* the words for it, so a diagram label and
the predicate it names cannot drift: a guard's label is formatted from the
policy fields its predicate reads (a test records what each predicate reads
and fails if the label does not name it). Observations, what `observe` records
before any guard, are `fsm.core.observations`.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import methodcaller
from typing import TYPE_CHECKING, Final

from ..kinds import (
    ABORTED,
    CANCELLED_OUTCOME,
    OutcomeKind,
)
from ..policy.backoff import backoff_delay
from .actions import Action, Fail, new_finish
from .edges import Effect, Guard, Observation
from .leaving import FAIL, LATE, leave
from .pacing import PACE_WAIT
from .reserve import RESERVE_TEXT, keeps_reserve, longest_until, reserved
from .verdict import (
    VERDICT_WAITS,
    await_verdict,
    await_verdict_after,
    longest_verdict,
    patient,
    wait_verdict,
)

if TYPE_CHECKING:
    from .state import TurnState

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


def next_continuing(s: TurnState) -> int:
    """The first target after the current one that can continue a broken stream
    (`Target.continues`) and is eligible now (`TurnState.ineligible`: not cooling, not
    identical to one tried, time left); -1 when there is none."""
    targets = s.policy.targets
    now = s.at
    for j in range(s.visit.index + 1, len(targets)):
        if targets[j].continues and s.ineligible(j, now) is None:
            return j
    return -1


def _continue_here(s: TurnState, arg: int) -> bool:
    """Continue the broken stream on the target it broke on: the target takes an
    assistant prefix, is healthy now (no open span, no other turn's probe, a key free),
    attempts and a retry token are left, and time; and the stream is one a text prefix
    can carry (`TurnState.uncontinuable`: the host says at the break when it is not)."""
    v = s.visit
    return (
        v.target.continues
        and s.uncontinuable() is None
        and v.attempts < s.policy.max_attempts
        and may_retry(s)
        and s.target_ready_at(v.index) <= s.at
        and s.before_deadline()
    )


def _next_continues_is(s: TurnState, arg: int) -> bool:
    return next_continuing(s) == arg


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
    allowed (within the Retry-After cap and the deadline, and not a breaker in a long
    outage: `fsm.core.verdict.patient`); else -1."""
    if _first_free(s) >= 0:
        return -1
    best, at = -1, float("inf")
    targets = s.policy.targets
    for j in range(s.first, len(targets)):
        r = s.target_ready_at(j)
        if r < at and patient(s, targets[j].key):
            best, at = j, r
    wait = max(0.0, at - s.at)
    if best < 0 or wait > s.policy.retry_after_cap or not s.fits_deadline(wait):
        return -1
    return best


def _soonest_is(s: TurnState, arg: int) -> bool:
    return _soonest_free(s) == arg


def _backoff_wait(s: TurnState) -> float:
    return s.backoff_ceiling(s.visit.streak - 1)


def _server_wait(s: TurnState) -> float:
    """`_back_off`'s longest wait: the backoff ceiling, or the target's Retry-After
    with its spread when that is longer."""
    held = s.visit.not_before - s.at
    ceiling = s.backoff_ceiling(s.visit.attempts - 1)
    return longest_until(s, held) if held >= ceiling else ceiling


def _key_wait(s: TurnState) -> float:
    """`_wait_rate_limit`'s longest wait: to the soonest free key, with its spread."""
    return longest_until(s, max(0.0, s.earliest_free()[0] - s.at))


_FLEET = "{retry_budget} left, not probing"
# A client-side fault: a transport fault while the target answered other attempts, or
# one that never reached the network (`Outcome.client_side`, `Traits.connection_level`).
TRANSPORT_RETRY: Final = reserved(
    Guard(
        "transport_retry",
        _transport_retry,
        "attempts < {max_attempts}, not recovered, {backoff} fits the {deadline} deadline, "
        "not probing; streak < {transport_faults_before_recovery} and {retry_budget} left, "
        "or a client-side fault",
    ),
    _backoff_wait,
)
CAN_RECOVER: Final = reserved(
    Guard(
        "can_recover",
        _can_recover,
        f"recovery not yet used, not a client-side fault, elapsed < {{deadline}}, {_FLEET}",
    )
)
SERVER_RETRY: Final = reserved(
    Guard(
        "server_retry",
        _server_retry,
        "attempts < {max_attempts}, Retry-After ≤ {retry_after_cap}, "
        f"{{backoff}} fits the {{deadline}} deadline, {_FLEET}",
    ),
    _server_wait,
)
#: A continuation is an attempt: it keeps the reserve of the next target that could
#: continue the stream in its place.
CONTINUE_HERE: Final = Guard(
    "continue_here",
    lambda s, arg: _continue_here(s, arg) and keeps_reserve(s, 0.0, next_continuing),
    f"{{target}} takes a prefix and is healthy; attempts < {{max_attempts}}, elapsed < "
    f"{{deadline}}, {_FLEET}; {RESERVE_TEXT}",
    Guard(
        "continue_here",
        _continue_here,
        f"{{target}} takes a prefix and is healthy; attempts < {{max_attempts}}, elapsed < "
        f"{{deadline}}, {_FLEET}",
    ),
)
CAN_ROTATE: Final = reserved(
    Guard(
        "can_rotate",
        _can_rotate,
        "another key free, rotations < keys-1, elapsed < {deadline}",
    )
)
CAN_WAIT: Final = reserved(
    Guard(
        "can_wait",
        _can_wait,
        f"attempts < {{max_attempts}}, wait ≤ {{retry_after_cap}} (spread within {{backoff}}), "
        f"fits the {{deadline}} deadline, {_FLEET}",
    ),
    _key_wait,
)
_VERDICT = (
    f"waited < {VERDICT_WAITS}x; "
    "the breaker open or another turn probing, or {retry_budget} refused with attempts < "
    "{max_attempts} (which opens it for its first span: {cooldown}, {breaker}); its end "
    "≤ {retry_after_cap} away (spread within {backoff}) fits the {deadline} deadline; "
    "failing ≤ {retry_after_cap}"
)


def _verdict_longest(s: TurnState) -> float:
    return longest_until(s, longest_verdict(s))


#: A refused attempt with no eligible fallback waits for the breaker's verdict (the
#: breaker sheds load, it never fails a turn that still has time while its probe is
#: out); so does a fault with no way left while the breaker is open, or while only the
#: retry budget refuses the retry (`fsm.core.verdict`). Bounded by the Retry-After cap,
#: the deadline and the time reserve.
AWAIT_VERDICT: Final = reserved(Guard("await_verdict", await_verdict, _VERDICT), _verdict_longest)
AWAIT_VERDICT_AFTER: Final = reserved(
    Guard("await_verdict_after", await_verdict_after, f"not probing; {_VERDICT}"),
    _verdict_longest,
)
IN_TIME: Final = Guard("in_time", _in_time, "elapsed < {deadline}")
#: A later member of the current group is eligible only while its attempt keeps the next
#: entry's reserve (`fsm.core.reserve.member_spends_reserve`).
NEXT_IS: Final = Guard(
    "next_is", _next_is, "next eligible = {target}, elapsed < {deadline}{group_reserve}"
)
FIRST_IS: Final = Guard("first_is", _first_is, "first not cooling = {target}")
NEXT_CONTINUES_IS: Final = Guard(
    "next_continues_is",
    _next_continues_is,
    "next eligible that takes a prefix = {target}, elapsed < {deadline}",
)
SOONEST_IS: Final = Guard(
    "soonest_is",
    _soonest_is,
    "all cooling; soonest free = {target}, wait ≤ {retry_after_cap}, fits the {deadline} "
    "deadline; its breaker failing ≤ {retry_after_cap} ({cooldown}, {breaker})",
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
    (NEXT_CONTINUES_IS, next_continuing),
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
    CONTINUE_HERE,
    NEXT_CONTINUES_IS,
    CAN_ROTATE,
    CAN_WAIT,
    AWAIT_VERDICT,
    AWAIT_VERDICT_AFTER,
    IN_TIME,
    NEXT_IS,
    FIRST_IS,
    SOONEST_IS,
    PACE_WAIT,
)


def unreserved() -> dict[Guard, Guard]:
    """Every guard that keeps the time reserve -> the same guard without it: a machine
    that spends the deadline on one target (the checker's mutation proof swaps it in)."""
    return {g: g.base for g in GUARDS if g.base is not None}


# -- effects --------------------------------------------------------------------------------------


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


def _continue(s: TurnState, arg: int) -> Action:
    """Continue the broken stream here: the delivered text goes as the prefix."""
    return s.attempt(prefix=s.partial or "")


def _continue_on(s: TurnState, j: int) -> Action:
    """Leave the target the stream broke on (or whose continuation failed) and continue
    the stream on target j."""
    leave(s)
    s.go_to(j)
    return s.attempt(prefix=s.partial or "")


def _rebuild(s: TurnState, arg: int) -> Action:
    return s.rebuild()


def _recovered(s: TurnState, arg: int) -> Action:
    s.visit.recovered = True
    s.visit.streak = 0
    return s.attempt()


def _attempt(s: TurnState, arg: int) -> Action:
    return s.attempt()


def _afresh(s: TurnState, arg: int) -> Action:
    """After a wait for the target to be free (at turn start, or for its breaker's
    verdict): a first attempt, as a turn starting now would make (no retry token)."""
    return s.attempt(fresh=True)


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


def _abort(s: TurnState, arg: int) -> Action:
    v = s.visit
    if v.probe and v.index >= 0:
        s.health.released(s.target.key, s.owner, s.at)
    if s.outcome is None or s.outcome.kind is not OutcomeKind.CANCELLED:
        s.outcome = CANCELLED_OUTCOME
    elif s.outcome.partial is not None and s.partial is None:
        s.partial = s.outcome.partial  # a stream cancelled once it had delivered: its text
    return Fail(s.failure("cancelled", ABORTED))


ENTER: Final = Effect("enter", _enter, "call {target}")
FALL_BACK: Final = Effect("fall_back", _fall_back, "leave; call {target}")
BACK_OFF: Final = Effect("back_off", _back_off, "wait a jittered backoff")
REBUILD: Final = Effect("rebuild", _rebuild, "rebuild the client")
RECOVERED: Final = Effect("recovered", _recovered, "call again (recovery used)")
ATTEMPT: Final = Effect("attempt", _attempt, "call again")
CONTINUE: Final = Effect("continue", _continue, "call again with the delivered text as prefix")
CONTINUE_ON: Final = Effect(
    "continue_on", _continue_on, "leave; call {target} with the delivered text as prefix"
)
ROTATE: Final = Effect("rotate", _rotate, "call with the next key")
AFRESH: Final = Effect("afresh", _afresh, "call (a first attempt)")
WAIT_VERDICT: Final = Effect(
    "wait_verdict",
    wait_verdict,
    "wait for the breaker's verdict (its span or probe; tripped by an empty budget)",
)
WAIT_RATE_LIMIT: Final = Effect(
    "wait_rate_limit", _wait_rate_limit, "wait for the soonest free key"
)
WAIT_FOR_TARGET: Final = Effect("wait_for_target", _wait_for_target, "wait for {target}")
FINISH: Final = Effect("finish", _finish, "answer")
ABORT: Final = Effect("abort", _abort, "abort")

EFFECTS: Final = (
    ENTER,
    FALL_BACK,
    BACK_OFF,
    REBUILD,
    RECOVERED,
    ATTEMPT,
    CONTINUE,
    CONTINUE_ON,
    AFRESH,
    ROTATE,
    WAIT_RATE_LIMIT,
    WAIT_VERDICT,
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
    "VERDICT_WAITS",
    "Effect",
    "Guard",
    "Observation",
    "pick_of",
    "reserved",
    "unreserved",
]
