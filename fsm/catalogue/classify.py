"""What an error means: HTTP status, headers and body (and plain exceptions) into outcomes.

The one home of classification. The SDK-exception reader (`providers.openai.exceptions`)
only takes the status, headers and body text out of what the SDK raised and hands them
here once: `classify_response` for an HTTP error, `classify_error_object` for an error
object that came without a status (a stream's error event, a failed response). What the
words and codes of a body say is `fsm.catalogue.error_body`, a provider's own quirks
`fsm.catalogue.registry`, a Retry-After `fsm.catalogue.retry_after`.
This runs on the host side (it may read the wall clock for HTTP dates).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Mapping
from typing import Any

from ..kinds import Outcome, OutcomeKind, status_kind
from ..redact import safe_url
from . import error_body
from .registry import Provider
from .retry_after import parse_retry_after


def _body_text(body: Any) -> str:
    if body is None:
        return ""
    if isinstance(body, bytes):
        return body[:8192].decode("utf-8", "replace")
    if isinstance(body, str):
        return body[:8192]
    try:
        return json.dumps(body)[:8192]
    except (TypeError, ValueError):
        return str(body)[:8192]


def body_kind(body: str) -> OutcomeKind | None:
    """What an error body says, regardless of status (None if nothing specific):
    its structured fields first, then whole phrases (`fsm.catalogue.error_body.read`)."""
    reading = error_body.read(body)
    return None if reading is None else reading.kind


def _body_decides(status: int, reading: error_body.Reading) -> bool:
    """Whether what the body says overrides the status.

    A structured field (a code, a gRPC status, a reason, a quota id) is more
    precise than the status wherever it comes (a billing code in a 400, a
    context-overflow type in llama.cpp's 500). Words alone decide only within
    4xx, and a 429 keeps its rate-limit meaning unless they name a spent
    balance or an overloaded server; a 408 stays a transport fault."""
    if status == 408:
        return False
    if reading.structured:
        return True
    if status >= 500:
        return False
    if status == 429:
        return reading.kind in (OutcomeKind.QUOTA, OutcomeKind.OVERLOADED)
    if reading.kind is OutcomeKind.OVERLOADED:
        return False  # "overloaded" in a 4xx's words is no server fault
    return True


def classify_status(
    status: int,
    headers: Mapping[str, str] | None = None,
    body: Any = None,
    *,
    now: float | None = None,
    error: BaseException | None = None,
) -> Outcome:
    """Map an HTTP error response to an outcome (the outcome table in docs/design.md;
    the rules in docs/providers.md, "How provider errors are classified")."""
    text = _body_text(body)
    detail = _short(text) or f"HTTP {status}"
    if 200 <= status < 300:
        ra = parse_retry_after(headers, text, now if now is not None else time.time())
        return Outcome(OutcomeKind.SUCCESS, status=status, retry_after=ra, detail=detail)
    redirect = _redirect(status, headers)
    if redirect is not None:
        return Outcome(OutcomeKind.NOT_FOUND, status=status, detail=redirect, error=error)
    if status < 400:
        # a 3xx without a Location (300, 304) or a 1xx: no API reply is there, whatever
        # the request; the endpoint is not at this target (falls back), as for a redirect
        return Outcome(
            OutcomeKind.NOT_FOUND,
            status=status,
            detail=f"unexpected HTTP status {status}: no API reply at this URL",
            error=error,
        )
    kind = status_kind(status)
    reading = error_body.read(body if isinstance(body, Mapping | list) else text)
    if reading is not None and reading.kind is not kind and _body_decides(status, reading):
        kind = reading.kind
        detail = f"{detail} [{reading.why}]"
    if kind is OutcomeKind.QUOTA:
        # A spent balance or a day's quota does not come back in seconds: the key is
        # benched until the reset the body names (or its provider documents), else for
        # the cooldown cap, whatever a "retry in 5s" in the body says.
        ra = error_body.quota_reset(body, now if now is not None else time.time())
    else:
        ra = parse_retry_after(headers, text, now if now is not None else time.time())
    return Outcome(kind, status=status, retry_after=ra, detail=detail, error=error)


def _redirect(status: int, headers: Mapping[str, str] | None) -> str | None:
    """The reason for a 3xx with a Location: no redirect is followed (a 301/302/303
    would turn the POST into a GET, a 307/308 would send the prompt and key to where
    the Location says), so the endpoint is not at this target: ``not_found`` (docs/design.md,
    "Redirects are not followed")."""
    if not 300 <= status < 400 or not headers:
        return None
    location = next((v for k, v in headers.items() if k.lower() == "location"), None)
    if not isinstance(location, str) or not location.strip():
        return None
    where = " ".join(str(safe_url(location)).split())[:200]
    return (
        f"HTTP {status} redirect to {where!s} not followed (fallgate follows no redirect: "
        "set base_url to the URL the API answers at)"
    )


def _short(text: str) -> str:
    """A one-line summary of an error body: its message if JSON, else its start."""
    t = text.strip()
    if not t:
        return ""
    try:
        obj = json.loads(t)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("code") or err.get("type")
            if isinstance(msg, str):
                t = msg
        elif isinstance(err, str):
            t = err
    t = " ".join(t.split())
    if t.lower().startswith("<!doctype") or t.lower().startswith("<html"):
        return "HTML error page"
    return t[:160]


def classify_exception(e: BaseException) -> Outcome:
    """Plain Python exceptions and anything carrying an HTTP status."""
    if isinstance(e, asyncio.CancelledError | KeyboardInterrupt):
        return Outcome(OutcomeKind.CANCELLED, detail="cancelled", error=e)
    status = getattr(e, "status_code", None)
    if status is None:
        status = getattr(e, "status", None)
    if status is None:
        resp = getattr(e, "response", None)
        status = getattr(resp, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        resp = getattr(e, "response", None)
        headers = getattr(e, "headers", None) or getattr(resp, "headers", None)
        body = getattr(e, "body", None)
        if body is None:
            body = str(e)
        return classify_status(status, dict(headers) if headers else None, body, error=e)
    if isinstance(e, TimeoutError | socket.timeout):
        return Outcome(OutcomeKind.TRANSPORT, detail=f"timeout: {type(e).__name__}", error=e)
    if isinstance(e, ConnectionError | socket.gaierror | EOFError):
        return Outcome(
            OutcomeKind.TRANSPORT, detail=f"connection error: {type(e).__name__}", error=e
        )
    if isinstance(e, OSError):
        return Outcome(
            OutcomeKind.TRANSPORT, detail=f"transport error: {type(e).__name__}", error=e
        )
    return Outcome(
        OutcomeKind.BAD_REQUEST, detail=f"unclassified error: {type(e).__name__}", error=e
    )


def classify_response(
    status: int,
    headers: Mapping[str, str],
    body: Any,
    *,
    now: float | None = None,
    provider: Provider | None = None,
) -> Outcome:
    """An HTTP error reply: `classify_status`, then the provider's quirks (its own error
    codes and statuses), then the server's ``x-should-retry`` (`headers` lower-cased)."""
    o = classify_status(status, headers, body, now=now)
    kind, detail = _quirk(provider, status, body, o.kind, o.detail)
    should = headers.get("x-should-retry", "").strip().lower()
    if should == "true" and kind is OutcomeKind.BAD_REQUEST:
        kind = OutcomeKind.OVERLOADED
        detail += " (server sent x-should-retry: true)"
    elif should == "false" and kind is OutcomeKind.RATE_LIMITED:
        kind = OutcomeKind.QUOTA  # never retried on this credential: rotate or fall back
        detail += " (server sent x-should-retry: false)"
    elif should == "false" and kind in (OutcomeKind.OVERLOADED, OutcomeKind.TRANSPORT):
        detail += " (server sent x-should-retry: false)"
    # quota carries only the reset its body names (`classify_status` says why)
    ra = o.retry_after
    if kind is OutcomeKind.QUOTA and o.kind is not OutcomeKind.QUOTA:
        ra = error_body.quota_reset(body, now if now is not None else time.time())
    return Outcome(kind, status=o.status, retry_after=ra, detail=detail)


def classify_error_object(
    body: Any,
    message: str,
    *,
    now: float | None = None,
    provider: Provider | None = None,
    what: str = "error event",
) -> Outcome:
    """An ``error`` object without an HTTP status (an SSE error event, a failed response):
    a status in its ``code`` is read as one; else the provider's codes, the body's words;
    else a server fault (the server gave up mid-request: retryable). `message` is the
    detail, already one line."""
    text = json.dumps(body) if isinstance(body, Mapping | list) else str(body)
    code = body.get("code") if isinstance(body, Mapping) else None
    status = code if isinstance(code, int) and 100 <= code <= 599 else None
    if status is not None:
        o = classify_status(status, None, body, now=now)
        kind, detail = _quirk(provider, status, body, o.kind, o.detail)
        return Outcome(kind, status=status, retry_after=o.retry_after, detail=detail)
    quirk = None if provider is None else provider.quirk(None, _error_codes(body))
    if quirk is not None and provider is not None:
        return Outcome(quirk, detail=f"{what}: {message} ({provider.name}: {quirk.value})")
    hint = body_kind(text)
    low = text.lower()
    if hint is not None:
        kind = hint
    elif "rate limit" in low or "rate_limit" in low or "too many requests" in low:
        kind = OutcomeKind.RATE_LIMITED
    else:
        kind = OutcomeKind.OVERLOADED
    return Outcome(kind, detail=f"{what}: {message}")


def _error_codes(body: Any) -> list[object]:
    """The ``code``, ``type`` and ``status`` values of an error body, outermost first
    (`fsm.catalogue.error_body.parse`: the SDK's inner ``error`` object or the raw text,
    Gemini's list of one error, a JSON error inside a ``message``)."""
    return list(error_body.parse(body).codes)


def _quirk(
    provider: Provider | None, status: int | None, body: Any, kind: OutcomeKind, detail: str
) -> tuple[OutcomeKind, str]:
    """The provider's own reading of an error, when it has one."""
    if provider is None:
        return kind, detail
    quirk = provider.quirk(status, _error_codes(body))
    if quirk is None or quirk is kind:
        return kind, detail
    return quirk, f"{detail} ({provider.name}: {quirk.value})"
