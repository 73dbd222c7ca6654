"""What a provider's Retry-After says: headers and error bodies, parsed defensively.

``retry-after-ms``, ``retry-after`` (seconds or an HTTP date) and the hints error
bodies carry ("try again in 20s"); negative, zero, NaN, inf, 1e308, dates in the
past and garbage all give a finite answer in [0, `MAX_RETRY_AFTER`] or None.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import re
from collections.abc import Mapping

from ..kinds import MAX_RETRY_AFTER

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


#: The three HTTP-date forms of RFC 9110 section 5.6.7 (IMF-fixdate, RFC 850, asctime),
#: found inside a value that may hold several (duplicated headers arrive comma-joined).
_HTTP_DATE = re.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT"
    r"|(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day, \d{2}-[A-Z][a-z]{2}-\d{2} \d{2}:\d{2}:\d{2} GMT"
    r"|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4}"
)


def _date_seconds(text: str, now: float | None) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(text.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None or now is None:
        return None
    if when.tzinfo is None:  # asctime carries no zone: HTTP dates are GMT
        when = when.replace(tzinfo=datetime.UTC)
    try:
        return _clean(when.timestamp() - now)
    except (OverflowError, OSError, ValueError):
        return None


def retry_after_value(raw: str, now: float | None) -> float | None:
    """Seconds from one ``Retry-After`` value in any RFC 9110 form (delay-seconds or an
    HTTP-date), or from several: a header sent twice reaches us comma-joined
    (``3, 3``; ``Sun, 06 Nov 1994 08:49:37 GMT, Sun, 06 Nov ...``), and then the longest
    wait is kept (the server asked for at least that). None when nothing parses."""
    whole = parse_seconds(raw)
    if whole is not None:
        return whole
    dates = _HTTP_DATE.findall(raw)
    found = [v for d in dates if (v := _date_seconds(d, now)) is not None]
    if not dates:
        one = _date_seconds(raw, now)  # a date in a form the pattern does not spell
        if one is not None:
            return one
    rest = _HTTP_DATE.sub(",", raw)
    found += [v for part in rest.split(",") if (v := parse_seconds(part)) is not None]
    return max(found) if found else None


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
        found = retry_after_value(raw, now)
        if found is not None:
            return found
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
