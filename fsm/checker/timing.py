"""The time abstraction: how much of a configuration's elapsed time the rest of its turn
can tell apart, and the waits a correct engine can still ask for.

The deadline is part of the explored state, so the key holds elapsed time only as far as
a comparison with the deadline can still turn (`time_key`, `far`), which needs an upper
bound on the waits still to come (`rest_wait`). The bound holds for a correct engine, and
`note_wait` checks it on every wait the search sees: a wait it does not allow makes the
whole search rerun with time keyed exactly (`Checker(abstract_time=False)`), where no
bound is assumed.

The waits of one visit of a target (docs/design.md, "The checker at the scale of real
chains"):

* before a retry at most `max_attempts - 1` (each retry needs attempts < max_attempts;
  rotations, recoveries and fallbacks do not wait), each at most `step_max`;
* in its cooling state at most `COOLING_WAITS` (for its breaker's verdict after a refused
  grant or a fault, or for a key's reset): a breaker's verdict is the end of its open span
  (`fsm.health.records.fail`: the span of its opening count, or a Retry-After within the
  cap) or of a key's bench within the cap, and each wait for one opens the breaker once
  more at most (its probe fails), so the k-th such wait of a visit that found the breaker
  opened `o` times waits at most for span `max(o, 1) + k - 1` (`visit_cooling`; a key's
  reset after a refused grant is briefer); the declaration tries
  every fallback before these (`fsm.core.machine`: the verdict and reset edges come after
  the fallback fan-out, on a fault and on ``denied``), so a visit makes them only while no
  fallback is eligible. Targets ahead of a running turn change only with time (nothing
  else reports on them; the readiness of one untouched target is a fixed time), so one
  ready now stays ready: visits of targets before the last target ready now never make
  them. A policy where this reading does not hold (a fault rule that retries but does
  not fall back, identical targets, context lengths) counts them for every visit.

The waits a visit makes while a fallback is eligible are checked to total at most the
first part (`note_wait`), and all its waits at most both parts.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import TYPE_CHECKING, Any, Final

from ..core.actions import Wait
from ..core.machine import START
from ..core.pacing import COOLING_WAITS
from ..core.state import MIN_ATTEMPT
from ..core.verdict import failing_for
from ..health.records import NUMBER
from ..kinds import TRAITS, OutcomeKind
from ..policy.backoff import breaker_span, wake_spread
from ..policy.model import Policy
from .context import Bounds

if TYPE_CHECKING:
    from ..core.turn import TurnState
    from .oracle import Obs
    from .search import Checker
    from .transition import TransitionRecord

EPS: Final = 1e-6


def streak_saturation(policy: Policy) -> int:
    """The failure streak from which nothing about a target's breaker changes any more
    (streaks beyond it are one value): its open span no longer grows (the cooldown
    schedule meets its cap or ``breaker.max_open``), and turns no longer wait for it
    (`fsm.core.verdict.patient`: failing for longer than ``retry_after_cap``)."""
    c, b = policy.cooldown, policy.breaker
    top = min(c.cap, b.max_open)
    grown = next((n for n in range(1, 200) if breaker_span(c, b, n) >= top), 200)
    cap = policy.retry_after_cap
    impatient = next((n for n in range(1, 200) if failing_for(policy, n) > cap), 1)
    return max(grown, impatient)


def wait_maxima(policy: Policy, bounds: Bounds, sat: int) -> tuple[float, float]:
    """The longest single wait a correct engine can ask for with this alphabet: at turn
    start or in a target's cooling state (every target, or the breaker, holding it back),
    and before a retry."""
    p = policy
    cap = p.retry_after_cap
    b = bounds
    single = max(cap, p.backoff.cap)

    def spread(x: float) -> float:  # a wait for a bench or Retry-After to end, worst case
        return x + max(0.0, min(wake_spread(p.backoff, x), single - x))

    spans = [b.large, p.cooldown.cap] + ([b.small] if b.small is not None else [])
    step_max = max([spread(p.backoff.cap), *[spread(x) for x in spans if x <= cap]])
    cools = [breaker_span(p.cooldown, p.breaker, n) for n in range(1, sat + 1)]
    start_max = max([step_max, *[spread(x) for x in cools if x <= cap]])
    return start_max, step_max


def cooling_anywhere(policy: Policy) -> bool:
    """Whether a visit may wait in its cooling state while a fallback is eligible, or a
    fallback ready now may not be eligible later: a fault rule that retries but does not
    fall back (its verdict wait comes with no fallback tried), identical targets (one
    tried makes its twin ineligible), context lengths (an overflow's floor does)."""
    for kind in OutcomeKind:
        t = TRAITS[kind]
        if not t.fault or t.committed or kind not in policy.rules:
            continue
        rule = policy.rule(kind)
        if rule.retry and not rule.fall_back:
            return True
    targets = policy.targets
    if any(t.context_length is not None for t in targets):
        return True
    return any(a.same_as(b) for i, a in enumerate(targets) for b in targets[i + 1 :])


def time_abstraction(c: Checker, bounds: Bounds) -> None:
    """Set the horizon of the whole search on `c` and the waits a correct engine can ask
    for; "large" Retry-After values are put beyond the horizon."""
    p = c.policy
    c.sat = streak_saturation(p)
    c.start_max, c.step_max = wait_maxima(p, bounds, c.sat)
    c.inexact = False  # an engine waited longer than the abstraction assumes
    per = bounds.per_target
    c.backoffs = (p.max_attempts - 1) * c.step_max
    c.visit_cooling = visit_cooling(p, bounds, c.sat, c.start_max)
    c.cooling_anywhere = cooling_anywhere(p)
    c.attempt_rest = [sum(per[j:]) * c.attempt_seconds for j in range(c.n)]
    # Attempts take time: one target of a turn may be silent (each attempt on it its
    # whole bound); the most that can add from chain position j on.
    bound = [p.attempt_bound(t) for t in p.targets]
    c.silent_time = [per[j] * bound[j] for j in range(c.n)]
    c.silent_rest = [max(c.silent_time[j:]) for j in range(c.n)]
    # the reserve's guards compare elapsed + a wait + an attempt's bound + the next
    # target's reserve with the deadline, though a loud attempt takes no time here
    c.reserve_slack = max(bound) + p.most_reserve() if c.n > 1 else 0.0
    # No run of the whole search lasts longer than this; a cooldown with more left than
    # this never ends within it ("long"). (A "large" Retry-After, above the cap, stays the
    # alphabet's: what it benches comes back within a turn's deadline, and is explored so.)
    most = c.start_max + rest_wait(c, 0, c.n * c.visit_cooling[-1]) + c.silent_rest[0]
    c.horizon = float(math.ceil(c.turns * most + 1))
    c.bounds = bounds
    c.long = c.horizon if c.abstract_time else math.inf


def visit_cooling(policy: Policy, bounds: Bounds, sat: int, start_max: float) -> list[float]:
    """Per opening count `o` of a target's breaker (0 .. `sat`): the most one visit of it
    waits in its cooling state (`COOLING_WAITS` waits, the k-th at most for span
    `max(o, 1) + k - 1`, or a Retry-After or a key's bench within the cap: the alphabet's
    below-cap value, a backoff), each with its spread."""
    p = policy
    single = max(p.retry_after_cap, p.backoff.cap)
    floor = max(bounds.small or 0.0, p.backoff.cap)

    def longest(opens: int) -> float:
        x = max(breaker_span(p.cooldown, p.breaker, min(opens, sat)), floor)
        if x > p.retry_after_cap:
            return start_max
        return min(start_max, x + max(0.0, min(wake_spread(p.backoff, x), single - x)))

    return [sum(longest(max(o, 1) + k) for k in range(COOLING_WAITS)) for o in range(sat + 1)]


def rest_wait(c: Checker, lo: int, cooling: float) -> float:
    """The most a turn waits (and its loud attempts take) from its visit of chain position
    `lo` on: every visit its retries' backoffs, and `cooling` (`cooling_rest`)."""
    return (c.n - lo) * c.backoffs + cooling + c.attempt_rest[lo]


def cooling_rest(c: Checker, s: TurnState, now: float, lo: int) -> float:
    """The most the visits from chain position `lo` on wait in their cooling state: those
    of the last target ready now as the turn's engine reads it (`HealthStore.ready_at`:
    its breaker, another turn's lease, its keys) and after, or every one when none ahead
    of the current target is (`visit_cooling` of each target's opening count now)."""
    h = s.health
    keys, pools = c.ctx.keys, c.ctx.pools
    first = lo
    if not c.cooling_anywhere:
        ready = h.ready_at
        for j in range(c.n - 1, max(lo, s.visit.index), -1):
            if ready(keys[j], pools[j], s.owner, s.cost, now) <= now:
                first = j
                break
    table = c.visit_cooling
    top = len(table) - 1
    record = h.record
    total = 0.0
    for j in range(first, c.n):
        opens = record(keys[j]).get("opens", 0)
        total += table[min(int(opens), top)] if isinstance(opens, NUMBER) else table[top]
    return total


def note_wait(c: Checker, rec: TransitionRecord) -> None:
    """A wait the time abstraction does not allow a correct engine makes the search rerun
    with exact time: longer than `start_max`, or on one visit more than
    `max_attempts - 1 + COOLING_WAITS` waits, or longer in all than its two parts, or
    longer while a fallback was eligible than its retries' part (`Obs.nwait`,
    `Obs.waited`, `Obs.backed`, counted by the oracle)."""
    a = rec.action
    if not isinstance(a, Wait):
        return
    w = a.seconds
    if not (math.isfinite(w) and w >= 0):
        return
    if w > c.start_max + EPS:
        c.inexact = True
        return
    cur = rec.before.cur
    if rec.trigger == START or cur < 0:
        return
    after = rec.after
    table = c.visit_cooling
    if after.nwait[cur] > c.policy.max_attempts - 1 + COOLING_WAITS:
        c.inexact = True
    elif after.waited[cur] > c.backoffs + table[min(after.opened[cur], len(table) - 1)] + EPS:
        c.inexact = True
    elif after.backed[cur] > c.backoffs + EPS:
        c.inexact = True


def far(c: Checker, o: Obs, lo: int, elapsed: float, cooling: float) -> bool:
    """True when the deadline can no longer bind in this turn, whatever happens: the turn
    waits at most `rest_wait` (`cooling`: `cooling_rest`), plus one wait at turn start;
    while a target may still be silent (or is the current one), its attempts'
    whole bounds; and what the reserve's guards add to elapsed when they compare it with
    the deadline."""
    if not c.abstract_time:
        return False
    most = rest_wait(c, lo, cooling) + (c.start_max if o.cur < 0 else 0.0)
    if o.silent < 0:  # a target may still go silent: its attempts may take their bounds
        most += c.silent_rest[lo]
    elif o.silent == o.cur:
        most += c.silent_time[o.cur]
    most += c.reserve_slack
    return elapsed + most + MIN_ATTEMPT <= c.policy.deadline - EPS


def bands(c: Checker, o: Obs, lo: int, cooling: float) -> tuple[list[float], list[float], float]:
    """The elapsed times near which a comparison with the deadline can still turn, as
    disjoint sorted intervals (lows, highs), and the most the rest of the turn can wait.

    Every comparison of the rest of the turn is `elapsed + X + k <= deadline` (or `<`):
    X the delays still to come, k a constant a guard, the oracle or a property adds
    (`MIN_ATTEMPT`, attempt bounds, reserves). The delays are s silent attempts of
    `attempt_timeout` each (s at most the attempts the silent target may still make;
    one cut short by the deadline ends at the deadline) plus waits and loud attempts
    that total at most `wait` (`far`'s bound). So each threshold `deadline - X - k` lies
    in some [deadline - s*timeout - k - wait, deadline - s*timeout - k]: between two of
    these bands no threshold lies, whatever the exact waits are."""
    start = o.cur < 0
    if o.silent < 0:
        s_max = max(c.bounds.per_target[lo:])
    elif o.silent == o.cur:
        s_max = c.bounds.per_target[o.cur]
    else:
        s_max = 0
    wait = rest_wait(c, lo, cooling) + (c.start_max if start else 0.0) + c.step_max
    memo = (s_max, wait)
    found = c.band_memo.get(memo)
    if found is not None:
        return found
    p = c.policy
    tau = p.attempt_timeout
    ks = sorted(
        {
            x + m
            for x in {a + b for a in c.band_adds for b in c.band_adds}
            for m in (0.0, MIN_ATTEMPT)
        }
    )
    d = p.deadline + EPS
    spans = sorted(
        (d - n * tau - k - wait - 2 * EPS, d - n * tau - k + EPS)
        for n in range(s_max + 1)
        for k in ks
    )
    lows: list[float] = []
    highs: list[float] = []
    for a, b in spans:  # merge overlapping bands
        if highs and a <= highs[-1]:
            highs[-1] = max(highs[-1], b)
        else:
            lows.append(a)
            highs.append(b)
    found = c.band_memo[memo] = (lows, highs, wait)
    return found


def time_key(c: Checker, o: Obs, lo: int, elapsed: float, cooling: float) -> tuple[Any, ...]:
    """Elapsed and waited time as far as the rest of the turn can tell them apart: the
    gap between `bands` elapsed lies in (exactly, inside a band); waited time exactly
    only while the waits still to come could take it past the deadline (`honest_waits`
    is the only reader). Without `reduce`, or with time exact (the rerun after a wait
    the abstraction does not allow), both exactly."""
    if not c.reduce or not c.abstract_time:
        return (round(elapsed, 6), round(o.waits, 6))
    lows, highs, wait = bands(c, o, lo, cooling)
    i = bisect_right(highs, elapsed)
    e: Any = ("gap", i) if i >= len(lows) or elapsed < lows[i] else round(elapsed, 6)
    w = round(o.waits, 6) if o.waits + wait > c.policy.deadline - EPS else None
    return (e, w)
