"""A target's reply never hands the caller the key it was sent.

Providers echo a bad key in their errors (``Incorrect API key provided:
sk-proj-****abcd``, or whole); the SDK copies that text into its exception's message,
``body`` and ``response``, and agent frameworks log exceptions. Every reply a target
sends reaches the SDK through the library's transport (`sse.FilteringTransport`, under
the wrapper's clients and `fallgate.http_client` alike), which scrubs it here with the
request's own key (its ``Authorization`` / ``api-key`` header), by `fsm.redact.redact`:

- an error reply (status 400 or more) is read whole (error bodies are small) and its
  body scrubbed: every key-shaped token goes, not only the key sent;
- in a stream, an event that reports an error is scrubbed the same way, and any other
  event only of the key itself (a model's own text is otherwise left as it is).
"""

from __future__ import annotations

import json
from typing import Any, Final

from ....fsm.redact import MASK, redact, scrub_data
from . import transport

__all__ = [
    "arescrubbed",
    "is_error_event",
    "only_keys",
    "request_secrets",
    "rescrubbed",
    "scrubbed",
    "scrubbed_event",
]

#: Where a request carries its key (the OpenAI SDK sends ``Authorization: Bearer``).
_KEY_HEADERS: Final = ("authorization", "api-key", "x-api-key")
#: Headers of a reply that no longer hold once its body was read (and decoded).
_STALE: Final = frozenset({"content-encoding", "content-length", "transfer-encoding"})


def request_secrets(request: Any) -> tuple[str, ...]:
    """The key(s) `request` was sent with (none for a keyless target)."""
    out = []
    for name in _KEY_HEADERS:
        value = request.headers.get(name)
        if not value:
            continue
        scheme, _, rest = value.partition(" ")
        key = rest.strip() if scheme.lower() == "bearer" else value.strip()
        if len(key) >= 4:
            out.append(key)
    return tuple(out)


def scrubbed(content: bytes, secrets: tuple[str, ...]) -> bytes:
    """`content` with `secrets` and anything key-shaped masked (unchanged: the same
    object). A JSON body is scrubbed as parsed (an escaped ``\u2026`` in an echo is the
    ellipsis the reader sees) and written back only if something was masked."""
    text = content.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        clean = redact(text, secrets)
        return content if clean == text else clean.encode()
    clean_data = scrub_data(data, secrets)
    return content if clean_data == data else json.dumps(clean_data).encode()


def scrubbed_event(block: bytes, event: Any, secrets: tuple[str, ...]) -> bytes:
    """A stream event (`block`, its parsed data `event`) with its data scrubbed as
    `scrubbed` does; its other fields (``event: error``) kept."""
    clean = scrub_data(event, secrets)
    if clean == event:
        return block
    lines = block.decode("utf-8", "replace").splitlines()
    fields = [x for x in lines if x and not x.startswith("data")]
    return "\n".join([*fields, f"data: {json.dumps(clean)}", "", ""]).encode()


def only_keys(content: bytes, secrets: tuple[bytes, ...]) -> bytes:
    """`content` with each of `secrets` (as bytes) masked, nothing else touched."""
    for s in secrets:
        if s in content:
            content = content.replace(s, MASK.encode())
    return content


def is_error_event(event: Any) -> bool:
    """Does a stream event's data report an error (chat's ``{"error": ...}``, the
    Responses API's ``error`` and ``response.failed`` events)?"""
    return isinstance(event, dict) and (
        "error" in event or event.get("type") in ("error", "response.failed")
    )


def _rebuilt(response: Any, content: bytes, request: Any) -> Any:
    headers = [(k, v) for k, v in response.headers.items() if k.lower() not in _STALE]
    extensions = {
        k: v for k, v in response.extensions.items() if k in ("http_version", "reason_phrase")
    }
    return transport.http.Response(
        response.status_code,
        headers=headers,
        content=content,
        request=request,
        extensions=extensions,
    )


def rescrubbed(response: Any, request: Any) -> Any:
    """An error reply, read whole and scrubbed of the request's key (`scrubbed`)."""
    try:
        content = response.read()
    finally:
        response.close()
    return _rebuilt(response, scrubbed(content, request_secrets(request)), request)


async def arescrubbed(response: Any, request: Any) -> Any:
    """The asyncio twin of `rescrubbed`."""
    try:
        content = await response.aread()
    finally:
        await response.aclose()
    return _rebuilt(response, scrubbed(content, request_secrets(request)), request)
