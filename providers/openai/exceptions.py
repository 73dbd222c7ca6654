"""What the `openai` SDK raises, read and handed to the catalogue as `fsm.Outcome`s.

This module knows the SDK's exception shapes only: it takes the status, headers and
body text out of a status error (or the error object out of a stream's error event)
and hands them, with the target's registry entry, to `fsm.catalogue.classify` once
(`classify_response`, `classify_error_object`): what codes, wordings, headers such as
``x-should-retry`` and a provider's quirks mean is written there, not here. What is
left here has no status to read: the SDK's transport and timeout exceptions, malformed
2xx replies, clients that could not be built, and streams that broke after the caller
already had text.

Details never hold a key: the key the request carried (taken from its
``Authorization`` header) and anything that looks like a key are scrubbed.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import anyio
import attrs
import openai
import pydantic

from ...fsm import Outcome, OutcomeKind, Policy, Target
from ...fsm.catalogue.classify import (
    classify_error_object,
    classify_exception,
    classify_response,
)
from ...fsm.catalogue.registry import Provider
from ...fsm.errors import MissingCredential
from ...fsm.kinds import TRAITS
from ...fsm.redact import redact
from .http import transport

__all__ = [
    "ClientClosed",
    "ClientUnavailable",
    "FailedReply",
    "MalformedReply",
    "StreamInterrupted",
    "classifier_for",
    "classify_openai",
    "content_filter_error",
]

_DETAIL_MAX = 200


def _delivered(chunks: int, partial: str) -> str:
    """``1 chunk, 16 characters delivered`` (singular when one)."""
    n = len(partial)
    return (
        f"{chunks} chunk{'' if chunks == 1 else 's'}, "
        f"{n} character{'' if n == 1 else 's'} delivered"
    )


class StreamInterrupted(Exception):
    """A stream failed after chunks had reached the caller: the turn is committed.

    `partial` is the text the caller already received; `cause` what broke it.
    """

    def __init__(self, partial: str, chunks: int, cause: BaseException | None = None) -> None:
        self.partial = partial
        self.chunks = chunks
        self.cause = cause
        why = f": {type(cause).__name__}" if cause is not None else ""
        super().__init__(f"stream interrupted after {_delivered(chunks, partial)}{why}")


class MalformedReply(Exception):
    """A 2xx reply that is not a usable reply (HTML, empty, not JSON, wrong shape)."""

    def __init__(self, what: str, status: int | None = 200) -> None:
        self.what = what
        self.status = status
        super().__init__(f"malformed reply: {what}")


class FailedReply(Exception):
    """A 2xx reply that reports its own failure: a Responses API ``response`` with
    ``status: "failed"`` or a ``response.failed`` stream event. `error` is its
    ``error`` object (``code``, ``message``), classified like a stream error event."""

    def __init__(self, error: Any) -> None:
        if not isinstance(error, Mapping):
            dump = getattr(error, "model_dump", None)
            error = dump() if callable(dump) else {"message": str(error or "")}
        self.error: Mapping[str, Any] = error
        message = error.get("message") or error.get("code") or "no error given"
        super().__init__(f"the response failed: {message}")


class ClientUnavailable(Exception):
    """The SDK client for a target could not be built (a local fault): the attempt never
    reached the network, so it is a client-side fault (`fsm.Outcome.client_side`), laid
    on no backend's breaker, in a shared store least of all."""

    client_side = True

    def __init__(self, target: str, cause: BaseException) -> None:
        self.target = target
        self.cause = cause
        super().__init__(
            f"client for {target} could not be built: {type(cause).__name__}: {_one_line(cause)}"
        )


class ClientClosed(RuntimeError):
    """The fallgate client was closed by its owner: no attempt is made on it any more,
    and one that was out when it closed is cut. Classified `cancelled` (the turn ends
    `aborted`): the closing is the caller's act, charged to no target's health."""

    def __init__(self, message: str = "this fallgate client is closed") -> None:
        super().__init__(message)


def content_filter_error(completion: Any) -> openai.ContentFilterFinishReasonError:
    """The SDK's error for a content-filtered reply, with the reply as its `completion`
    (openai 3.x takes it as an argument, 2.x's constructor takes none)."""
    cls: Any = openai.ContentFilterFinishReasonError
    if "completion" in inspect.signature(cls).parameters:
        error: Any = cls(completion=completion)
    else:
        error = cls()
        error.completion = completion
    return cast(openai.ContentFilterFinishReasonError, error)


# -- secrets -------------------------------------------------------------------------------

_KEY_ECHO = re.compile(r"(api key provided:\s*)(\S+)", re.IGNORECASE)


def _request_secret(e: BaseException) -> list[str]:
    """The bearer keys the failed request (and its causes) carried."""
    found: list[str] = []
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        todo += [getattr(x, "cause", None), x.__cause__, x.__context__]
        try:
            req = getattr(x, "request", None)
        except RuntimeError:  # httpx raises when an exception has no request attached
            req = None
        headers = getattr(req, "headers", None)
        if headers is None:
            continue
        auth = headers.get("authorization") or ""
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else auth.strip()
        if len(key) >= 4:
            found.append(key)
    return found


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without keys: the known `secrets` whole or in the pieces providers print
    (``sk-ab***xyz``), key-shaped tokens, credentials in URLs (`fsm.redact.redact`),
    and whatever follows "API key provided:"."""
    return redact(_KEY_ECHO.sub(r"\1***", text), secrets)


def _one_line(e: BaseException) -> str:
    return _one_line_text(str(e))


def _one_line_text(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _DETAIL_MAX else text[: _DETAIL_MAX - 3] + "..."


def _cause_name(e: BaseException) -> str:
    c = e.__cause__ or e.__context__
    return type(c).__name__ if c is not None else type(e).__name__


# -- transport exception families ------------------------------------------------------------


def _timeout_types() -> tuple[type[BaseException], ...]:
    return (*transport.timeout_errors(), TimeoutError)


def _transport_types() -> tuple[type[BaseException], ...]:
    return (
        *transport.transport_errors(),
        # AnyIO (the I/O layer under both HTTP libraries) leaks some TLS and stream failures
        anyio.EndOfStream,
        anyio.BrokenResourceError,
        anyio.ClosedResourceError,
        ssl.SSLError,
        ConnectionError,
        EOFError,
    )


# -- the classifier ----------------------------------------------------------------------------


def classify_openai(
    e: BaseException,
    *,
    now: float | None = None,
    provider: Provider | None = None,
    secrets: Iterable[str] = (),
) -> Outcome:
    """Map one exception from an SDK call (or our own adapter) to an `Outcome`.

    `now` is the wall-clock time used for HTTP-date Retry-After values
    (defaults to `time.time()`); `provider` is the registry entry of the target
    the attempt went to, whose quirks are read first; `secrets` are keys to scrub
    from the detail besides the one the request carried (the policy's pool).
    """
    secrets = [*_request_secret(e), *secrets]
    o = _classify(e, time.time() if now is None else now, provider)
    detail = scrub(o.detail, secrets)
    if len(detail) > _DETAIL_MAX:
        detail = detail[: _DETAIL_MAX - 3] + "..."
    return Outcome(
        o.kind,
        status=o.status,
        retry_after=o.retry_after,
        detail=detail,
        partial=o.partial,
        value=o.value,
        error=e,
    )


def classifier_for(
    policy: Policy,
    current: Callable[[], Target | None],
    answered_others: Callable[[Target], bool] | None = None,
    closed: Callable[[], bool] | None = None,
) -> Callable[[BaseException], Outcome]:
    """`classify_openai` with the quirks of the provider `current()` names (the target
    of the attempt that just failed). `answered_others(target)`: did the target answer
    other attempts while this one was out (the pool's view)? It marks the outcome of a
    `connection_level` kind `Outcome.client_side`, as is a transport fault whose
    time ran out before it reached the network, or whose timer fired late because
    the process was starved (`bounds.AttemptTimeout.client_side`). `closed()`: has the
    client the attempt went out on been closed by its owner? Then whatever the attempt
    failed with (its connection shut under it, a request refused) is `cancelled`: the
    turn ends `aborted`, and no target is charged with the close."""

    def classify(e: BaseException) -> Outcome:
        if closed is not None and not isinstance(e, ClientClosed) and closed():
            cut = ClientClosed()
            cut.__cause__ = e  # what the close did to the attempt in flight
            return classify_openai(cut)
        target = current()
        provider = None if target is None else policy.provider(target)
        o = classify_openai(e, provider=provider, secrets=policy.secrets())
        if not TRAITS[o.kind].connection_level:
            return o
        if getattr(e, "client_side", False) is True or (
            answered_others is not None and target is not None and answered_others(target)
        ):
            return attrs.evolve(o, client_side=True)
        return o

    return classify


def _classify(e: BaseException, now: float, provider: Provider | None = None) -> Outcome:
    if isinstance(e, asyncio.CancelledError | KeyboardInterrupt):
        return Outcome(OutcomeKind.CANCELLED, detail="cancelled")
    if isinstance(e, ClientClosed):
        return Outcome(OutcomeKind.CANCELLED, detail=str(e))
    if isinstance(e, StreamInterrupted):
        return _interrupted(e, now, provider)
    if isinstance(e, MissingCredential):
        # retry_after=0: the credential is spent for this turn but not benched across
        # turns, so setting the variable takes effect on the very next turn.
        return Outcome(OutcomeKind.AUTH, retry_after=0.0, detail=str(e))
    if isinstance(e, ClientUnavailable):
        return Outcome(OutcomeKind.TRANSPORT, detail=str(e))
    if isinstance(e, MalformedReply):
        return Outcome(OutcomeKind.OVERLOADED, status=e.status, detail=str(e))
    if isinstance(e, openai.APIStatusError):
        return _status_error(e, now, provider)
    if isinstance(e, openai.APIResponseValidationError):
        return Outcome(
            OutcomeKind.OVERLOADED,
            status=e.status_code,
            detail="malformed reply: does not match the API schema",
        )
    if isinstance(e, openai.APITimeoutError):
        return Outcome(OutcomeKind.TRANSPORT, detail=f"timeout ({_cause_name(e)})")
    if isinstance(e, openai.APIConnectionError):
        cause = e.__cause__ or e.__context__
        what = f"{type(cause).__name__}: {_one_line(cause)}" if cause is not None else e.message
        return Outcome(OutcomeKind.TRANSPORT, detail=f"connection error ({what})")
    if isinstance(e, openai.ContentFilterFinishReasonError):
        return Outcome(OutcomeKind.CONTENT_FILTERED, detail="reply stopped by the content filter")
    if isinstance(e, openai.LengthFinishReasonError):
        return Outcome(OutcomeKind.BAD_REQUEST, detail="reply cut at the output token limit")
    if isinstance(e, openai.APIError):
        # No status: an error event inside a stream, or the SDK's own complaint.
        return _error_event(e.body if e.body is not None else e.message, str(e), now, provider)
    if isinstance(e, FailedReply):
        return _error_event(dict(e.error), str(e), now, provider, "failed reply")
    if isinstance(e, _timeout_types()):
        said = _one_line(e)  # an attempt bound says which one ran out
        what = f"{type(e).__name__}: {said}" if said else type(e).__name__
        return Outcome(OutcomeKind.TRANSPORT, detail=f"timeout ({what})")
    if isinstance(e, _transport_types()):
        return Outcome(
            OutcomeKind.TRANSPORT, detail=f"connection error ({type(e).__name__}: {_one_line(e)})"
        )
    if isinstance(e, json.JSONDecodeError | UnicodeDecodeError):
        return Outcome(
            OutcomeKind.OVERLOADED, status=200, detail=f"malformed reply: not valid JSON ({e})"
        )
    if isinstance(e, pydantic.ValidationError):
        return Outcome(
            OutcomeKind.OVERLOADED,
            status=200,
            detail="malformed reply: does not match the API schema",
        )
    o = classify_exception(e)
    if o.kind is OutcomeKind.BAD_REQUEST and o.status is None:
        return Outcome(OutcomeKind.BAD_REQUEST, detail=f"{type(e).__name__}: {_one_line(e)}")
    return o


def _headers(e: openai.APIStatusError) -> dict[str, str]:
    try:
        return {k.lower(): v for k, v in e.response.headers.items()}
    except Exception:  # a hand-made response without headers
        return {}


def _raw_body(e: openai.APIStatusError) -> Any:
    """The error body as the server sent it (the SDK keeps only the ``error`` value,
    which loses the top-level fields some providers use: Fireworks' ``message``,
    vLLM's ``type``); the SDK's `body` when the response text cannot be read."""
    try:
        text = e.response.text
    except Exception:  # a hand-made response, or one whose body was never read
        text = ""
    if text and text.strip():
        return text
    body: Any = e.body
    if body is None or body == "":
        body = e.message
    return body


def _status_error(e: openai.APIStatusError, now: float, provider: Provider | None) -> Outcome:
    return classify_response(e.status_code, _headers(e), _raw_body(e), now=now, provider=provider)


def _error_event(
    body: Any,
    message: str,
    now: float,
    provider: Provider | None = None,
    what: str = "error event",
) -> Outcome:
    """An `error` object without an HTTP status (an SSE error event, a failed response)."""
    return classify_error_object(
        body, _one_line_text(message), now=now, provider=provider, what=what
    )


def _interrupted(e: StreamInterrupted, now: float, provider: Provider | None) -> Outcome:
    if isinstance(e.cause, ClientClosed):  # the caller closed it: no break of the target's
        return Outcome(
            OutcomeKind.CANCELLED,
            detail=f"{e.cause} after {_delivered(e.chunks, e.partial)}",
            partial=e.partial,
        )
    why = ": stream ended before its finish_reason"
    status = None
    if e.cause is not None:
        inner = _classify(e.cause, now, provider)
        why = f": {inner.kind.value}" + (f" ({inner.detail})" if inner.detail else "")
        status = inner.status
    return Outcome(
        OutcomeKind.STREAM_INTERRUPTED,
        status=status,
        detail=f"stream broke after {_delivered(e.chunks, e.partial)}{why}",
        partial=e.partial,
    )
