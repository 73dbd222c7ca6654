"""What an error body says, read from the fields it carries.

Providers put the class of an error in structured fields more often than in
their HTTP status: a ``code`` or ``type`` (``insufficient_quota``,
``context_length_exceeded``, ``overloaded_error``, z.ai's ``1113``), a gRPC
``status`` (``RESOURCE_EXHAUSTED``, ``INVALID_ARGUMENT``), a Google
``ErrorInfo.reason`` (``API_KEY_INVALID``) or ``QuotaFailure`` quota id
(``GenerateRequestsPerDayPerProjectPerModel``). `read` looks at those first,
then at a short list of whole phrases for the providers whose only signal is
the message (Anthropic's "credit balance is too low", DeepSeek's
"Insufficient Balance", every wording of a context overflow). The rules are
checked against real bodies in `tests/data/error_catalogue.json`, each with
the public issue where a user met it (docs/providers.md: how to add one).

Pure: no I/O; bodies are parsed defensively (any shape, any size, nested
JSON inside a ``message`` string, Gemini's list of one error).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

import attrs

from ..kinds import OutcomeKind

__all__ = ["ErrorBody", "Reading", "parse", "quota_reset", "read"]

_K = OutcomeKind
_TEXT_MAX = 8192  # bodies are read up to this many characters
_DEPTH_MAX = 6  # nested objects followed (error -> innererror, message JSON, ...)


@attrs.frozen(slots=True)
class ErrorBody:
    """The structured fields of an error body.

    `codes`: the values of ``code``, ``type``, ``status`` (and ``innererror.code``,
    and ``error`` when it is a string), as sent; `reasons`: Google ``ErrorInfo``
    reasons; `quota_ids`: Google ``QuotaFailure`` quota ids and metrics;
    `message`: the error's message (the innermost one when messages nest)."""

    codes: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    quota_ids: tuple[str, ...] = ()
    message: str = ""


@attrs.frozen(slots=True)
class Reading:
    """What a body says an error is: `kind`, from which field (`why`), and whether
    that came from a structured field (`structured`) or from the message's words."""

    kind: OutcomeKind
    why: str
    structured: bool


# -- parsing -----------------------------------------------------------------------------------


def _load(body: Any) -> Any:
    if isinstance(body, bytes):
        body = body[:_TEXT_MAX].decode("utf-8", "replace")
    if isinstance(body, str):
        text = body.strip()[:_TEXT_MAX]
        if text[:1] in ("{", "["):
            try:
                return json.loads(text)
            except (ValueError, RecursionError):
                return text
        return text
    return body


def _objects(obj: Any, depth: int = 0) -> Iterator[Mapping[str, Any]]:
    """The error objects in a body, outermost first: the body itself, its ``error``,
    ``innererror`` and ``metadata`` objects, a JSON body inside a ``message``
    string, and the first element of a list."""
    if depth > _DEPTH_MAX:
        return
    if isinstance(obj, list):
        if obj:
            yield from _objects(obj[0], depth + 1)
        return
    if not isinstance(obj, Mapping):
        return
    yield obj
    for key in ("error", "innererror"):
        inner = obj.get(key)
        if isinstance(inner, Mapping | list):
            yield from _objects(inner, depth + 1)
    message = obj.get("message")
    if isinstance(message, str) and message.lstrip()[:1] in ("{", "["):
        yield from _objects(_load(message), depth + 1)


def _scalar(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | str):
        text = str(value).strip()
        return text[:200] or None
    return None


def parse(body: Any) -> ErrorBody:
    """The structured fields of `body` (a JSON text, bytes, or the SDK's parsed body)."""
    obj = _load(body)
    if isinstance(obj, str):
        return ErrorBody(message=obj[:_TEXT_MAX])
    codes: list[str] = []
    reasons: list[str] = []
    quota_ids: list[str] = []
    message = ""
    for o in _objects(obj):
        for key in ("code", "type", "status"):
            v = _scalar(o.get(key))
            if v is not None and v not in codes:
                codes.append(v)
        err = o.get("error")
        if isinstance(err, str) and err.strip():
            codes.append(err.strip()[:200])
            message = message or err  # Ollama: {"error": "the input length exceeds ..."}
        m = o.get("message")
        if isinstance(m, str) and m.strip() and m.lstrip()[:1] not in ("{", "["):
            message = m  # the innermost message wins
        elif not message and isinstance(o.get("detail"), str):
            message = o["detail"]
        details = o.get("details")
        if isinstance(details, list):
            for d in details[:20]:
                if not isinstance(d, Mapping):
                    continue
                r = _scalar(d.get("reason"))
                if r is not None:
                    reasons.append(r)
                violations = d.get("violations")
                if isinstance(violations, list):
                    for v in violations[:20]:
                        if isinstance(v, Mapping):
                            for key in ("quotaId", "quotaMetric"):
                                q = _scalar(v.get(key))
                                if q is not None:
                                    quota_ids.append(q)
    return ErrorBody(tuple(codes), tuple(reasons), tuple(quota_ids), message[:_TEXT_MAX])


# -- the rules -----------------------------------------------------------------------------------

#: ``code`` / ``type`` / ``status`` values (lower case) that name the class outright, at any
#: provider. Numeric business codes mean something only at the provider that sent them
#: (z.ai's ``1113``): those live in the registry (`fsm.catalogue.registry`, ``error_codes``).
CODE_KINDS: Final[Mapping[str, OutcomeKind]] = {
    # quota: a balance, a credit or a hard spending limit; waiting does not restore it
    "insufficient_quota": _K.QUOTA,  # OpenAI 429
    "billing_hard_limit_reached": _K.QUOTA,  # OpenAI 400
    "billing_error": _K.QUOTA,  # Anthropic 402
    "insufficient_balance": _K.QUOTA,
    # context overflow
    "context_length_exceeded": _K.CONTEXT_TOO_LONG,  # OpenAI, Groq
    "exceed_context_size_error": _K.CONTEXT_TOO_LONG,  # llama.cpp server (400, formerly 500)
    "request_too_large": _K.CONTEXT_TOO_LONG,  # Anthropic 413
    "model_context_window_exceeded": _K.CONTEXT_TOO_LONG,  # z.ai
    # content filter
    "content_filter": _K.CONTENT_FILTERED,  # Azure OpenAI 400
    "content_policy_violation": _K.CONTENT_FILTERED,
    # OpenAI 400 "Invalid prompt: your prompt was flagged as potentially violating our usage
    # policy" (https://platform.openai.com/docs/guides/reasoning#advice-on-prompting; met in
    # https://github.com/openai/codex/issues/7250): the prompt, not its shape, is refused
    "invalid_prompt": _K.CONTENT_FILTERED,
    "responsibleaipolicyviolation": _K.CONTENT_FILTERED,  # Azure innererror.code
    # the model is not there
    "model_not_found": _K.NOT_FOUND,  # OpenAI, Groq
    "model_decommissioned": _K.NOT_FOUND,  # Groq 400
    "notfounderror": _K.NOT_FOUND,  # vLLM 404 type
    "not_found_error": _K.NOT_FOUND,  # Anthropic 404
    "not_found": _K.NOT_FOUND,  # gRPC status (Gemini)
    # the key
    "invalid_api_key": _K.AUTH,  # OpenAI 401
    "authentication_error": _K.AUTH,  # Anthropic 401
    "permission_error": _K.AUTH,  # Anthropic 403
    "unauthenticated": _K.AUTH,  # gRPC status
    "permission_denied": _K.AUTH,  # gRPC status
    # the server
    "overloaded_error": _K.OVERLOADED,  # Anthropic 529
    "unavailable": _K.OVERLOADED,  # gRPC status (Gemini 503)
    "capacity_exceeded": _K.OVERLOADED,  # Groq 498
    # rate limits (refined below: a per-day limit or a request larger than the limit is quota)
    "rate_limit_exceeded": _K.RATE_LIMITED,  # OpenAI, Groq
    "rate_limit_error": _K.RATE_LIMITED,  # Anthropic, OpenRouter
    "rate_limited": _K.RATE_LIMITED,  # Mistral
    "resource_exhausted": _K.RATE_LIMITED,  # gRPC status (Gemini 429)
}

#: Google ``ErrorInfo.reason`` values.
REASON_KINDS: Final[Mapping[str, OutcomeKind]] = {
    "api_key_invalid": _K.AUTH,  # Gemini answers a bad key with 400 INVALID_ARGUMENT
    "api_key_expired": _K.AUTH,
    "api_key_service_blocked": _K.AUTH,
}

# A quota id or limit name that counts per day (or longer) vs per minute (or shorter).
_PER_DAY = re.compile(r"per[-_ ]?day|daily|per[-_ ]?month|monthly", re.IGNORECASE)
_PER_MINUTE = re.compile(r"per[-_ ]?(minute|min|second|sec)\b|perminute|persecond", re.IGNORECASE)
# Groq names the limit's unit: "on tokens per day (TPD)", "(RPD)"; OpenRouter its id:
# "Rate limit exceeded: free-models-per-day".
_DAY_UNIT = re.compile(r"\((?:TPD|RPD|ASD|ASH)\)|\bfree-models-per-day", re.IGNORECASE)
# A request that alone exceeds a per-period limit ("Limit 6000, Requested 14137") never fits:
# waiting on this key does not help.
_LIMIT_REQUESTED = re.compile(r"\bLimit\s+(\d+),\s*(?:Used\s+\d+,\s*)?Requested\s+(\d+)")
_REQUEST_TOO_LARGE = re.compile(r"request too large", re.IGNORECASE)
# Gemini's free tier for a model the project may not use: "limit: 0".
_LIMIT_ZERO = re.compile(r"\blimit:\s*0\b")

#: Whole phrases, for bodies whose only signal is the message. (pattern, kind, what it is)
PHRASES: Final[tuple[tuple[re.Pattern[str], OutcomeKind, str], ...]] = tuple(
    (re.compile(p, re.IGNORECASE), k, w)
    for p, k, w in (
        # quota: a balance or credit that is spent
        (r"credit balance is too low", _K.QUOTA, "credit balance too low"),
        (r"insufficient (?:account )?balance", _K.QUOTA, "insufficient balance"),
        (r"insufficient credits", _K.QUOTA, "insufficient credits"),
        (r"requires more credits", _K.QUOTA, "needs more credits"),
        (r"more credits are required", _K.QUOTA, "needs more credits"),
        (r"credit limit exceeded", _K.QUOTA, "credit limit exceeded"),
        (r"paid balance is insufficient", _K.QUOTA, "insufficient balance"),
        (r"used all available credits|monthly spending limit", _K.QUOTA, "spending limit"),
        (r"exceeded your current quota", _K.QUOTA, "quota exceeded"),
        (r"billing hard limit", _K.QUOTA, "billing hard limit"),
        (r"余额不足", _K.QUOTA, "insufficient balance"),
        (r"rate limit exceeded: [\w-]*per-day", _K.QUOTA, "a per-day limit"),  # OpenRouter
        # z.ai 1308/1310 (https://docs.z.ai/api-reference/api-code): a plan's usage window
        (r"usage limit reached for \d+ hours?", _K.QUOTA, "a usage window's limit"),
        (r"weekly/monthly limit exhausted", _K.QUOTA, "a usage window's limit"),
        # context overflow, in every wording met
        (r"maximum context length", _K.CONTEXT_TOO_LONG, "maximum context length"),
        (r"prompt is too long", _K.CONTEXT_TOO_LONG, "prompt is too long"),
        (r"exceeds the available context size", _K.CONTEXT_TOO_LONG, "context size"),
        (r"input length exceeds the context length", _K.CONTEXT_TOO_LONG, "context length"),
        (r"prompt too long; exceeded (?:max )?context length", _K.CONTEXT_TOO_LONG, "context"),
        (
            r"input token count.{0,40}exceeds the maximum number of tokens",
            _K.CONTEXT_TOO_LONG,
            "input token count",
        ),
        (r"too large for model with \d+ maximum context", _K.CONTEXT_TOO_LONG, "context"),
        (r"`inputs` tokens \+ `max_new_tokens` must be <=", _K.CONTEXT_TOO_LONG, "context"),
        (r"context (?:window|length) (?:exceeded|exceeds)", _K.CONTEXT_TOO_LONG, "context"),
        (r"exceed(?:s|ed)? (?:the )?context (?:limit|window)", _K.CONTEXT_TOO_LONG, "context"),
        # z.ai 1261 (https://docs.z.ai/api-reference/api-code)
        (r"prompt exceeds max length", _K.CONTEXT_TOO_LONG, "prompt exceeds max length"),
        # content filter
        (r"content management policy", _K.CONTENT_FILTERED, "content management policy"),
        (
            r"flagged as potentially violating our usage policy",
            _K.CONTENT_FILTERED,
            "flagged by the usage policy",
        ),
        # the model is not there
        (
            r"model\W{0,3}[\w./:@-]{0,120}\W{0,3} (?:does not exist|not found)",
            _K.NOT_FOUND,
            "model not found",
        ),
        (r"has been decommissioned", _K.NOT_FOUND, "model decommissioned"),
        (r"unknown model|model not found", _K.NOT_FOUND, "unknown model"),
        (r"not a valid model", _K.NOT_FOUND, "invalid model id"),
        # the server
        (r"\boverloaded\b", _K.OVERLOADED, "overloaded"),
        (r"experiencing high demand", _K.OVERLOADED, "high demand"),
    )
)


# The quota phrases that name money spent (not a rate or a period's quota).
_BALANCE: Final = frozenset(
    {
        "credit balance too low",
        "insufficient balance",
        "insufficient credits",
        "needs more credits",
        "credit limit exceeded",
        "spending limit",
        "billing hard limit",
    }
)


def _refine_rate_limit(b: ErrorBody, why: str) -> Reading:
    """A rate-limit code: per-minute limits stay rate limits; a per-day limit, a
    free tier with limit 0, or a request larger than the limit itself is quota."""
    day = [q for q in b.quota_ids if _PER_DAY.search(q)]
    if day:
        return Reading(_K.QUOTA, f"{why}, per-day quota {day[0]}", True)
    if b.quota_ids and all(_PER_MINUTE.search(q) for q in b.quota_ids):
        return Reading(_K.RATE_LIMITED, f"{why}, per-minute quota {b.quota_ids[0]}", True)
    m = _DAY_UNIT.search(b.message)
    if m:
        return Reading(_K.QUOTA, f"{why}, a per-day limit ({m.group(0).strip('()')})", True)
    if _LIMIT_ZERO.search(b.message):
        return Reading(_K.QUOTA, f"{why}, limit: 0 (no quota for this model)", True)
    m = _LIMIT_REQUESTED.search(b.message)
    if m and int(m.group(2)) > int(m.group(1)) and _REQUEST_TOO_LARGE.search(b.message):
        return Reading(_K.QUOTA, f"{why}, the request alone exceeds the limit", True)
    return Reading(_K.RATE_LIMITED, why, True)


def read(body: Any) -> Reading | None:
    """What `body` says the error is (None: nothing specific; the status decides).

    Order: Google reasons, then codes (a rate-limit code refined by its quota
    ids and limit names), then the message's phrases."""
    b = parse(body)
    for r in b.reasons:
        kind = REASON_KINDS.get(r.lower())
        if kind is not None:
            return Reading(kind, f"reason {r}", True)
    rate: Reading | None = None
    for c in b.codes:
        kind = CODE_KINDS.get(c.lower())
        if kind is None:
            continue
        if kind is _K.RATE_LIMITED:
            rate = rate or _refine_rate_limit(b, f"{c}")
            continue
        return Reading(kind, f"{c}", True)
    if rate is not None:
        if rate.kind is _K.RATE_LIMITED:
            # a spent balance inside a rate-limit code ("quota exceeded" alone is not one:
            # Gemini says it for per-minute limits too)
            for pattern, kind, what in PHRASES:
                if kind is _K.QUOTA and what in _BALANCE and pattern.search(b.message):
                    return Reading(_K.QUOTA, f"{rate.why}: {what}", False)
        return rate
    if b.quota_ids:
        return _refine_rate_limit(b, "quota failure")
    for pattern, kind, what in PHRASES:
        if pattern.search(b.message):
            return Reading(kind, what, False)
    return None


# -- when a quota comes back -----------------------------------------------------------------------

#: z.ai's usage windows (1308 five-hour, 1310 weekly/monthly, 1316-1321) name their end:
#: "Your limit will reset at 2026-09-09 05:38:28" (https://docs.z.ai/api-reference/api-code,
#: ``{next_flush_time}``), in Beijing time (UTC+8; met in
#: https://github.com/hugalafutro/model-hotel/pull/955).
_RESET_AT = re.compile(r"reset at (\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})")
_BEIJING = 8 * 3600.0
#: Gemini's per-day quotas "reset at midnight Pacific time"
#: (https://ai.google.dev/gemini-api/docs/rate-limits).
_GEMINI_DAY = re.compile(r"generativelanguage|PerDayPerProject|per_day", re.IGNORECASE)
_PACIFIC = "America/Los_Angeles"
#: A reset further away than this is not believed (the cooldown cap applies instead).
RESET_MAX = 40 * 86400.0


def quota_reset(body: Any, now: float) -> float | None:
    """Seconds from `now` (epoch seconds) until the quota a body reports comes back, when
    the body says (z.ai's dated reset) or its provider documents it (Gemini's per-day
    quota: the next midnight Pacific); None when unknown, past or beyond `RESET_MAX`."""
    b = parse(body)
    m = _RESET_AT.search(b.message)
    at: float | None = None
    if m is not None:
        import calendar

        y, mo, d, h, mi, se = (int(g) for g in m.groups())
        try:
            at = calendar.timegm((y, mo, d, h, mi, se, 0, 0, 0)) - _BEIJING
        except (ValueError, OverflowError):
            at = None
    elif any(_PER_DAY.search(q) for q in b.quota_ids) and any(
        _GEMINI_DAY.search(q) for q in b.quota_ids
    ):
        at = _next_midnight(now, _PACIFIC)
    if at is None:
        return None
    left = at - now
    return left if 0.0 < left <= RESET_MAX else None


def _next_midnight(now: float, zone: str) -> float | None:
    """The next midnight in time zone `zone` after `now` (None without tz data)."""
    import datetime as dt

    try:
        from zoneinfo import ZoneInfo

        tz = ZoneInfo(zone)
    except Exception:  # no tz database on this host: the reset is unknown
        return None
    local = dt.datetime.fromtimestamp(now, tz)
    nxt = (local + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return nxt.timestamp()
