"""The rate-limit header parsers (`fsm.catalogue.ratelimit`): each provider's documented
format, and tolerance (a value that cannot be read is ignored; nothing ever raises)."""

from __future__ import annotations

import datetime

import pytest
from fallgate.fsm.catalogue.ratelimit import (
    DIALECTS,
    Limits,
    parse_duration,
    parse_limits,
    parse_rfc3339,
)
from fallgate.fsm.catalogue.registry import PROVIDERS
from fallgate.fsm.kinds import MAX_RETRY_AFTER
from hypothesis import given, settings
from hypothesis import strategies as st

WALL = datetime.datetime(2025, 8, 21, 12, 40, 50, tzinfo=datetime.UTC).timestamp()


def test_openai_headers_as_documented() -> None:
    """OpenAI, https://platform.openai.com/docs/guides/rate-limits ("Rate limits in
    headers": x-ratelimit-limit-requests 60, -tokens 150000, remaining 59 / 149984,
    reset-requests "1s", reset-tokens "6m0s")."""
    got = parse_limits(
        {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-limit-tokens": "150000",
            "x-ratelimit-remaining-requests": "59",
            "x-ratelimit-remaining-tokens": "149984",
            "x-ratelimit-reset-requests": "1s",
            "x-ratelimit-reset-tokens": "6m0s",
        },
        WALL,
        "openai",
    )
    assert got == Limits(59, 1.0, 60, 149984, 360.0, 150000)


def test_groq_headers_as_documented() -> None:
    """Groq, https://console.groq.com/docs/rate-limits (its example: remaining-requests
    14370, reset-requests "2m59.56s", remaining-tokens 17997, reset-tokens "7.66s")."""
    got = parse_limits(
        {
            "x-ratelimit-limit-requests": "14400",
            "x-ratelimit-limit-tokens": "18000",
            "x-ratelimit-remaining-requests": "14370",
            "x-ratelimit-remaining-tokens": "17997",
            "x-ratelimit-reset-requests": "2m59.56s",
            "x-ratelimit-reset-tokens": "7.66s",
        },
        WALL,
        PROVIDERS["groq"].ratelimit,
    )
    assert got is not None
    assert got.requests_remaining == 14370 and got.tokens_remaining == 17997
    assert got.requests_reset == pytest.approx(179.56)
    assert got.tokens_reset == pytest.approx(7.66)


def test_anthropic_headers_as_documented() -> None:
    """Anthropic, https://docs.anthropic.com/en/api/rate-limits (the reset of every
    family is an RFC 3339 time; the token limit in force is the most restrictive of
    tokens / input-tokens / output-tokens)."""
    got = parse_limits(
        {
            "anthropic-ratelimit-requests-limit": "1000",
            "anthropic-ratelimit-requests-remaining": "999",
            "anthropic-ratelimit-requests-reset": "2025-08-21T12:40:59Z",
            "anthropic-ratelimit-input-tokens-limit": "80000",
            "anthropic-ratelimit-input-tokens-remaining": "80000",
            "anthropic-ratelimit-input-tokens-reset": "2025-08-21T12:40:59Z",
            "anthropic-ratelimit-output-tokens-limit": "16000",
            "anthropic-ratelimit-output-tokens-remaining": "15000",
            "anthropic-ratelimit-output-tokens-reset": "2025-08-21T12:41:00Z",
        },
        WALL,
        PROVIDERS["anthropic"].ratelimit,
    )
    assert got == Limits(999, 9.0, 1000, 15000, 10.0, 16000)


def test_together_headers_as_documented() -> None:
    """Together, https://support.together.ai/en/articles/8988956-rate-limits
    (x-ratelimit-limit / -remaining / -reset for requests, reset in seconds)."""
    got = parse_limits(
        {"x-ratelimit-limit": "600", "x-ratelimit-remaining": "598", "x-ratelimit-reset": "2"},
        WALL,
        PROVIDERS["together"].ratelimit,
    )
    assert got == Limits(598, 2.0, 600, None, 2.0, None)


def test_openrouter_headers_as_documented() -> None:
    """OpenRouter, https://openrouter.ai/docs/api-reference/limits (X-RateLimit-Reset is a
    Unix time in milliseconds)."""
    at = int((WALL + 12.5) * 1000)
    got = parse_limits(
        {"X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(at)},
        WALL,
        PROVIDERS["openrouter"].ratelimit,
    )
    assert got is not None and got.requests_remaining == 0
    assert got.requests_reset == pytest.approx(12.5)


def test_deepseek_sends_none_and_is_read_in_every_dialect() -> None:
    """DeepSeek, https://api-docs.deepseek.com/quick_start/rate_limit: no rate limit, no
    headers; the registry names no dialect, so whatever a proxy adds is still read."""
    assert PROVIDERS["deepseek"].ratelimit is None
    assert parse_limits({"content-type": "application/json"}, WALL) is None
    got = parse_limits({"x-ratelimit-remaining-requests": "3"}, WALL, None)
    assert got is not None and got.requests_remaining == 3


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("12", 12.0),
        ("0.5", 0.5),
        ("250us", 0.00025),
        (" 7.66s ", 7.66),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "1x", "-1s", "1s2", "nan", "inf", "1e3s", "1 s"])
def test_bad_durations_are_ignored(text: str) -> None:
    assert parse_duration(text) is None


def test_values_that_cannot_be_read_are_ignored_not_guessed() -> None:
    """Azure's -1 ("no limit") and garbage: unknown, and the rest of the reply still read."""
    got = parse_limits(
        {
            "x-ratelimit-remaining-tokens": "-1",
            "x-ratelimit-reset-tokens": "soon",
            "x-ratelimit-remaining-requests": "4",
        },
        WALL,
        "openai",
    )
    assert got == Limits(requests_remaining=4)
    assert parse_rfc3339("2025-08-21T12:40:59", WALL) is None  # no offset: not RFC 3339
    assert parse_rfc3339("2025-08-21T12:00:00+00:00", WALL) == 0.0  # past: now
    assert parse_duration("9999999h") == MAX_RETRY_AFTER


_header_names = st.sampled_from(
    [
        f"{p}{s}"
        for p in ("x-ratelimit-", "anthropic-ratelimit-", "X-RateLimit-", "x-tokenlimit-")
        for s in (
            "remaining-requests",
            "reset-requests",
            "limit-tokens",
            "remaining-tokens",
            "reset-tokens",
            "remaining",
            "reset",
            "limit",
            "requests-reset",
            "tokens-remaining",
            "input-tokens-remaining",
            "output-tokens-reset",
        )
    ]
)
_values = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"-?[0-9.]{0,20}(h|m|s|ms|us|ns)?", fullmatch=True),
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


@settings(max_examples=400, deadline=None)
@given(
    headers=st.lists(st.tuples(st.one_of(_header_names, st.text(max_size=20)), _values)),
    wall=st.floats(allow_nan=True, allow_infinity=True),
    dialect=st.one_of(st.none(), st.sampled_from(DIALECTS), st.text(max_size=8)),
)
def test_never_raises_and_gives_sane_numbers(
    headers: list[tuple[str, str]], wall: float, dialect: str | None
) -> None:
    """Property: for any header names and values (any strings), any wall time and any
    dialect name, `parse_limits` returns None or a `Limits` whose counts are whole
    numbers >= 0 and whose resets are finite seconds in [0, MAX_RETRY_AFTER]; it never
    raises."""
    got = parse_limits(headers, wall, dialect)
    if got is None:
        return
    for what in ("requests", "tokens"):
        for count in (getattr(got, f"{what}_remaining"), getattr(got, f"{what}_limit")):
            assert count is None or (isinstance(count, int) and count >= 0)
        reset = getattr(got, f"{what}_reset")
        assert reset is None or 0.0 <= reset <= MAX_RETRY_AFTER


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80), st.floats(allow_nan=True, allow_infinity=True))
def test_single_value_parsers_never_raise(text: str, wall: float) -> None:
    """Property: the duration and RFC 3339 readers take any string and any wall time and
    answer None or seconds in [0, MAX_RETRY_AFTER]."""
    for got in (parse_duration(text), parse_rfc3339(text, wall)):
        assert got is None or 0.0 <= got <= MAX_RETRY_AFTER
