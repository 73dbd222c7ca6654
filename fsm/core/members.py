"""Which member of a deployment group, and which key, a turn tries first: the router.

The one place that chooses (the drivers call `route` before a turn starts and `settle`
when it has answered). A group's members are consecutive targets of the chain
(`fsm.policy.groups`); the router hands the turn the same policy with each group's
members in the order it should try them, and, for a conversation, its pinned key
first. The turn then runs that chain as declared: a member that fails is left for the
next member (a declared fallback edge, with its guards) before the chain moves on.

Members are ordered by, in this order (the first difference decides):

1. **health**: a member the health store says is free now (breaker not open, no other
   turn's probe out, a key not benched) before one that is not;
2. **the conversation's pin**: the member that last answered this affinity key (while
   it is free: a pin never outranks health), so the provider's prompt cache keeps
   hitting;
3. **load and speed**: the smallest ``latency x (1 + turns in flight) / weight``
   (latency: the moving average of the member's answers, `fsm.health.routes`; a member
   not measured yet counts as the fastest measured one, so it is tried);
4. the declared order.

Pacing adds *headroom* (a key the provider says has requests and tokens left) as one
more criterion after health: `_rank` is where it goes.

The chosen order is a policy of its own (the declared one with its members permuted and
a pinned key moved first), made once per order and kept in the declared policy's memo;
its targets keep their names (``primary_m2`` is always the same deployment), so client
pools, traces and the health store see the same member whatever its rank this turn.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ..health.routes import Pin, Routes, routes_of
from ..health.store import HealthStore
from ..policy.groups import spans
from ..policy.model import Policy, Target

__all__ = ["Routed", "affinity_of", "entry_label", "release", "route", "settle"]

#: The most routed orders one policy keeps (then the memo starts over).
MAX_ORDERS = 256


@attrs.frozen(slots=True)
class Routed:
    """A turn's routed policy, what it was routed for, and its ticket (`Routes.start`)."""

    policy: Policy
    affinity: str | None = None
    ticket: int = 0
    routes: Routes | None = None


def affinity_of(kwargs: object) -> str | None:
    """A request's conversation key: its ``prompt_cache_key``, else its ``user`` (the
    fields OpenAI's own cache routing reads), when it is a non-empty string."""
    if not isinstance(kwargs, dict):
        return None
    for name in ("prompt_cache_key", "user"):
        v = kwargs.get(name)
        if isinstance(v, str) and v:
            return v
    return None


def entry_label(t: Target) -> str:
    """What a pin is filed under: the target's group, else its own name."""
    return t.group if t.group is not None else t.name


def _routable(policy: Policy) -> tuple[tuple[range, ...], tuple[int, ...]]:
    """The policy's groups and its pooled targets outside them (memoised)."""
    found = policy.memo.get("routable")
    if found is None:
        groups = spans(policy.targets)
        pooled = tuple(
            t.index for t in policy.targets if t.group is None and len(t.credentials) > 1
        )
        found = policy.memo["routable"] = (groups, pooled)
    return found  # type: ignore[return-value]


def route(
    policy: Policy,
    health: HealthStore,
    affinity: str | None,
    now: float,
    first: int = 0,
    cost: float | None = None,
) -> Routed:
    """The turn's policy: `policy` with its members (and a pinned key) in the order to
    try them now. A policy without groups and a turn without affinity: `policy` itself.
    `cost`: the turn's token cost when it is paced (a member or key out of headroom for
    it now ranks after those with room, as the machine's start will skip it)."""
    groups, pooled = _routable(policy)
    if not groups and (affinity is None or not pooled):
        return Routed(policy, affinity)
    routes = routes_of(health)
    order = list(range(len(policy.targets)))
    keys: dict[int, str] = {}  # target index -> the pinned credential to start on
    start: Target | None = None
    for span in groups:
        members = [policy.targets[i] for i in span]
        pin = routes.pin(affinity, members[0].group or "", now) if affinity else None
        ranked = sorted(members, key=lambda m: _rank(m, members, health, routes, pin, now, cost))
        order[span.start : span.stop] = [m.index for m in ranked]
        best = ranked[0]
        if pin is not None and best.key == pin[0] and _key_free(health, best, pin[1], now, cost):
            keys[best.index] = pin[1]
        if span.start == first:
            start = best
    if affinity:
        for i in pooled:
            t = policy.targets[i]
            pin = routes.pin(affinity, t.name, now)
            if pin is not None and _key_free(health, t, pin[1], now, cost):
                keys[i] = pin[1]
    routed = _variant(policy, tuple(order), tuple(sorted(keys.items())))
    ticket = routes.start(start.key, now, policy.deadline) if start is not None else 0
    return Routed(routed, affinity, ticket, routes)


def _rank(
    m: Target,
    members: Sequence[Target],
    health: HealthStore,
    routes: Routes,
    pin: Pin | None,
    now: float,
    cost: float | None = None,
) -> tuple[bool, bool, float, int]:
    cooling = health.ready_at(m.key, m.pool(), "", cost, now) > now  # headroom too, paced
    pinned = pin is not None and pin[0] == m.key
    latency = routes.latency(m.key)
    if latency is None:
        known = [x for x in (routes.latency(o.key) for o in members) if x is not None]
        latency = min(known) if known else 1.0
    score = latency * (1 + routes.busy(m.key, now)) / m.weight
    return (cooling, not pinned, score, m.member)


def _key_free(
    health: HealthStore, t: Target, cred: str, now: float, cost: float | None = None
) -> bool:
    """Is the pinned key one of `t`'s, not benched, and (paced) with headroom now?"""
    return (
        any(c.health_id == cred for c in t.credentials)
        and health.credential_until(t.key, cred) <= now
        and (cost is None or health.paced_until(t.key, cred, cost, now) <= now)
    )


def _variant(policy: Policy, order: tuple[int, ...], keys: tuple[tuple[int, str], ...]) -> Policy:
    """`policy` with its targets in `order` and each (index, credential) of `keys`
    first in that target's pool (made once per order, kept in the policy's memo)."""
    if not keys and order == tuple(range(len(order))):
        return policy
    memo = policy.memo.setdefault("orders", {})
    assert isinstance(memo, dict)
    sig = (order, keys)
    found = memo.get(sig)
    if found is None:
        pinned = dict(keys)
        targets = []
        for i in order:
            t = policy.targets[i]
            if i in pinned:
                pool = t.credentials
                at = next(k for k, c in enumerate(pool) if c.health_id == pinned[i])
                t = attrs.evolve(t, credentials=pool[at:] + pool[:at], rotation="fill_first")
            targets.append(t)
        if len(memo) >= MAX_ORDERS:
            memo.clear()
        found = memo[sig] = attrs.evolve(policy, targets=targets)
    return found


def settle(routed: Routed, target: Target, credential: str, seconds: float, now: float) -> None:
    """A routed turn answered on `target` with `credential` (its health id), its last
    attempt having taken `seconds`: measure the member, pin the conversation to it."""
    routes = routed.routes
    if routes is None:  # nothing to choose between in this policy
        return
    if routed.ticket:
        routes.end(routed.ticket)
    if target.group is not None:
        routes.measured(target.key, seconds)
    if routed.affinity is not None:
        routes.set_pin(routed.affinity, entry_label(target), (target.key, credential), now)


def release(routed: Routed) -> None:
    """A routed turn ended without an answer: it is no longer in flight."""
    if routed.routes is not None and routed.ticket:
        routed.routes.end(routed.ticket)
