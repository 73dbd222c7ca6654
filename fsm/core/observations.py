"""Observations: what `observe` records of an outcome before any guard runs.

Chosen per outcome kind from its traits (`observations`), each an `Observation` object
that carries its code and its words (the diagram's labels), like the guards and effects
of `fsm.core.guards`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..kinds import TRAITS, BenchSpan, Level, Outcome, Traits
from .guards import Observation

if TYPE_CHECKING:
    from .state import TurnState

__all__ = [
    "BENCH_KEY",
    "COUNT_FAULT",
    "HOLD_TARGET",
    "KEEP_PARTIAL",
    "RAISE_CONTEXT_FLOOR",
    "RESET_STREAK",
    "observation_text",
    "observations",
]


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
    s.interruption = o


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
KEEP_PARTIAL: Final = Observation(
    "keep_partial", _keep_partial, "keep the partial output (and the break, for the error)"
)
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
