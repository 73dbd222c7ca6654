"""Backoff and Retry-After arithmetic: safe for any input the wire can send."""

from __future__ import annotations

import math

import pytest
from fallgate.fsm import Outcome
from fallgate.fsm.catalogue.classify import classify_status
from fallgate.fsm.catalogue.retry_after import parse_retry_after
from fallgate.fsm.host.scripted import play
from fallgate.fsm.kinds import MAX_RETRY_AFTER, OutcomeKind, sane_retry_after
from fallgate.fsm.policy.backoff import backoff_delay, cooldown_for, wake_spread
from fallgate.fsm.policy.model import Backoff, Cooldown
from hypothesis import given
from hypothesis import strategies as st

from helpers import chain

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


# -- raw pathological Retry-After values ------------------------------------------------------
#
# The engine only ever sees `Outcome.retry_after`, and `Outcome` sanitises it on
# construction; a host with its own classifier may put anything there. These values must
# come out finite and within [0, MAX_RETRY_AFTER], or None when they are not a number.

RAW_RETRY_AFTER = [
    (-5.0, 0.0),
    (-math.inf, 0.0),
    (0.0, 0.0),
    (12.5, 12.5),
    (math.nan, None),
    (math.inf, MAX_RETRY_AFTER),
    (1e308, MAX_RETRY_AFTER),
    ("171", 171.0),
    ("soon", None),
    (True, None),
]


@pytest.mark.parametrize(("raw", "clean"), RAW_RETRY_AFTER)
def test_raw_pathological_retry_after_is_sanitised_where_outcomes_are_built(raw, clean):
    assert sane_retry_after(raw) == clean
    assert Outcome.of("rate_limited", retry_after=raw).retry_after == clean


# Hostile headers through the real classification path (`fsm.classify_status`) into a
# chain of one target with one key: the only way on is to wait, so the engine's waits are
# observable. A Retry-After within the cap is waited out exactly (never less: no attempt
# before its not-before time); beyond the cap the turn fails at once instead of sleeping;
# with none usable the backoff applies. No wait is ever NaN, negative or over the cap.

CAP = 30.0
WIRE = [*HOSTILE, "3", "12.5", "29.999", "31", "Fri, 15 Jan 2027 08:00:30 GMT"]


@pytest.mark.parametrize("raw", WIRE)
@pytest.mark.parametrize("header", ["retry-after", "retry-after-ms"])
def test_hostile_retry_after_headers_never_make_the_engine_wait_early_or_unbounded(raw, header):
    p = chain("m", retry_after_cap=CAP)
    o = classify_status(429, {header: raw}, None, now=NOW)
    assert o.kind is OutcomeKind.RATE_LIMITED
    ra = o.retry_after
    assert ra is None or (math.isfinite(ra) and 0.0 <= ra <= MAX_RETRY_AFTER)
    played = play(p, [o, "success"])
    assert all(math.isfinite(w) and 0.0 <= w <= CAP for w in played.waits)
    if ra is not None and ra > CAP:
        assert played.waits == ()
        assert played.state == "failed"
        return
    expected = ra if ra is not None else p.backoff.initial
    # worst-case jitter (play's random is 1.0): the wake spread in full, within the cap
    spread = min(wake_spread(p.backoff, expected), CAP - expected)
    assert played.waits == (pytest.approx(expected + spread, abs=1e-9),)
    assert played.state == "done"
    first, second = [e.time for e in played.trace if e.action == "Attempt"]
    assert second - first >= expected - 1e-9  # the retry never comes before its not-before
    assert play(p, [o, "success"], random=0.0).waits == (pytest.approx(expected, abs=1e-9),)


def test_a_hostile_retry_after_in_the_body_is_bounded_too():
    """An error body's hint ("try again in ...") is parsed and clamped like a header."""
    p = chain("m", retry_after_cap=CAP)
    huge = classify_status(429, {}, "Rate limit reached. Please try again in 99999999999999m.")
    assert huge.retry_after == MAX_RETRY_AFTER
    assert play(p, [huge]).waits == ()
    small = classify_status(429, {}, "please try again in 750ms")
    assert small.retry_after == 0.75
    assert play(p, [small, "success"], random=0.0).waits == (0.75,)
