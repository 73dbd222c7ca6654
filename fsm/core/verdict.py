"""Waiting for a breaker's verdict: what the load shedding of the fleet (the breaker and
the retry budget) does to a turn that has no fallback left and still has time.

The breaker sheds load from a backend that is failing; it must never fail a turn that
still has time while its probe is out. So a turn that the breaker holds back (its span
open, or another turn's probe out) with no eligible fallback waits for the verdict, then
makes a first attempt as a turn starting then would (`guards.AWAIT_VERDICT`,
`guards.AWAIT_VERDICT_AFTER`, `guards.WAIT_VERDICT`).

The retry budget sheds load too, before the breaker has opened: an empty bucket refuses
the retry of a turn whose own counts allow it. Such a turn *trips* the breaker (opens it
for its first span, as a failure that is enough on its own does) and waits for the same
verdict: the refusal always comes with a probe to wait for, so a one-second blip costs no
turn that has time, and a backend that stays down still gets one probe per span, not
one retry per turn.

Waiting is for a blip, not for an outage: a turn waits for a breaker's verdict (here,
and at turn start: `guards.SOONEST_IS`) only while the breaker has been failing its
probes for no longer than ``retry_after_cap``, the longest wait the policy accepts
(`patient`: the spans of its earlier openings in this streak add up to at most that).
Past it, turns with no fallback fail at once, saying so, and the breaker's probes go on
from the turns that arrive after each span (every ``breaker.max_open`` at most): a
backend that stays down costs its callers neither requests nor waiting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..kinds import TRAITS, Level
from ..policy.backoff import breaker_span
from ..policy.model import Policy
from .actions import Action
from .pacing import COOLING_WAITS

if TYPE_CHECKING:
    from ..health.store import TargetKey
    from .state import TurnState

__all__ = [
    "VERDICT_WAITS",
    "await_verdict",
    "await_verdict_after",
    "budget_trips",
    "failing_for",
    "patient",
    "verdict_wait",
    "wait_verdict",
]

#: Waits for a breaker's verdict per visit of a target: for the open span to end, then
#: for the probe another turn took meanwhile; one bound with the waits for a key's reset
#: (`pacing.COOLING_WAITS`), which the checker's termination counts.
VERDICT_WAITS: Final = COOLING_WAITS


def failing_for(p: Policy, opens: int) -> float:
    """The least time a breaker opened `opens` times in a row has been failing: the
    spans of its earlier openings (each reopening is a failed probe after a span)."""
    c, b = p.cooldown, p.breaker
    total = 0.0
    for k in range(1, min(opens, 64)):
        total += breaker_span(c, b, k)
    if opens > 64:  # past any schedule's growth: the span is at its top
        total += (opens - 64) * breaker_span(c, b, 64)
    return total


def patient(s: TurnState, key: TargetKey) -> bool:
    """May a turn wait for the breaker of target `key`? Yes unless it is open (or
    half-open) after failing its probes for longer than ``retry_after_cap``."""
    r = s.health.record(key)
    opens = r.get("opens")
    if not opens:
        return True
    return failing_for(s.policy, int(opens)) <= s.policy.retry_after_cap


def budget_trips(s: TurnState, denied: bool) -> bool:
    """The retry budget alone holds the turn back on its target: the breaker is closed,
    the bucket empty, and the turn's own counts would allow another attempt (a retry the
    store refused: `denied`; else attempts left) after a fault of the target's own (not
    a key's, not a client-side one)."""
    v = s.visit
    p = s.policy
    o = s.outcome
    if v.probe or o is None or TRAITS[o.kind].level is not Level.TARGET:
        return False
    if s.client_side_fault() or not (denied or v.attempts < p.max_attempts):
        return False
    h = s.health
    key = v.target.key
    if h.target_until(key) > s.at or h.half_open(key, s.at):
        return False  # not closed: the breaker's own verdict is waited for
    # A retry the store refused on a closed breaker was refused by the empty bucket (the
    # grant's only other refusals are the breaker's), even if other turns' successes
    # have put a token back since (a host may let other turns run between the two).
    return denied or h.retry_tokens(key, p) < 1.0


def verdict_wait(s: TurnState, trip: bool = False) -> float:
    """How long until the current target's breaker lets this turn try again: the end of
    its open span, or of another turn's probe lease on it (`trip`: of the first span the
    turn is about to open), or later if no key of the turn is free by then (inf: none
    left); 0 when the breaker holds nothing back."""
    t = s.visit.target
    h = s.health
    if trip:
        held = breaker_span(s.policy.cooldown, s.policy.breaker, 1)
    else:
        held = max(h.target_until(t.key), h.lease_until(t.key, s.owner)) - s.at
    if held <= 0.0:
        return 0.0
    return max(held, s.earliest_free()[0] - s.at)


def _fits(s: TurnState, w: float) -> bool:
    return (
        0.0 < w <= s.policy.retry_after_cap
        and s.fits_deadline(w)
        and patient(s, s.visit.target.key)
    )


def await_verdict(s: TurnState, arg: int) -> bool:
    """The store refused the attempt: its target's breaker (open, or half-open with
    another turn's probe out) or, for a retry, an empty retry budget that trips it. Wait
    for the verdict if that fits, at most `VERDICT_WAITS` times on this visit."""
    if s.visit.verdicts >= VERDICT_WAITS:
        return False
    w = verdict_wait(s)
    if w == 0.0 and budget_trips(s, True):
        w = verdict_wait(s, True)
    return _fits(s, w)


def await_verdict_after(s: TurnState, arg: int) -> bool:
    """A fault left no way out while the breaker is open or probed by another turn, or
    while the retry budget alone refuses the retry (which trips it): wait for its
    verdict as a refused attempt does. Not after the probe itself: its outcome is the
    verdict, reported as the turn leaves."""
    v = s.visit
    if v.probe or v.verdicts >= VERDICT_WAITS:
        return False
    w = verdict_wait(s)
    if w == 0.0 and budget_trips(s, False):
        w = verdict_wait(s, True)
    return _fits(s, w)


def longest_verdict(s: TurnState) -> float:
    """The longest wait `wait_verdict` can take from here, before its spread."""
    w = verdict_wait(s)
    return w if w > 0.0 else verdict_wait(s, True)


def wait_verdict(s: TurnState, arg: int) -> Action:
    """Wait for the breaker's verdict; trip it first if only the retry budget held the
    turn back (`budget_trips`: open for its first span, as a report of this turn's)."""
    v = s.visit
    v.verdicts += 1
    if v.probe:  # a probe refused (a lease it held, if any, goes back): no prober now
        s.health.released(v.target.key, s.owner, s.at)
        v.probe = False
    elif verdict_wait(s) == 0.0:  # the budget's refusal: open the breaker for its verdict
        h, key, o = s.health, v.target.key, s.outcome
        until = h.failed(key, s.at, s.policy, None, s.owner, at_once=True).get("until", 0.0)
        if o is not None and until > s.at:  # type: ignore[operator]
            h.note_cause(key, f"{o.cause}, retry budget empty", until)  # type: ignore[arg-type]
        why = "retry budget empty: the breaker opened, waiting for its verdict"
        return s.wait(s.until(verdict_wait(s)), why)
    return s.wait(s.until(verdict_wait(s)), "refused by the breaker: waiting for its verdict")
