"""Backoff and Retry-After arithmetic, safe for any input.

Exponential growth is computed in log space so that attempt 10**6 neither
overflows nor loses the cap; Retry-After values from the wire are parsed
defensively (negative, zero, NaN, inf, 1e308, dates in the past, garbage).
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Callable, Mapping

from .outcomes import MAX_RETRY_AFTER
from .policy import Backoff, Cooldown


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


_NUMBER = re.compile(r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*$")
_BODY_HINT = re.compile(
    r"(?:try again in|retry after|retry in|please wait)\s*([0-9]+(?:\.[0-9]+)?)\s*"
    r"(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?)?",
    re.IGNORECASE,
)


def _clean(seconds: float) -> float | None:
    if math.isnan(seconds):
        return None
    if seconds <= 0:
        return 0.0
    return min(seconds, MAX_RETRY_AFTER)


def _number(text: str | None) -> float | None:
    """The number `text` holds (maybe inf, never NaN), or None when it is not one."""
    if text is None or not _NUMBER.match(text):
        return None
    try:
        return float(text)
    except (ValueError, OverflowError):
        return None


def parse_seconds(text: str | None) -> float | None:
    """A delta-seconds value, or None when it is not a number."""
    value = _number(text)
    return None if value is None else _clean(value)


def parse_retry_after(
    headers: Mapping[str, str] | None,
    body: str | None = None,
    now: float | None = None,
) -> float | None:
    """Seconds to wait, from `retry-after-ms`, `retry-after` (seconds or an
    HTTP date) or a hint in the error body; None when nothing usable.

    `now` is the wall-clock time (epoch seconds) for HTTP dates; a date in the
    past means 0. Results are finite and within [0, MAX_RETRY_AFTER].
    """
    h = {k.lower(): v for k, v in (headers or {}).items()} if headers else {}
    ms = _number(h.get("retry-after-ms"))
    if ms is not None:  # converted, then clamped: 1e308 ms is the one-day cap, not 86.4 s
        return _clean(ms / 1000.0)
    raw = h.get("retry-after")
    if raw is not None:
        s = parse_seconds(raw)
        if s is not None:
            return s
        try:
            when = email.utils.parsedate_to_datetime(raw.strip())
        except (TypeError, ValueError, IndexError, OverflowError):
            when = None
        if when is not None and now is not None:
            try:
                return _clean(when.timestamp() - now)
            except (OverflowError, OSError, ValueError):
                return None
    if body:
        m = _BODY_HINT.search(body[:4096])
        if m:
            try:
                value = float(m.group(1))
            except (ValueError, OverflowError):
                return None
            unit = (m.group(2) or "s").lower()
            if unit.startswith("ms") or unit.startswith("milli"):
                value /= 1000.0
            elif unit.startswith("m"):
                value *= 60.0
            return _clean(value)
    return None
