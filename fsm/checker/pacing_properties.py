"""The pacing properties (12 and 13 of `fsm.checker.properties.PROPERTIES`), as pure
functions over one transition. Only a policy with pacing on and a store that holds
headroom records (`fsm.checker.pacing`) can break them; the third property of pacing,
the fallback gate with pacing on, is the gate itself, whose oracle reads the headroom
(`oracle.ready_at`).
"""

from __future__ import annotations

from ..core.actions import Attempt
from .pacing import held, said_empty_until
from .timing import EPS
from .transition import Finding, TransitionRecord

__all__ = ["no_call_on_an_empty_key", "reservations_released"]


# -- 12. no call on an empty key ------------------------------------------------------------------


def no_call_on_an_empty_key(rec: TransitionRecord) -> Finding | None:
    """With pacing, no attempt goes out on a key whose provider said it has no requests
    left, before the reset it named (`pacing.said_empty_until`)."""
    h = rec.health
    if not h.room or not rec.ctx.policy.pacing:
        return None
    a = rec.action
    assert isinstance(a, Attempt)
    j = a.target.index
    until = said_empty_until(h.headroom(rec.ctx.keys[j], a.credential.health_id), rec.now)
    if until <= rec.now + EPS:
        return None
    left = f"reset in {until - rec.now:g} s"
    return Finding(
        "no_call_on_an_empty_key",
        f"called {rec.ctx.names[j]} with {a.credential.id}, which its provider said has no "
        f"requests left ({left})",
    )


# -- 13. reservations are released ----------------------------------------------------------------


def reservations_released(rec: TransitionRecord) -> Finding | None:
    """Every headroom reservation an attempt takes is released when the attempt ends,
    whatever the path (an outcome of any kind, a cancellation, a refused grant): between
    two transitions the store holds none (the next attempt's is taken at its grant)."""
    h = rec.health
    if not h.room:
        return None
    for target, hid, _rid in held(h, rec.now):
        ctx = rec.ctx
        j = ctx.keys.index(target) if target in ctx.keys else -1
        name = ctx.names[j] if j >= 0 else "/".join(str(x) for x in target if x)
        cid = next((c.id for c in ctx.pools[j] if c.health_id == hid), hid) if j >= 0 else hid
        return Finding(
            "reservations_released",
            f"after {rec.trigger} in {rec.source} the reservation on {cid} of {name} is still "
            "held (its attempt has ended)",
        )
    return None
