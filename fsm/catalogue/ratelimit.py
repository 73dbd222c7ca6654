"""What a provider's rate-limit headers say is left, and when it comes back.

Pure and tolerant: `parse_limits` reads the header families the registry's providers send
(`fsm.catalogue.registry.Provider.ratelimit` names the dialect; an unknown provider is read
in every dialect), and a value it cannot read is ignored: it never raises, whatever the
strings. The result is a `Limits` of plain numbers (counts >= 0, resets as seconds from
now in [0, `MAX_RETRY_AFTER`]) or None when nothing was readable.

The dialects (each cited in the registry entries that send it):

- ``openai``: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, the reset a
  Go-style duration (``"1s"``, ``"6m0s"``, ``"20ms"``, ``"1h2m3.5s"``) or a bare number
  of seconds (OpenAI, Groq);
- ``anthropic``: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
  {limit,remaining,reset}``, the reset an RFC 3339 time; the token limit is the most
  restrictive of the three token families;
- ``together``: ``x-ratelimit-{limit,remaining,reset}`` (requests, the reset in seconds)
  and ``x-tokenlimit-{limit,remaining}``;
- ``openrouter``: ``x-ratelimit-{limit,remaining,reset}`` with the reset as a Unix time
  in milliseconds (or seconds).
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from ..kinds import MAX_RETRY_AFTER

__all__ = ["DIALECTS", "Limits", "parse_duration", "parse_limits", "parse_rfc3339"]

DIALECTS: Final = ("openai", "anthropic", "together", "openrouter")

_UNITS: Final = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART: Final = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|us|µs|ns|h|m|s)")
_DURATION: Final = re.compile(r"(?:(?:\d+(?:\.\d+)?|\.\d+)(?:ms|us|µs|ns|h|m|s))+")
_INT: Final = re.compile(r"\d{1,18}")
_NUM: Final = re.compile(r"\d{1,18}(?:\.\d{1,9})?")
#: A count larger than this is no real limit (a proxy's sentinel): read as unknown.
MAX_COUNT: Final = 10**15


def _clamp(seconds: float) -> float | None:
    if math.isnan(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER)


def parse_duration(text: Any) -> float | None:
    """Seconds in a Go-style duration (``"6m0s"``, ``"20ms"``) or a bare number of seconds;
    None when `text` is neither (never raises)."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    t = text.strip()
    if _NUM.fullmatch(t):
        return _clamp(float(t))
    if not _DURATION.fullmatch(t):
        return None
    total = sum(float(n) * _UNITS[u] for n, u in _PART.findall(t))
    return _clamp(total)


def parse_rfc3339(text: Any, wall: float) -> float | None:
    """Seconds from `wall` (Unix time) until the RFC 3339 time `text` (0 when past);
    None when it is not one (never raises)."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    t = text.strip()
    if t[-1:] in ("Z", "z"):
        t = t[:-1] + "+00:00"
    try:
        at = datetime.datetime.fromisoformat(t)
    except ValueError:
        return None
    if at.tzinfo is None:
        return None  # RFC 3339 always has an offset: a naive time is no such value
    try:
        left = at.timestamp() - wall
    except (OverflowError, OSError, ValueError):
        return None
    return _clamp(max(left, 0.0))


def _count(text: Any) -> int | None:
    if not isinstance(text, str):
        return None
    t = text.strip()
    if not _INT.fullmatch(t):
        return None  # negatives (Azure's -1: "no limit"), fractions, garbage: unknown
    n = int(t)
    return n if n <= MAX_COUNT else None


def _epoch(text: Any, wall: float) -> float | None:
    """A Unix time in milliseconds (13 digits and more) or seconds -> seconds from `wall`."""
    if not isinstance(text, str):
        return None
    t = text.strip()
    if not _NUM.fullmatch(t):
        return None
    v = float(t)
    if v >= 1e12:
        v /= 1000.0
    if v < 1e9:  # not a Unix time of this century: a relative number of seconds
        return _clamp(v)
    return _clamp(max(v - wall, 0.0))


@attrs.frozen(slots=True)
class Limits:
    """What one reply said of its key's rate limits (None: not said).

    Counts are whole numbers >= 0; ``*_reset`` are seconds from the reply until that
    limit is whole again."""

    requests_remaining: int | None = None
    requests_reset: float | None = None
    requests_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset: float | None = None
    tokens_limit: int | None = None

    @property
    def empty(self) -> bool:
        """Nothing was said at all."""
        return all(getattr(self, f.name) is None for f in attrs.fields(Limits))

    def words(self) -> str:
        """A short safe summary (numbers only): ``requests 0/500 (reset 1.2s)``."""
        out = []
        for what in ("requests", "tokens"):
            rem = getattr(self, f"{what}_remaining")
            if rem is None:
                continue
            lim = getattr(self, f"{what}_limit")
            reset = getattr(self, f"{what}_reset")
            text = f"{what} {rem}" + (f"/{lim}" if lim is not None else "")
            out.append(text + (f" (reset {reset:g}s)" if reset is not None else ""))
        return ", ".join(out) or "no limits"


def _lower(headers: Any) -> dict[str, str]:
    """The headers as a dict of lower-cased names (the last value of a repeated one)."""
    out: dict[str, str] = {}
    try:
        items: Iterable[Any] = headers.items() if isinstance(headers, Mapping) else headers
        if hasattr(headers, "multi_items"):  # httpx.Headers: every value
            items = headers.multi_items()
        for pair in items:
            try:
                name, value = pair
            except (TypeError, ValueError):
                continue
            if isinstance(name, bytes):
                name = name.decode("latin-1")
            if isinstance(value, bytes):
                value = value.decode("latin-1")
            if isinstance(name, str) and isinstance(value, str):
                out[name.lower()] = value
    except Exception:  # a broken mapping: nothing readable
        return {}
    return out


def _openai(h: Mapping[str, str], wall: float) -> Limits:
    return Limits(
        _count(h.get("x-ratelimit-remaining-requests")),
        parse_duration(h.get("x-ratelimit-reset-requests")),
        _count(h.get("x-ratelimit-limit-requests")),
        _count(h.get("x-ratelimit-remaining-tokens")),
        parse_duration(h.get("x-ratelimit-reset-tokens")),
        _count(h.get("x-ratelimit-limit-tokens")),
    )


def _anthropic(h: Mapping[str, str], wall: float) -> Limits:
    pre = "anthropic-ratelimit-"
    tokens: list[tuple[int, float | None, int | None]] = []
    for family in ("tokens", "input-tokens", "output-tokens"):
        rem = _count(h.get(f"{pre}{family}-remaining"))
        if rem is not None:
            reset = parse_rfc3339(h.get(f"{pre}{family}-reset"), wall)
            tokens.append((rem, reset, _count(h.get(f"{pre}{family}-limit"))))
    tight = min(tokens, key=lambda x: x[0]) if tokens else (None, None, None)
    return Limits(
        _count(h.get(f"{pre}requests-remaining")),
        parse_rfc3339(h.get(f"{pre}requests-reset"), wall),
        _count(h.get(f"{pre}requests-limit")),
        *tight,
    )


def _reset(text: Any, wall: float) -> float | None:
    """A bare ``x-ratelimit-reset``: a duration with units, else seconds or a Unix time."""
    if isinstance(text, str) and any(c.isalpha() for c in text):
        return parse_duration(text)
    return _epoch(text, wall)


def _together(h: Mapping[str, str], wall: float) -> Limits:
    reset = _reset(h.get("x-ratelimit-reset"), wall)
    token_reset = _reset(h.get("x-tokenlimit-reset"), wall)
    return Limits(
        _count(h.get("x-ratelimit-remaining")),
        reset,
        _count(h.get("x-ratelimit-limit")),
        _count(h.get("x-tokenlimit-remaining")),
        token_reset if token_reset is not None else reset,
        _count(h.get("x-tokenlimit-limit")),
    )


def _openrouter(h: Mapping[str, str], wall: float) -> Limits:
    return Limits(
        _count(h.get("x-ratelimit-remaining")),
        _reset(h.get("x-ratelimit-reset"), wall),
        _count(h.get("x-ratelimit-limit")),
    )


_READERS: Final = {
    "openai": _openai,
    "anthropic": _anthropic,
    "together": _together,
    "openrouter": _openrouter,
}


def parse_limits(headers: Any, wall: float, dialect: str | None = None) -> Limits | None:
    """The rate limits `headers` state (a mapping or pairs, any case), in `dialect` (one of
    `DIALECTS`; None: the first dialect that reads anything, in `DIALECTS` order). `wall`
    is the reply's Unix time, for the dialects whose reset is a date. None when nothing is
    readable; never raises."""
    try:
        if not math.isfinite(wall):
            return None
        h = _lower(headers)
        if not h:
            return None
        order = (dialect,) if dialect in _READERS else DIALECTS
        for name in order:
            got = _READERS[name](h, wall)
            if not got.empty:
                return got
    except Exception:  # tolerant by contract: a header never breaks a turn
        return None
    return None
