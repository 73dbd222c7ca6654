"""What an attempt produced, classified.

The engine never looks at exceptions or HTTP responses: a classifier turns
them into one `Outcome`, and the machine's triggers are the outcome kinds.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import attrs


class OutcomeKind(enum.StrEnum):
    """The outcome classes; each is a trigger of the machine (its meaning: `fsm.traits`)."""

    SUCCESS = "success"
    TRANSPORT = "transport"  # timeout, connection reset, DNS, pre-first-byte read errors
    RATE_LIMITED = "rate_limited"  # 429 (with or without Retry-After)
    QUOTA = "quota"  # 429 insufficient_quota, 402
    OVERLOADED = "overloaded"  # 500, 502, 503, 504, 529, 429 "overloaded"
    AUTH = "auth"  # 401, 403
    NOT_FOUND = "not_found"  # 404 model, 400 unknown model
    CONTEXT_TOO_LONG = "context_too_long"
    CONTENT_FILTERED = "content_filtered"
    BAD_REQUEST = "bad_request"  # any other 4xx, and unclassifiable errors
    STREAM_INTERRUPTED = "stream_interrupted"  # failure after the first chunk was delivered
    CANCELLED = "cancelled"  # asyncio cancellation, KeyboardInterrupt


#: Retry-After values are clamped to one day: keeps every sum finite.
MAX_RETRY_AFTER = 86_400.0


def sane_retry_after(value: float | None) -> float | None:
    """None for NaN/non-numbers, 0 for negatives, at most MAX_RETRY_AFTER."""
    if value is None or isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if math.isnan(v):
        return None
    return min(max(v, 0.0), MAX_RETRY_AFTER)


@attrs.frozen(slots=True)
class Outcome:
    """One classified attempt result.

    `retry_after` is already parsed and sanitised (seconds, finite, >= 0) or
    None. `detail` is a short human text that must never hold a secret; the
    original exception rides along in `error` (excluded from repr/eq).
    `client_side`: the fault is this attempt's, not the target's: the host saw the
    target answer other attempts while this one was out (its connection failed, the
    target is up), the attempt's time ran out before it reached the network (the
    client was busy), or the timer that ended it fired long past its due time (the
    process was starved, so whatever the target did went unobserved). The adapter sets
    it on transport faults; what it changes: `fsm.traits.Traits.connection_level`.
    """

    kind: OutcomeKind = attrs.field(converter=OutcomeKind)
    status: int | None = None
    retry_after: float | None = attrs.field(default=None, converter=sane_retry_after)
    detail: str = ""
    partial: str | None = None
    client_side: bool = False
    value: Any = attrs.field(default=None, repr=False, eq=False)
    error: BaseException | None = attrs.field(default=None, repr=False, eq=False)

    @classmethod
    def success(cls, value: Any = None) -> Outcome:
        return cls(OutcomeKind.SUCCESS, value=value)

    @classmethod
    def of(cls, kind: str | OutcomeKind, **kw: Any) -> Outcome:
        return cls(OutcomeKind(kind), **kw)

    @property
    def cause(self) -> str:
        """A short label safe to keep and print (kind and status, never the provider's
        words): what a cooldown remembers as its cause, e.g. ``quota (HTTP 402)``."""
        kind = str.__str__(self.kind)  # the value, without the enum's slower attribute lookup
        return kind if self.status is None else f"{kind} (HTTP {self.status})"


SUCCESS = Outcome(OutcomeKind.SUCCESS)
CANCELLED = Outcome(OutcomeKind.CANCELLED, detail="cancelled")
