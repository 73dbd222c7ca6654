"""Real rate limits for the fault server: per key and model, request and token buckets over
a fixed window, told on every reply in OpenAI's and Anthropic's header styles.

    FaultServer(limits={"gpt-x": {"requests": 60, "tokens": 6000, "window": 1.0}})
    srv.limit("gpt-x", requests=60, tokens=6000, window=1.0, style="openai")

Each key (bearer token) gets its own buckets per model; a window starts at a key's first
request and the next one begins when it is over (at a whole number of windows after that
start). A request costs one request and its tokens: the words of its messages (as `usage`
counts them) plus its ``max_tokens`` / ``max_completion_tokens``, or, when it gives none,
the words of the scripted answer. A request that fits is charged and played as scripted;
one that does not is answered 429 (``rate_limit_exceeded``) with ``Retry-After`` (whole
seconds, rounded up) and ``retry-after-ms`` until the window ends, and is not charged.
Every reply on a limited model carries the headers (``style``: ``"openai"``,
``"anthropic"`` or ``"both"``, the default): what is left after this request and when
each bucket is whole again (OpenAI: a duration such as ``"1.234s"``, ``"6m0s"``;
Anthropic: an RFC 3339 time).
"""

from __future__ import annotations

import datetime
import math
import threading
import time
from collections.abc import Mapping
from typing import Any, Final

import attrs

from . import replies
from .script import ScriptError

__all__ = ["STYLES", "Buckets", "Limit", "parse_limits_table"]

STYLES: Final = ("openai", "anthropic", "both")


def _positive(name: str) -> Any:
    def check(_: Any, a: attrs.Attribute[Any], v: Any) -> None:
        if v is None:
            return
        if isinstance(v, bool) or not isinstance(v, int | float) or not (v > 0 and v < 1e12):
            raise ScriptError(f"must be a positive number, got {v!r}", ("limits", name, a.name))

    return check


@attrs.frozen(slots=True)
class Limit:
    """One model's limits per key: `requests` and `tokens` per `window` seconds (None:
    that bucket is unlimited), told in header `style`."""

    model: str
    requests: int | None = attrs.field(default=None)
    tokens: int | None = attrs.field(default=None)
    window: float = 60.0
    style: str = "both"

    def __attrs_post_init__(self) -> None:
        for f in ("requests", "tokens", "window"):
            _positive(self.model)(self, attrs.fields_dict(Limit)[f], getattr(self, f))
        if self.style not in STYLES:
            raise ScriptError(
                f"must be one of {', '.join(STYLES)}, got {self.style!r}",
                ("limits", self.model, "style"),
            )


def parse_limits_table(raw: Any) -> dict[str, Limit]:
    """``{model: {requests, tokens, window, style}}`` -> validated `Limit`s."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ScriptError(f"expected a table of model -> limits, got {raw!r}", ("limits",))
    out = {}
    for model, spec in raw.items():
        if isinstance(spec, Limit):
            out[str(model)] = spec
            continue
        if not isinstance(spec, Mapping):
            raise ScriptError(f"expected a table, got {spec!r}", ("limits", str(model)))
        for k in spec:
            if k not in ("requests", "tokens", "window", "style"):
                raise ScriptError(
                    "unknown field; expected requests, tokens, window, style",
                    ("limits", str(model), str(k)),
                )
        out[str(model)] = Limit(str(model), **dict(spec))
    return out


def _duration(seconds: float) -> str:
    """OpenAI's reset format: ``"6m0s"``, ``"1.234s"``, ``"20ms"``."""
    if seconds < 1.0:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    m, s = divmod(seconds, 60.0)
    if m >= 1:
        return f"{int(m)}m{s:.0f}s"
    return f"{s:.3f}s"


def _rfc3339(seconds_from_now: float) -> str:
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds_from_now)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Bucket:
    __slots__ = ("requests", "start", "tokens")

    def __init__(self, start: float) -> None:
        self.start = start
        self.requests = 0
        self.tokens = 0


class Buckets:
    """Every key's buckets; `charge` is the one decision per request (thread-safe)."""

    def __init__(self, limits: Mapping[str, Limit] | None = None) -> None:
        self._lock = threading.Lock()
        self._limits: dict[str, Limit] = dict(limits or {})
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        #: Requests answered 429 by the limits, per model.
        self.refused: dict[str, int] = {}
        #: Requests charged (let through), per model, and their tokens.
        self.charged: dict[str, int] = {}
        self.charged_tokens: dict[str, int] = {}

    def set(self, limit: Limit) -> None:
        with self._lock:
            self._limits[limit.model] = limit
            self._buckets = {k: b for k, b in self._buckets.items() if k[1] != limit.model}

    def reset(self) -> None:
        with self._lock:
            self._buckets.clear()
            self.refused.clear()
            self.charged.clear()
            self.charged_tokens.clear()

    def limited(self, model: str) -> bool:
        return model in self._limits

    def charge(
        self, model: str, key: str | None, cost: int, now: float | None = None
    ) -> tuple[bool, list[tuple[str, str]], float]:
        """Charge one request of `cost` tokens to `key`'s buckets for `model`: (let
        through?, the headers every reply to it carries, seconds until its window ends)."""
        limit = self._limits.get(model)
        if limit is None:
            return True, [], 0.0
        now = time.monotonic() if now is None else now
        w = limit.window
        with self._lock:
            b = self._buckets.get((key or "", model))
            if b is None:
                b = self._buckets[(key or "", model)] = _Bucket(now)
            elif now >= b.start + w:
                b.start += w * math.floor((now - b.start) / w)
                b.requests = b.tokens = 0
            want = min(cost, limit.tokens) if limit.tokens is not None else cost
            fits = (limit.requests is None or b.requests + 1 <= limit.requests) and (
                limit.tokens is None or b.tokens + want <= limit.tokens
            )
            if fits:
                b.requests += 1
                b.tokens += want
                self.charged[model] = self.charged.get(model, 0) + 1
                self.charged_tokens[model] = self.charged_tokens.get(model, 0) + want
            else:
                self.refused[model] = self.refused.get(model, 0) + 1
            left = max(0.0, b.start + w - now)
            headers = _headers(limit, b, left)
        return fits, headers, left


def _headers(limit: Limit, b: _Bucket, left: float) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    rows = []
    if limit.requests is not None:
        rows.append(("requests", limit.requests, max(0, limit.requests - b.requests)))
    if limit.tokens is not None:
        rows.append(("tokens", limit.tokens, max(0, limit.tokens - b.tokens)))
    for what, lim, rem in rows:
        if limit.style in ("openai", "both"):
            out += [
                (f"x-ratelimit-limit-{what}", str(lim)),
                (f"x-ratelimit-remaining-{what}", str(rem)),
                (f"x-ratelimit-reset-{what}", _duration(left)),
            ]
        if limit.style in ("anthropic", "both"):
            out += [
                (f"anthropic-ratelimit-{what}-limit", str(lim)),
                (f"anthropic-ratelimit-{what}-remaining", str(rem)),
                (f"anthropic-ratelimit-{what}-reset", _rfc3339(left)),
            ]
    return out


def request_cost(request: Mapping[str, Any], text: str | None) -> int:
    """The tokens a request is charged: its prompt and what it asks for (`max_tokens`),
    else the length of the scripted answer `text`."""
    asked = request.get("max_completion_tokens", request.get("max_tokens"))
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 0:
        asked = replies.usage(request, text or "")["completion_tokens"]
    return int(replies.usage(request, "")["prompt_tokens"]) + int(asked)


def refusal(model: str, left: float) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The 429 of an empty bucket that refills in `left` seconds: its body and headers."""
    body = replies.error_body(
        f"Rate limit reached for {model}: try again in {left:.3f}s", "rate_limit_exceeded"
    )
    return body, [
        ("Retry-After", str(max(1, math.ceil(left)))),
        ("retry-after-ms", f"{left * 1000:.0f}"),
    ]
