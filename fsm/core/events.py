"""The trace event of one recorded transition, built only when someone looks.

`fsm.core.turn.take` records each transition as a plain tuple (most turns never show
their trace); `TurnState.trace` turns the tuples into `TraceEvent` values with this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..trace import TraceEvent
from .actions import Fail, Wait

if TYPE_CHECKING:
    from .state import TurnState

__all__ = ["trace_event", "wait_and_detail"]


def trace_event(s: TurnState, raw: tuple[Any, ...]) -> TraceEvent:
    """The `TraceEvent` of one recorded transition (credential ids only, never keys)."""
    seq, at, source, trigger, dest, action, ti, cred, o, sent = raw
    trigger = str(trigger)  # an OutcomeKind fed directly prints as its value
    cls = type(action)
    cred_id = cred.id if cred is not None and ti >= 0 else None
    # what the request produced, for a replay (`fsm.replay.player`): its own outcome and latency
    status = retry_after = latency = partial = None
    if sent is not None:
        latency = sent
        if o is not None:
            status, retry_after, partial = o.status, o.retry_after, o.partial is not None
    wait, detail = wait_and_detail(s, raw)
    name = model = None
    if ti >= 0:
        tgt = s.policy.targets[ti]
        name, model = tgt.name, tgt.model
    return TraceEvent(
        seq,
        round(at, 6),
        source,
        trigger,
        dest,
        cls.__name__,
        name,
        model,
        cred_id,
        wait,
        detail,
        None,
        status,
        retry_after,
        latency,
        partial,
    )


def wait_and_detail(s: TurnState, raw: tuple[Any, ...]) -> tuple[float | None, str]:
    """What a transition's `TraceEvent` says of its wait and in its detail (without the
    rest of the event: telemetry's transition events need only these)."""
    _, _, _, trigger, _, action, _, _, o, _ = raw
    trigger = str(trigger)
    cls = type(action)
    if o is not None and (
        cls is Fail or (trigger == "success" and not o.detail) or o.kind != trigger
    ):
        o = None  # the event's own outcome only (a success only with a note, not on the failure)
    wait: float | None = None
    detail = ""
    if cls is Wait:
        wait = action.seconds
        detail = action.reason
    elif cls is Fail:
        detail = action.error.summary
    if o is not None:
        detail = f"{s.describe(o)}; {detail}" if detail else s.describe(o)
    return wait, detail
