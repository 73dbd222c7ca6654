"""The time reserve: time belongs to the chain, not to one target.

A retry, wait, rebuild or rotation on the current target (a *stay*) is taken only
while what is left of the deadline after the stay's worst case (its wait, then one
attempt of the target's `Policy.attempt_bound`) still covers the reserve of the next
eligible target (`Policy.reserve_for`: by default one attempt on it). Otherwise the
turn falls back now: a silent primary cannot spend the deadline its fallback needs.

The guards of the stays (`fsm.core.guards`) hold the rule; each keeps its guard
without the reserve as `Guard.base`, which the checker's mutation proof swaps in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..health.store import HealthStore
from ..policy.backoff import wake_spread
from ..policy.model import Policy
from .edges import Guard

if TYPE_CHECKING:
    from .state import TurnState

#: The words every reserved guard's label ends with (`{...}`: what the rule reads).
RESERVE_TEXT = "then ≤{attempt_bound} more leaves {reserve}"


def keeps_reserve(
    s: TurnState, wait: float, after: Callable[[TurnState], int] | None = None
) -> bool:
    """May the turn stay on its target for `wait` seconds and one more attempt?

    Yes when the reserve is off or no fallback is eligible now (there is nothing to keep
    time for: the stay's own guard bounds it by the deadline); else only if the stay's
    worst case leaves the next eligible target its reserve. The eligible target is
    looked for only when the stay does not leave every fallback's reserve. `after`
    picks the target that would come next instead of `TurnState.next_eligible` (a
    broken stream's: the next one that can continue it)."""
    p = s.policy
    if p.reserve is False:
        return True
    spare = p.deadline - (s.at - s.started) - wait - p.attempt_bound(s.target)
    if spare >= p.most_reserve():
        return True
    j = s.next_eligible() if after is None else after(s)  # cached per event
    return j < 0 or spare >= p.reserve_for(p.targets[j])


def member_spends_reserve(s: TurnState, j: int) -> str | None:
    """Why the turn may not move on to member `j` of the group it is in (None: it may).

    A move between members is a fallback, but it is within one chain entry: when every
    member is silent, each takes its whole bound, and the next entry is left what they
    did not use. So a move to a later member of the same group is taken only while its
    attempt's worst case leaves the first eligible target after the group its reserve,
    as a stay on one target is (`keeps_reserve`); with none eligible after the group,
    there is nothing to keep time for."""
    p = s.policy
    cur = s.visit.index
    if cur < 0:
        return None
    t, here = p.targets[j], p.targets[cur]
    if t.group is None or t.entry != here.entry or p.reserve is False:
        return None
    bound = p.attempt_bound(t)
    spare = p.deadline - (s.at - s.started) - bound
    if spare >= p.most_reserve():
        return None
    for k in range(j + 1, len(p.targets)):
        after = p.targets[k]
        if after.entry == t.entry or s.ineligible(k, s.at) is not None:
            continue
        need = p.reserve_for(after)
        if spare >= need:
            return None
        return (
            f"skipped: an attempt on it (up to {bound:g} s) would leave {after.name} less "
            f"than its reserve ({need:g} s)"
        )
    return None


def reserved(base: Guard, wait: Callable[[TurnState], float] | None = None) -> Guard:
    """`base`, taken only while staying (a wait of at most `wait(s)`, none if None, then
    an attempt) keeps the time reserve of the next eligible target (below)."""
    check = base.check
    if wait is None:

        def both(s: TurnState, arg: int) -> bool:
            return check(s, arg) and keeps_reserve(s, 0.0)
    else:

        def both(s: TurnState, arg: int) -> bool:
            return check(s, arg) and keeps_reserve(s, wait(s))

    return Guard(base.name, both, f"{base.text}; {RESERVE_TEXT}", base)


def longest_until(s: TurnState, seconds: float) -> float:
    """The longest wait `TurnState.until(seconds)` can draw (its random part at the top):
    the worst case of a wait for a Retry-After or a benched key to end."""
    p = s.policy
    room = min(
        wake_spread(p.backoff, seconds),
        max(p.retry_after_cap, p.backoff.cap) - seconds,
        p.deadline - (s.at - s.started) - seconds,
    )
    return seconds + room if room > 0.0 else seconds


def stream_hold(policy: Policy, health: HealthStore, index: int, left: float, now: float) -> float:
    """How long a stream that has started but said nothing yet (no output, no reasoning)
    may run on target `index` when `left` seconds of the deadline remain: up to where the
    first target after it that is free now (`HealthStore.ready_at`) needs its reserve, at
    least the attempt's own bound; all of `left` when none is free (nothing to keep time
    for) or the reserve is off. Until the stream says something its time is the chain's,
    as a silent target's."""
    if policy.reserve is False:
        return left
    for t in policy.targets[index + 1 :]:
        if health.ready_at(t.key, t.pool(), "", None, now) <= now:
            return max(left - policy.reserve_for(t), min(policy.attempt_timeout, left))
    return left


def reserve_warnings(policy: Policy) -> list[str]:
    """Why this policy's deadline cannot hold the reserve, naming the fields (for
    `fallgate check`): a silent primary leaves its first fallback less than a whole
    attempt, or the deadline holds no retry on the primary after a timeout."""
    targets = policy.targets
    if len(targets) < 2 or policy.reserve is False:
        return []
    first, then = targets[0], targets[1]
    bound, after = policy.attempt_bound(first), policy.attempt_bound(then)
    need = bound + after
    d = policy.deadline
    where = f"{first.name} (attempt_timeout {bound:g} s) and {then.name} ({after:g} s)"
    if d < need:
        return [
            f"deadline {d:g} s is shorter than one attempt on each of {where}: a {first.name} "
            f"that never answers leaves {then.name} {max(d - bound, 0.0):g} s; raise deadline "
            f"to {need:g} s or lower attempt_timeout"
        ]
    # the cheapest stay after a timeout: a rebuild (no wait), else a backed-off retry
    wait = 0.0 if policy.recover_transport else policy.backoff.initial
    how = "a rebuild" if policy.recover_transport else f"backoff.initial {wait:g} s"
    again = bound + wait + bound + policy.reserve_for(then)
    if d < again:
        return [
            f"deadline {d:g} s holds no second attempt on {first.name} after a timeout: "
            f"its worst case ({how} + attempt_timeout {bound:g} s) would leave {then.name} "
            f"less than its reserve ({policy.reserve_for(then):g} s), so a timeout falls "
            f"back at once; raise deadline to {again:g} s to keep one more attempt"
        ]
    return []
