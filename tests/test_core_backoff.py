"""Backoff and Retry-After arithmetic: safe for any input the wire can send."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsm import Backoff, Outcome, Policy
from fsm.backoff import MAX_RETRY_AFTER, backoff_delay, cooldown_for, parse_retry_after
from fsm.policy import Cooldown
from fsm.testing import play

NOW = 1_800_000_000.0  # a fixed wall-clock time for HTTP dates

HOSTILE = [
    "-5",
    "0",
    "nan",
    "inf",
    "-inf",
    "1e308",
    "Wed, 21 Oct 2015 07:28:00 GMT",
    "garbage",
    "",
    "  ",
    "1e-400",
    "99999999999999999999999",
    "12abc",
    "0x10",
]


@pytest.mark.parametrize("raw", HOSTILE)
@pytest.mark.parametrize("header", ["retry-after", "retry-after-ms", "Retry-After"])
def test_hostile_retry_after_values_never_raise_and_stay_within_bounds(raw, header):
    value = parse_retry_after({header: raw}, None, now=NOW)
    assert value is None or 0.0 <= value <= MAX_RETRY_AFTER


def test_retry_after_forms_are_read_in_precedence_order():
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": "20"}) == 20.0
    assert parse_retry_after({"retry-after": "-5"}) == 0.0
    past = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert parse_retry_after({"retry-after": past}, now=NOW) == 0.0
    future = "Fri, 15 Jan 2027 08:00:30 GMT"
    soon = parse_retry_after({"retry-after": future}, now=1_800_000_000.0 - 10**7)
    assert soon is not None and soon > 0
    assert parse_retry_after({}, "Rate limit reached. Please try again in 20s.") == 20.0
    assert parse_retry_after({}, "please try again in 750ms") == 0.75
    assert parse_retry_after({}, "no hint here") is None


@given(n=st.integers(min_value=-10, max_value=10**6), r=st.floats(allow_nan=True))
def test_backoff_is_within_zero_and_cap_for_any_attempt_number_and_random_draw(n, r):
    """Property: for any attempt number (up to 10**6) and any random draw (even NaN),
    the delay is a finite number in [0, cap]."""
    b = Backoff(initial=0.5, multiplier=2.0, cap=8.0)
    d = backoff_delay(b, n, lambda: r)
    assert math.isfinite(d) and 0.0 <= d <= 8.0


@pytest.mark.parametrize("n", [0, 1, 10, 1000, 10**6])
def test_backoff_grows_exponentially_up_to_the_cap(n):
    b = Backoff(initial=0.5, multiplier=2.0, cap=8.0, jitter=False)
    assert backoff_delay(b, n, lambda: 1.0) == min(8.0, 0.5 * 2.0 ** min(n, 10))


def test_cooldown_streak_grows_and_caps():
    c = Cooldown(initial=5, multiplier=2, cap=300)
    assert [cooldown_for(c, s) for s in (1, 2, 3, 10**6)] == [5, 10, 20, 300]


@pytest.mark.parametrize("ra", [-5.0, 0.0, math.nan, math.inf, 1e308, -math.inf])
def test_the_core_tolerates_raw_pathological_retry_after_in_outcomes(ra):
    p = Policy.from_dict(
        {
            "primary": {"provider": "p", "model": "m", "api_key": "sk-1234"},
            "fallback_providers": [{"provider": "q", "model": "n", "api_key": "sk-5678"}],
        }
    )
    played = play(p, [Outcome.of("rate_limited", retry_after=ra), "success"])
    assert played.state == "done"
    assert all(math.isfinite(w) and w >= 0 for w in played.waits)
