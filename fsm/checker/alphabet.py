"""The event alphabet: every event the host can feed in each kind of configuration.

Finite by construction and read off the traits table (`fsm.kinds`): every outcome
kind, once per abstract Retry-After value its row lists (none, 0, below the cap, above
the cap), with delivered output when its row says the stream was committed (once more marked
`uncontinuable`, when streams are continued: tool calls, several choices), and
for a `connection_level` kind once more marked `client_side` and once more
`silent` (the attempt took its whole timeout: time passes in the model; one target
of a turn may be silent, the wedged one, so after a silent attempt only that
target's attempts are fed it); the
host's replies to Wait and Rebuild (on time, or late: after the deadline),
cancellation anywhere, and a next turn after the
end of one. A new outcome kind is fed as soon as it has its row. With pacing, an attempt
on a key a reply spoke of may also be refused for headroom (`fsm.checker.pacing`): another
turn took the key's last request, its reset soon (`pacing.brief_reset`).
"""

from __future__ import annotations

from typing import NamedTuple

from ..core.machine import CANCELLED, DENIED, REBUILD_FAILED, REBUILT, START, WAITED
from ..kinds import TRAITS, Outcome, OutcomeKind, RetryAfter
from ..policy.model import Policy
from .context import Bounds
from .pacing import HEADROOM, brief_reset
from .steps import KINDS, NEXT_TURN, Step, outcome_for, step

#: The output a broken stream had already delivered.
PARTIAL = "partial answer, already delivered"


class Alphabet(NamedTuple):
    on_attempt: tuple[Step, ...]  # an attempt is in flight: its outcome, or a cancel
    on_attempt_loud: tuple[Step, ...]  # ... once another target of the turn was silent
    on_wait: tuple[Step, ...]
    on_rebuild: tuple[Step, ...]
    on_idle: tuple[Step, ...]  # before the turn starts
    on_end: tuple[Step, ...]  # after the turn ended: the next turn
    outcomes: dict[Step, Outcome | None]  # the `Outcome` each event carries
    fallback_steps: tuple[Step, ...]  # outcomes on which the policy falls back
    # with pacing, on an attempt whose key has a headroom record: refused for headroom
    on_headroom: tuple[Step, ...] = ()


def alphabet(policy: Policy, bounds: Bounds) -> Alphabet:
    b = bounds
    values: dict[RetryAfter, float | None] = {
        RetryAfter.ABSENT: None,
        RetryAfter.ZERO: 0.0,
        RetryAfter.ABOVE_CAP: b.large,
    }
    if b.small is not None:
        values[RetryAfter.BELOW_CAP] = b.small
    out: list[Step] = []
    for kind in OutcomeKind:
        t = TRAITS[kind]
        if kind is OutcomeKind.CANCELLED:
            continue  # fed in every running configuration, below
        if not t.fault:
            out.append(step(kind.value))
            continue
        for ra in t.retry_afters:
            if ra not in values:
                continue
            args: dict[str, object] = {}
            if ra is not RetryAfter.ABSENT:
                args["retry_after"] = values[ra]
            elif len(t.retry_afters) > 1:
                args["retry_after"] = None
            if t.committed:
                args["partial"] = PARTIAL
            out.append(step(kind.value, **args))
            if t.committed and policy.continues:  # ... and one no text prefix can carry
                out.append(step(kind.value, **args, uncontinuable=True))
            if t.connection_level:  # ... and while the target answered other attempts
                out.append(step(kind.value, **args, client_side=True))
                # ... and after the attempt's whole bound: a target that never answered
                out.append(step(kind.value, **args, silent=True))
    cancel = step(CANCELLED)
    on_attempt = (*out, cancel)
    # the host may also answer late: after the deadline (`steps.LATE`)
    on_wait = (step(WAITED), step(WAITED, late=True), cancel)
    on_rebuild = (step(REBUILT), step(REBUILT, late=True), step(REBUILD_FAILED), cancel)
    on_idle = (step(START), cancel)
    outcomes = {
        st: outcome_for(st[0], dict(st[1])) for st in (*on_attempt, *on_wait, *on_rebuild, *on_idle)
    }
    fallback_steps = tuple(
        st
        for st in out
        if st[0] != "success" and policy.rule(OutcomeKind(st[0])).fall_back and st[0] in KINDS
    )
    loud = tuple(st for st in on_attempt if not dict(st[1]).get("silent"))
    resets = [brief_reset(policy, b.small)] if policy.pacing else []
    on_headroom = tuple(step(DENIED, **{HEADROOM: x}) for x in resets)
    outcomes.update((st, None) for st in on_headroom)
    return Alphabet(
        on_attempt,
        loud,
        on_wait,
        on_rebuild,
        on_idle,
        (step(NEXT_TURN),),
        outcomes,
        fallback_steps,
        on_headroom,
    )
