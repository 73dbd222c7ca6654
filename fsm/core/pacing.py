"""Pacing: the machine's part in the providers' rate limits (`Policy.pacing`).

What the providers said is left of each key (`fsm.health.headroom`, read by the adapter
from every reply's headers) is one more reason a key is not free: a key without headroom
for the turn's token cost is free again at its limit's reset. Every guard that asks for a
free key or a target that is not cooling reads it through `TurnState` (`paced_until`), so
the order of decisions is the machine's own: another key of the target with headroom; else
the next eligible fallback that has some; else wait for the soonest reset when it fits
`retry_after_cap`, the deadline and the time reserve; else fail saying which limit and when
it resets (`headroom_words`).

The host takes a reservation with each attempt's grant (`HealthStore.grant`: one request
and the turn's token cost, atomically, on the key's record), and the declaration releases
it on every trigger that ends the attempt (`SETTLE`, an observation of every outcome kind,
`cancelled` included; a refused grant holds none). A reservation also expires on its own
(its attempt's bound and a grace), so a process that dies mid-attempt leaks nothing.

When another turn took the key's last headroom between the decision and the grant, the
grant is refused (``denied``): the turn moves on as from any refusal (the next eligible
fallback), else waits in the target's cooling state for the soonest reset (`PACE_WAIT`,
within the cap, the deadline and the reserve, at most `COOLING_WAITS` waits per
visit, shared with the breaker's; a wait of 0 s when another key of the target has
headroom now), then makes a first attempt with the key that is free. (So a refused grant
falls back before it takes another key of the same target: a race between two turns, not
the decision, which takes a key with headroom first.)
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Final

from ..health import headroom as room
from ..kinds import Outcome
from .edges import Effect, Guard, Observation
from .reserve import longest_until, reserved

if TYPE_CHECKING:
    from .actions import Action
    from .state import TurnState

#: Waits in a target's cooling state per visit, for its breaker's verdict or for a key's
#: reset (`guards.COOLING_WAITS`): one bound, which the checker's termination counts.
COOLING_WAITS: Final = 2

__all__ = [
    "COOLING_WAITS",
    "PACE_WAIT",
    "PACE_WAIT_EFFECT",
    "SETTLE",
    "headroom_words",
    "paced_until",
    "settle",
]


def paced_until(s: TurnState, target: Hashable, cred: str) -> float:
    """When key `cred` of `target` has headroom for the turn's cost (0: now)."""
    return s.health.paced_until(target, cred, s.cost or 0.0, s.at)


def headroom_words(s: TurnState, j: int, now: float) -> str | None:
    """Why target j cannot be called now if it is its keys' headroom (None: it is not):
    ``out of headroom for 0.84s (key#1: requests 0 of 60 left, resets in 0.84s)``."""
    t = s.policy.targets[j]
    h = s.health
    cost = s.cost or 0.0
    best: tuple[float, str, str] | None = None
    for c in t.pool():
        bench = h.credential_until(t.key, c.health_id)
        paced = h.paced_until(t.key, c.health_id, cost, now)
        if paced <= bench:
            return None  # this key is benched or free: the cooldown's words say it
        if best is None or paced < best[0]:
            best = (paced, c.id, room.why_empty(h.headroom(t.key, c.health_id), now, cost))
    if best is None or h.target_until(t.key) >= best[0]:
        return None
    return f"out of headroom for {best[0] - now:.2f}s ({best[1]}: {best[2]})"


def settle(s: TurnState) -> None:
    """The attempt in flight ended: release its reservation (its reply's headers, read
    before, already said what the provider counted)."""
    held = s.reserved
    if held is not None:
        s.reserved = None
        s.health.release_headroom(held[0], held[1], held[2], s.at)


def _settle(s: TurnState, o: Outcome) -> None:
    if s.reserved is not None:
        settle(s)


#: Declared for every outcome kind when pacing is on (`fsm.core.machine`).
SETTLE: Final = Observation("settle", _settle, "release the attempt's headroom reservation")


def _pace_wait(s: TurnState) -> float:
    """Seconds until a key of the current target has headroom again (inf: none will; 0:
    another key has some now, and the wait of 0 s is followed by a first attempt on it)."""
    at = s.earliest_free()[0]
    return at - s.at if at > s.at else 0.0


def _can_pace_wait(s: TurnState, arg: int) -> bool:
    """The grant was refused for headroom (another turn took the key's last): wait for the
    soonest reset if it fits, at most `COOLING_WAITS` waits on this visit."""
    if s.cost is None or s.denial is None or "headroom" not in s.denial:
        return False
    if s.visit.verdicts >= COOLING_WAITS:
        return False
    w = _pace_wait(s)
    return w <= s.policy.retry_after_cap and s.fits_deadline(w)


def _wait_reset(s: TurnState, arg: int) -> Action:
    s.visit.verdicts += 1
    return s.wait(s.until(_pace_wait(s)), "no headroom: waiting for the soonest reset")


def _longest(s: TurnState) -> float:
    return longest_until(s, _pace_wait(s))


PACE_WAIT: Final = reserved(
    Guard(
        "pace_wait",
        _can_pace_wait,
        f"{{pacing}}; refused for headroom; waited < {COOLING_WAITS}x; the soonest reset "
        "≤ {retry_after_cap} away (spread within {backoff}) fits the {deadline} deadline",
    ),
    _longest,
)
PACE_WAIT_EFFECT: Final = Effect("wait_reset", _wait_reset, "wait for the soonest reset")
