"""The event alphabet: every event the host can feed in each kind of configuration.

Finite by construction: every outcome class once, Retry-After in {none, 0, below the
cap, above the cap} where it matters, a stream break with delivered output, the
host's replies to Wait and Rebuild, cancellation anywhere, and a next turn after the
end of one.
"""

from __future__ import annotations

from typing import NamedTuple

from ..machine import CANCELLED, REBUILD_FAILED, REBUILT, START, WAITED
from ..outcomes import Outcome, OutcomeKind
from ..policy import Policy
from .context import Bounds
from .steps import KINDS, NEXT_TURN, Step, outcome_for, step

#: The output a broken stream had already delivered.
PARTIAL = "partial answer, already delivered"


class Alphabet(NamedTuple):
    on_attempt: tuple[Step, ...]  # an attempt is in flight: its outcome, or a cancel
    on_wait: tuple[Step, ...]
    on_rebuild: tuple[Step, ...]
    on_idle: tuple[Step, ...]  # before the turn starts
    on_end: tuple[Step, ...]  # after the turn ended: the next turn
    outcomes: dict[Step, Outcome | None]  # the `Outcome` each event carries
    fallback_steps: tuple[Step, ...]  # outcomes on which the policy falls back


def alphabet(policy: Policy, bounds: Bounds) -> Alphabet:
    b = bounds
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
    out.append(step("stream_interrupted", partial=PARTIAL))
    cancel = step(CANCELLED)
    on_attempt = (*out, cancel)
    on_wait = (step(WAITED), cancel)
    on_rebuild = (step(REBUILT), step(REBUILD_FAILED), cancel)
    on_idle = (step(START), cancel)
    outcomes = {
        st: outcome_for(st[0], dict(st[1])) for st in (*on_attempt, *on_wait, *on_rebuild, *on_idle)
    }
    fallback_steps = tuple(
        st
        for st in out
        if st[0] != "success" and policy.rule(OutcomeKind(st[0])).fall_back and st[0] in KINDS
    )
    return Alphabet(
        on_attempt, on_wait, on_rebuild, on_idle, (step(NEXT_TURN),), outcomes, fallback_steps
    )
