"""Generic classification: plain exceptions and HTTP status codes into outcomes.

The openai-specific classifier lives in `providers.classify` and builds on
`classify_status` for everything that comes down to status, headers, body.
This runs on the host side (it may read the wall clock for HTTP dates).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Mapping
from typing import Any

from .backoff import parse_retry_after
from .outcomes import Outcome, OutcomeKind

_OVERLOADED_STATUS = {500, 502, 503, 504, 529}


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
    """What an error body says, regardless of status (None if nothing specific)."""
    low = body.lower()
    if "insufficient_quota" in low or ("billing" in low and "quota" in low):
        return OutcomeKind.QUOTA
    if (
        "context_length_exceeded" in low
        or "maximum context length" in low
        or ("context window" in low and ("exceed" in low or "too long" in low))
        or "prompt is too long" in low
    ):
        return OutcomeKind.CONTEXT_TOO_LONG
    if "content_filter" in low or "content_policy" in low or "content management policy" in low:
        return OutcomeKind.CONTENT_FILTERED
    if "model_not_found" in low or (
        "model" in low
        and (
            "does not exist" in low
            or "not found" in low
            or "unknown model" in low
            or "not supported" in low
            or "unsupported" in low
        )
    ):
        return OutcomeKind.NOT_FOUND
    if "overloaded" in low:
        return OutcomeKind.OVERLOADED
    return None


def classify_status(
    status: int,
    headers: Mapping[str, str] | None = None,
    body: Any = None,
    *,
    now: float | None = None,
    error: BaseException | None = None,
) -> Outcome:
    """Map an HTTP error response to an outcome (the outcome table in docs/design.md)."""
    text = _body_text(body)
    ra = parse_retry_after(headers, text, now if now is not None else time.time())
    hint = body_kind(text)
    detail = _short(text) or f"HTTP {status}"
    kind: OutcomeKind
    if 200 <= status < 300:
        kind = OutcomeKind.SUCCESS
    elif status in (401, 403):
        kind = OutcomeKind.AUTH
    elif status == 402:
        kind = OutcomeKind.QUOTA
    elif status == 404:
        kind = OutcomeKind.NOT_FOUND
    elif status == 408:
        kind = OutcomeKind.TRANSPORT
    elif status == 413:
        kind = OutcomeKind.CONTEXT_TOO_LONG
    elif status == 429:
        kind = (
            hint
            if hint in (OutcomeKind.QUOTA, OutcomeKind.OVERLOADED)
            else (OutcomeKind.RATE_LIMITED)
        )
    elif status in (400, 422):
        kind = (
            hint
            if hint is not None
            and hint is not OutcomeKind.OVERLOADED
            and hint is not (OutcomeKind.QUOTA)
            else OutcomeKind.BAD_REQUEST
        )
    elif status == 409 or status in _OVERLOADED_STATUS or status >= 500:
        kind = OutcomeKind.OVERLOADED
    elif 400 <= status < 500:
        kind = (
            hint
            if hint in (OutcomeKind.CONTEXT_TOO_LONG, OutcomeKind.CONTENT_FILTERED)
            else (OutcomeKind.BAD_REQUEST)
        )
    else:
        kind = OutcomeKind.BAD_REQUEST
        detail = f"unexpected HTTP status {status}"
    return Outcome(kind, status=status, retry_after=ra, detail=detail, error=error)


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
