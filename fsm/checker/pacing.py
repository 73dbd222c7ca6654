"""Pacing in the model: the providers' rate limits, as the checker feeds them.

A checked turn reads no headers (the adapter does, `providers.openai.pacing`): what a
reply said of a key's rate limits reaches the machine only through the health store's
headroom records (`fsm.health.headroom`). So the checker writes them there, as a reply
would have:

- initial configurations (`fsm.checker.initial`) with keys out of headroom until a reset
  (within the Retry-After cap, or beyond the whole search), and with every key holding
  one request of headroom, so that every attempt on them takes a reservation;
- on an attempt whose key a reply said has requests left in its current window, a grant
  refused for headroom (`HEADROOM` on a ``denied`` step, `headroom_denials`): between
  the turn's decision and its grant another turn took the last one, and its reply said
  so, the reset that many seconds away.

The oracle's reading of a record is its own (`said_empty_until`): the provider said no
requests are left and the reset it named has not come. Between two transitions a turn
holds no reservation (`properties.reservations_released` checks it), so there the
reading agrees with the store's (`headroom.ready_at`) on every record the checker
makes; it never calls it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from ..catalogue.ratelimit import Limits
from ..core.actions import Attempt
from ..core.machine import DENIED
from ..core.pacing import COOLING_WAITS
from ..health import headroom as room
from ..health.store import HealthStore
from ..policy.model import Policy

if TYPE_CHECKING:
    from .configuration import Live
    from .steps import Step

#: The step of a refused grant (`steps.step(DENIED)`).
_DENIED_STEP: Final = (DENIED, ())

__all__ = [
    "HEADROOM",
    "LIMIT",
    "NO_HEADROOM",
    "brief_reset",
    "headroom_denials",
    "held",
    "live_headroom",
    "needs_grant",
    "next_turn_class",
    "pace_waits",
    "refusals",
    "said_empty_until",
    "tell",
    "took_last",
]

#: A setup step: a reply said key `credential` of `target` has `left` requests left,
#: the limit whole again in `seconds`.
NO_HEADROOM: Final = "no_headroom"
#: The argument of a ``denied`` step refused for headroom: seconds to the reset that
#: another turn's reply said when it took the key's last request.
HEADROOM: Final = "headroom"
#: The request limit every record the checker writes states (per window).
LIMIT: Final = 1


def brief_reset(policy: Policy, short: float | None) -> float:
    """The reset of the headroom the checker's setups and refusals speak of: within the
    Retry-After cap (`short`, a Retry-After below it) and before a turn's first backoff
    ends, so that the waits for it are seen and the rest of the turn merges with turns
    that read no headroom."""
    s = short if short is not None else 1.0
    return min(s, policy.backoff.initial) / 2 or s


def pace_waits(policy: Policy) -> int:
    """How many more waits than a policy's retries one visit of a target may make with
    pacing: for a key's reset after a grant refused for headroom (`COOLING_WAITS`)."""
    return COOLING_WAITS if policy.pacing else 0


def _running(left: Any) -> Any:
    """Seconds left as a next turn's class tells them: over, running, beyond the search."""
    if not isinstance(left, float):
        return left
    return 0 if left == 0.0 else (2 if math.isinf(left) else 1)


def next_turn_class(x: Any) -> Any:
    """An entry of a store's key (`HealthStore.key`) as coarsely as a next turn's start
    is told apart (`configuration.health_class`): the headroom records' resets as over,
    running or beyond the search, like the cooldowns'; any other entry as it is."""
    if not (isinstance(x, tuple) and len(x) == 3 and x[0] == "headroom"):
        return x
    recs = tuple(
        (i, tuple((rem, _running(left), lim) for rem, left, lim in ident[:2]), ident[2:])
        for i, ident in x[1]
    )
    return ("headroom", recs, x[2])


def tell(
    h: HealthStore, target: Any, health_id: str, left: int, seconds: float, now: float
) -> None:
    """What a reply arriving at `now` says of one key: `left` requests of `LIMIT` left,
    the limit whole again `seconds` later."""
    said = Limits(requests_remaining=left, requests_reset=seconds, requests_limit=LIMIT)
    h.observe_limits(target, health_id, said, now)


def said_empty_until(r: Mapping[str, Any], now: float) -> float:
    """When the key a headroom record is about may be called again, as the provider said
    it: 0 unless it said no requests are left, else the reset it named (when it named
    none, `headroom.UNNAMED_RESET` after it said so) while that is ahead."""
    left = r.get("rq")
    if not isinstance(left, int | float) or left > 0:
        return 0.0
    at = r.get("rqa")
    if not isinstance(at, int | float):
        said = r.get("said")
        at = said + room.UNNAMED_RESET if isinstance(said, int | float) else 0.0
    return float(at) if at > now else 0.0


def held(h: HealthStore, now: float) -> Iterator[tuple[Any, str, str]]:
    """Every live reservation in the store: (target key, health id, reservation id)."""
    for (target, hid), r in list(h.room.items()):
        for rid in room.reserved(r, now):
            yield target, hid, rid


def live_headroom(policy: Policy, h: HealthStore, now: float) -> bool:
    """Whether a grant may still be refused for headroom in the rest of a turn on this
    store, and the turn wait for a key's reset (the time abstraction counts those waits
    only then): pacing is on and a record is not `headroom.inert`. Only a record that is
    not makes one that is not (`headroom_denials`), so once all are inert, none will."""
    return policy.pacing and any(not room.inert(r, now) for r in h.room.values())


def needs_grant(h: HealthStore, s: Any, a: Attempt) -> bool:
    """Whether the host asks the store's grant before attempt `a` for its headroom: pacing
    is on and a reply spoke of the attempt's key (the grant then reserves on it)."""
    return bool(h.room) and h.reservation(s, a) is not None


def headroom_denials(
    clone: Callable[[Live], Live], live: Live, a: Attempt, steps: tuple[Step, ...]
) -> dict[Step, Live]:
    """For attempt `a` on a key with a headroom record, one configuration per step of
    `steps` (``denied`` with `HEADROOM`): a `clone` of `live` (before the grant) where
    another turn's reply said the key is empty until that reset, and the store's own
    grant refused the attempt (its words are the turn's `denial`)."""
    s = live.turn.s
    if not steps or not needs_grant(s.health, s, a):
        return {}
    said = s.health.headroom(a.target.key, a.credential.health_id)
    left, at = said.get("rq"), said.get("rqa")
    if not (isinstance(left, int | float) and left > 0):
        return {}  # the last reply said nothing is left: no race for the last request
    if not (isinstance(at, int | float) and at > live.clock.t):
        return {}  # its window is over (the record is inert): no race either
    out: dict[Step, Live] = {}
    for ev in steps:
        d = clone(live)
        ds = d.turn.s
        took_last(ds.health, a, float(dict(ev[1])[HEADROOM]), d.clock.t)
        ds.denial = ds.health.grant(ds, a) or "refused for headroom (another turn came first)"
        out[ev] = d
    return out


def refusals(
    clone: Callable[[Live], Live], live: Live, a: Attempt, steps: tuple[Step, ...]
) -> dict[Step, Live]:
    """The refused grants to explore for attempt `a` besides its granting, each from a
    `clone` of `live` before the grant: for a probe or a retry, `denied` (another turn took
    the lease or the last token); with pacing, `headroom_denials`."""
    out: dict[Step, Live] = {}
    if a.probe or a.retry:
        other = clone(live)
        other.turn.s.denial = "refused by the health store (another turn came first)"
        out[_DENIED_STEP] = other
    out.update(headroom_denials(clone, live, a, steps))
    return out


def granted(
    clone: Callable[[Live], Live],
    release: Callable[[Live], None],
    live: Live,
    events: tuple[Step, ...],
    on_headroom: tuple[Step, ...],
) -> tuple[tuple[Step, ...], dict[Step, Live]]:
    """The events to feed a configuration about to make an attempt, as the host does
    before making one that needs it: ask the health store's grant (the probe lease, a
    retry token, the key's headroom). Refused, the only event is `denied`. Granted,
    `denied` is explored too, from the store as it was before the grant (`refusals`): a
    turn of another process may have taken the lease, the last token or the key's last
    request first, which one turn's store cannot show. Returns the events and the
    configuration each refusal goes to."""
    s = live.turn.s
    a = s.action
    if not isinstance(a, Attempt):
        return events, {}
    denials = refusals(clone, live, a, on_headroom)
    if not denials and not needs_grant(s.health, s, a):
        return events, {}
    why = s.health.grant(s, a)
    if why is None:
        return (*events, *denials), denials
    for d in denials.values():
        release(d)
    s.denial = why
    return (_DENIED_STEP,), {_DENIED_STEP: live}


def took_last(h: HealthStore, a: Attempt, seconds: float, now: float) -> None:
    """Another turn took the last request of attempt `a`'s key: its reply says so."""
    tell(h, a.target.key, a.credential.health_id, 0, seconds, now)
