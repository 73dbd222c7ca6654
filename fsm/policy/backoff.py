"""The arithmetic of the policy's backoff and cooldown, safe for any input.

Exponential growth is computed in log space so that attempt 10**6 neither
overflows nor loses the cap. (What a provider's Retry-After says is read in
`fsm.catalogue.retry_after`.)
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .knobs import Backoff, Breaker, Cooldown


def exp_cap(initial: float, multiplier: float, cap: float, n: int) -> float:
    """min(cap, initial * multiplier**n) without overflow, for any n (n <= 0: as 0).

    The common cases compare instead of calling `min`: every retry asks this, and on
    CPython 3.11 a two-argument `min` costs ten comparisons (core bench)."""
    if n <= 0 or multiplier <= 1.0 or initial <= 0.0:
        return initial if initial < cap else cap
    if n < 1024:
        try:
            grown = initial * multiplier**n
        except OverflowError:
            return cap
        return grown if grown < cap else cap
    if cap <= 0.0:
        return 0.0
    # Compare in log space: initial * multiplier**n >= cap, without overflow.
    if math.log(initial) + n * math.log(multiplier) >= math.log(cap):
        return cap
    return min(cap, initial * multiplier**n)


def unit(random: Callable[[], float]) -> float:
    """One draw of the injected random source, in [0, 1] (anything else counts as 1)."""
    r = random()
    if not (0.0 <= r <= 1.0) or math.isnan(r):
        return 1.0
    return r


def backoff_delay(b: Backoff, retry_number: int, random: Callable[[], float]) -> float:
    """Delay before retry number `retry_number` (0 = first retry); full jitter."""
    ceiling = exp_cap(b.initial, b.multiplier, b.cap, retry_number)
    if not b.jitter:
        return ceiling
    return ceiling * unit(random)


def wake_spread(b: Backoff, wait: float) -> float:
    """The most random extra a wait for a cooldown or Retry-After to end may get: a tenth
    of the wait, at least `b.initial`, at most `b.cap` (0 without jitter, or no wait).
    Turns waiting on one cooldown would otherwise all wake, and call, at its end."""
    if not b.jitter or not wait > 0.0:
        return 0.0
    return min(b.cap, max(b.initial, wait / 10.0))


def cooldown_for(c: Cooldown, streak: int) -> float:
    """Cross-turn cooldown after the `streak`-th consecutive hard failure (1-based)."""
    return exp_cap(c.initial, c.multiplier, c.cap, max(0, streak - 1))


def breaker_span(c: Cooldown, b: Breaker, opens: int) -> float:
    """How long a breaker opened for the `opens`-th time in a row (1-based) stays open by
    itself (no Retry-After): the `cooldown` schedule, capped at ``breaker.max_open``
    (5, 10, 20, 20, ... s by default: a backend that stays down is probed every 20 s, not
    every 300 s, so a recovered one is back within that)."""
    span = cooldown_for(c, opens)
    return span if span < b.max_open else b.max_open
