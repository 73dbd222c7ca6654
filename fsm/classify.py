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

from . import error_body
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
    """What an error body says, regardless of status (None if nothing specific):
    its structured fields first, then whole phrases (`fsm.error_body.read`)."""
    reading = error_body.read(body)
    return None if reading is None else reading.kind


def _status_kind(status: int) -> OutcomeKind:
    """The class of an HTTP error status when the body says nothing more."""
    if status in (401, 403):
        return OutcomeKind.AUTH
    if status == 402:
        return OutcomeKind.QUOTA
    if status == 404:
        return OutcomeKind.NOT_FOUND
    if status == 408:
        return OutcomeKind.TRANSPORT
    if status == 413:
        return OutcomeKind.CONTEXT_TOO_LONG
    if status == 429:
        return OutcomeKind.RATE_LIMITED
    if status == 409 or status in _OVERLOADED_STATUS or status >= 500:
        return OutcomeKind.OVERLOADED
    return OutcomeKind.BAD_REQUEST


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
    if status < 400:
        return Outcome(
            OutcomeKind.BAD_REQUEST,
            status=status,
            retry_after=parse_retry_after(headers, text, now if now is not None else time.time()),
            detail=f"unexpected HTTP status {status}",
            error=error,
        )
    kind = _status_kind(status)
    reading = error_body.read(body if isinstance(body, Mapping | list) else text)
    if reading is not None and reading.kind is not kind and _body_decides(status, reading):
        kind = reading.kind
        detail = f"{detail} [{reading.why}]"
    if kind is OutcomeKind.QUOTA:
        # A spent balance or a day's quota does not come back in seconds: the key is
        # benched for the cooldown cap, whatever a "retry in 5s" in the body says.
        ra = None
    else:
        ra = parse_retry_after(headers, text, now if now is not None else time.time())
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
