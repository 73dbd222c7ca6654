"""Leaving a target, and failing a turn: what is recorded of each target, and the error.

`leave` runs whenever the turn moves off its target (a fallback, a continuation on
another target, the end); the `FAIL` and `LATE` effects build the `TurnFailed` with a
reason for every target. Kept apart from `fsm.core.guards`, which uses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..kinds import FAILED, TRAITS, Level, Outcome
from .actions import Action, Fail
from .edges import Effect
from .pacing import headroom_words
from .verdict import patient

if TYPE_CHECKING:
    from .state import TurnState

__all__ = ["FAIL", "LATE", "leave"]


def leave(s: TurnState) -> None:
    """Record why the current target is being left; bench it if the rule says so."""
    v = s.visit
    if v.index < 0:
        return
    o = s.outcome
    t = v.target
    # a continuation the host refused before it was sent: not an attempt of the target's
    stuck = o.uncontinuable if o is not None and o is not s.interruption else None
    if stuck is not None:
        made = v.attempts - 1
        s.reasons[t.name] = (made, s.interruption) if made > 0 else f"not tried: {stuck}"
        o = None  # nothing was learnt of the target
    else:
        sent = v.attempts - v.refused
        if sent <= 0 and s.denial is not None:
            s.reasons[t.name] = f"not attempted: {s.denial}"
        else:
            s.reasons[t.name] = (sent, o) if s.denial is None or o is not None else s.denial
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


def _all_cooling(s: TurnState) -> str:
    """Why a turn could not start, with when it could and how to stop waiting (when the
    soonest target is out of headroom: which limit of which key, and when it resets)."""
    at, j = min((s.target_ready_at(t.index), t.index) for t in s.policy.targets[s.first :])
    free = at - s.at
    paced = headroom_words(s, j, s.at) if s.cost is not None else None
    if paced:
        return (
            f"every target is cooling or out of headroom beyond the Retry-After cap; the "
            f"first free is {s.policy.targets[j].name}, {paced}: its provider's rate limit"
        )
    p = s.policy
    if patient(s, p.targets[j].key) and free <= p.retry_after_cap:
        # within the cap: the deadline is what the wait did not fit (`_soonest_free`)
        limit = f"past what the {p.deadline:g} s deadline leaves"
    else:
        limit = "beyond the Retry-After cap"
    lease = s.probing(j, s.at)
    if lease is not None:  # not cooling: its open span is over and a probe is in flight
        name = p.targets[j].name
        rest = len(p.targets) - s.first > 1
        return (
            f"{'every other target is cooling and ' if rest else ''}another turn is probing "
            f"{name}'s half-open breaker: {name} is free when that probe ends, at most "
            f"{round(lease - s.at, 1):g} s away, {limit}"
        )
    return (
        f"every target is cooling {limit} (the first is free in "
        f"{max(free, 0.0):.0f} s); the cooldowns are the health store's: clear them with "
        "health.clear() (in-process) or `fallgate health --store URL --reset all` (shared)"
    )


def _fail(s: TurnState, arg: int) -> Action:
    if s.visit.index < 0:
        s.outcome = None
        return Fail(s.failure(_all_cooling(s), FAILED))
    s.next_eligible()
    leave(s)
    broke = s.interruption
    if broke is not None:  # a committed stream: the break is the error, never a refusal
        return Fail(s.failure(_unfinished(s, broke), FAILED))
    if s.denial is not None:
        return Fail(s.failure(f"{s.target.name} not attempted: {s.denial}", FAILED))
    summary = f"{s.target.name} ended with {s.describe(s.outcome)}{_no_retry(s)}"
    if not s.before_deadline():
        summary += f"; the {s.policy.deadline:g}s deadline had passed"
    return Fail(s.failure(summary, FAILED))


def _unfinished(s: TurnState, broke: Outcome) -> str:
    """A broken stream no target continued: the break is the turn's error (its outcome
    and summary); what the last continuation met is that target's reason only."""
    here = s.target.name
    stuck = s.uncontinuable()
    if stuck is not None:  # the stream's own: no target can continue it
        s.outcome = broke
        return f"the stream broke ({s.describe(broke)}) and cannot be continued: {stuck}"
    if s.outcome is broke:
        summary = f"{here} ended with {s.describe(broke)}"
    else:
        how = s.denial if s.outcome is None else s.describe(s.outcome)
        summary = f"the stream broke ({s.describe(broke)}); continuing it on {here}: {how}"
        s.outcome = broke
    for t in s.policy.targets[s.first :]:
        if t.index not in s.tried and not (s.policy.continues and t.continues):
            s.reasons.setdefault(t.name, "not tried: it cannot continue a broken stream")
    if not s.policy.continues:
        return summary + " (continue_streams is off)"
    return summary + "; no other target could continue it"


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
    cap = s.policy.retry_after_cap
    if o.retry_after is not None and o.retry_after > cap:
        return f"; no retry: Retry-After is more than retry_after_cap = {cap:g} s, so not waited"
    return ""


def _late(s: TurnState, arg: int) -> Action:
    """A wait or a rebuild that ran past the deadline: fail without another attempt.
    Only words are recorded (the host's reply is no outcome: no cooldown from it)."""
    v = s.visit
    t = s.target
    deadline = f"{s.policy.deadline:g}s"
    s.next_eligible()
    sent = v.attempts - v.refused  # attempts the store refused were never sent
    if sent > 0:
        s.reasons[t.name] = (sent, s.outcome)
    elif v.refused and s.denial is not None:
        s.reasons[t.name] = (
            f"not attempted: {s.denial}; the {deadline} deadline passed while waiting for it"
        )
    else:
        s.reasons[t.name] = f"not tried: the {deadline} deadline passed while waiting for it"
    for j, why in s._skips.items():
        s.reasons.setdefault(s.policy.targets[j].name, why)
    last = f" (last: {s.describe(s.outcome)})" if sent > 0 else ""
    summary = f"the {deadline} deadline passed before {t.name} could be called{last}"
    return Fail(s.failure(summary, FAILED))


FAIL: Final = Effect("fail", _fail, "fail with every target's reason")
LATE: Final = Effect("late", _late, "fail: the deadline passed")
