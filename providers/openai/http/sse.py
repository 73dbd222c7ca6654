"""Server-sent events that do not parse are dropped, not fatal.

A provider (or a proxy) sometimes sends one event whose ``data`` is not JSON in the
middle of a good stream: a truncated line, a stray debug print. The openai SDK raises
on it and the whole stream is lost. Under fallgate every stream a target sends goes
through `SseFilter` first (the wrapper's clients and the embedded HTTP client's
transports both read responses through `FilteringTransport`): an event that does not
parse is dropped (counted, one WARNING on the ``fallgate`` logger per stream), and the
stream goes on. `MALFORMED_IN_A_ROW` bad events with no good one between end it as a
malformed reply (`MalformedReply`): before the stream commits that falls back like
any other malformed reply; after, the stream is interrupted (and continued).

Comments (keep-alives), ``[DONE]`` and events without data pass as they are; only a
``data`` payload that is not JSON is judged. A stream sent compressed is not read here.
The filter also notes when the answer has ended (`stream_ended`: every choice gave its
finish_reason, or the Responses stream its ``response.completed`` or
``response.incomplete``): a cut after that loses at most a usage chunk or ``[DONE]``,
and the embedded HTTP client ends the stream there instead of raising to the caller, as
the wrapper takes such a stream as whole.
The same transport scrubs the key a request was sent with out of what comes back
(`scrub`): an error reply's body, a stream's error events.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

from ..calls import STREAMS
from ..exceptions import MalformedReply
from . import transport
from .scrub import (
    arescrubbed,
    is_error_event,
    only_keys,
    request_secrets,
    rescrubbed,
    scrubbed_event,
)

__all__ = [
    "MALFORMED_IN_A_ROW",
    "AsyncFilteringTransport",
    "FilteringTransport",
    "SseFilter",
    "boundary",
    "dropped_events",
    "expect_choices",
    "stream_ended",
]

logger = logging.getLogger("fallgate")

_KEY: Final = "fallgate.sse_filter"  # where a response keeps its filter (`dropped_events`)

#: Bad events in a row (no good one between) that end a stream as a malformed reply.
MALFORMED_IN_A_ROW: Final = 3
#: `SseFilter._event`'s answer for an event it drops (None is an event's JSON null).
_DROPPED: Final = object()


def boundary(buf: bytes) -> tuple[int, int] | None:
    """Where the first complete SSE event ends (its end, and where the next starts)."""
    best: tuple[int, int] | None = None
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        i = buf.find(sep)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, i + len(sep))
    return best


def _data(block: bytes) -> str | None:
    """An event's ``data`` (its lines joined), None when it has none (a comment)."""
    lines = [
        raw.partition(":")[2].removeprefix(" ")
        for raw in block.decode("utf-8", "replace").splitlines()
        if raw.startswith("data")
    ]
    return "\n".join(lines) if lines else None


class SseFilter:
    """Feed it a stream's bytes; it gives back the same bytes less the events whose
    data is not JSON (`dropped` counts them), each scrubbed of `secrets` (the request's
    key: `scrub`) where it reports an error or holds the key."""

    __slots__ = (
        "_keys",
        "_open",
        "_pending",
        "_row",
        "dropped",
        "ended",
        "expect",
        "secrets",
        "where",
    )

    def __init__(self, where: str = "", secrets: tuple[str, ...] = ()) -> None:
        self._pending = b""
        self._row = 0
        self.dropped = 0
        #: The answer has ended (see `_note`); a cut from here on loses nothing of it.
        self.ended = False
        self._open: set[int] = set()  # chat: the choices (`calls.StreamRule.chat`)
        #: chat: the choices the request asked for (``n``; `expect_choices`)
        self.expect = 1
        self.where = where  # for the warning: the request's host and path
        self.secrets = secrets
        self._keys = tuple(s.encode() for s in secrets)

    def feed(self, data: bytes) -> bytes:
        self._pending += data
        out: list[bytes] = []
        while True:
            cut = boundary(self._pending)
            if cut is None:
                break
            block, self._pending = self._pending[: cut[1]], self._pending[cut[1] :]
            passed = self._pass(block, cut[0])
            if passed is not None:
                out.append(passed)
        return b"".join(out)

    def _pass(self, block: bytes, end: int) -> bytes | None:
        """The event as it goes on (scrubbed), or None when it is dropped."""
        data = _data(block[:end])
        if data is None or data.strip() == "[DONE]":
            return only_keys(block, self._keys)
        event = self._event(data)
        if event is _DROPPED:
            return None
        self._note(event)
        if is_error_event(event):
            return scrubbed_event(block, event, self.secrets)
        return only_keys(block, self._keys)

    def _note(self, event: Any) -> None:
        """Has the answer ended with `event`? By the wrapper's own reading
        (`calls.StreamRule`, noting only, never judging): chat, once every choice it
        spoke of gave a finish_reason (not ``error``: OpenRouter's failure), a finished
        choice staying finished (Azure's content-filter annotation after ``stop`` does
        not reopen it); Responses, at ``response.completed`` or ``response.incomplete``."""
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if isinstance(kind, str):
            self.ended = self.ended or STREAMS.responses(event, kind, said=True, judge=False)[1]
            return
        if isinstance(event.get("choices"), list):
            STREAMS.chat(event, self._open, said=True, judge=False)
            self.ended = STREAMS.ended(self._open, self.expect)

    def end(self) -> bytes:
        """The stream ended: an unfinished last event goes on as it is (the SDK's own
        decoder says what it makes of it)."""
        rest, self._pending = self._pending, b""
        return rest

    def _event(self, data: str) -> Any:
        """The event's data parsed, or `_DROPPED` (counted; too many in a row end the
        stream as a malformed reply)."""
        try:
            event = json.loads(data)
        except ValueError:
            pass
        else:
            self._row = 0
            return event
        self.dropped += 1
        self._row += 1
        if self.dropped == 1:
            logger.warning(
                "fallgate: dropped a stream event that is not JSON%s (%d bytes); the stream "
                "goes on (%d in a row end it)",
                f" from {self.where}" if self.where else "",
                len(data),
                MALFORMED_IN_A_ROW,
            )
        if self._row >= MALFORMED_IN_A_ROW:
            raise MalformedReply(f"{self._row} stream events in a row that are not JSON")
        return _DROPPED


def _sse(response: Any) -> bool:
    headers = response.headers
    return headers.get("content-type", "").startswith("text/event-stream") and headers.get(
        "content-encoding", "identity"
    ) in ("identity", "")


def _where(request: Any) -> str:
    url = request.url
    return f"{url.host}{url.path}"


class _Filtered(transport.http.SyncByteStream):  # type: ignore[misc]
    def __init__(self, inner: Any, f: SseFilter) -> None:
        self._inner = inner
        self.filter = f

    def __iter__(self) -> Iterator[bytes]:
        f = self.filter
        for chunk in self._inner:
            out = f.feed(chunk)
            if out:
                yield out
        tail = f.end()
        if tail:
            yield tail

    def close(self) -> None:
        self._inner.close()


class _AsyncFiltered(transport.http.AsyncByteStream):  # type: ignore[misc]
    def __init__(self, inner: Any, f: SseFilter) -> None:
        self._inner = inner
        self.filter = f

    async def __aiter__(self) -> AsyncIterator[bytes]:
        f = self.filter
        async for chunk in self._inner:
            out = f.feed(chunk)
            if out:
                yield out
        tail = f.end()
        if tail:
            yield tail

    async def aclose(self) -> None:
        await self._inner.aclose()


class FilteringTransport(transport.http.HTTPTransport):  # type: ignore[misc]
    """The library's transport; an SSE response's events go through `SseFilter`, an
    error reply's body is scrubbed of the request's key (`scrub`)."""

    def handle_request(self, request: Any) -> Any:
        response = super().handle_request(request)
        if response.status_code >= 400:
            return rescrubbed(response, request)
        if _sse(response):
            f = response.extensions[_KEY] = SseFilter(_where(request), request_secrets(request))
            response.stream = _Filtered(response.stream, f)
        return response


class AsyncFilteringTransport(transport.http.AsyncHTTPTransport):  # type: ignore[misc]
    """The asyncio twin of `FilteringTransport`."""

    async def handle_async_request(self, request: Any) -> Any:
        response = await super().handle_async_request(request)
        if response.status_code >= 400:
            return await arescrubbed(response, request)
        if _sse(response):
            f = response.extensions[_KEY] = SseFilter(_where(request), request_secrets(request))
            response.stream = _AsyncFiltered(response.stream, f)
        return response


def expect_choices(response: Any, n: Any) -> None:
    """Tell `response`'s filter how many choices its request asked for (``n``): the
    answer has ended only when that many finished."""
    extensions = getattr(response, "extensions", None)
    f = extensions.get(_KEY) if isinstance(extensions, dict) else None
    if isinstance(f, SseFilter) and isinstance(n, int) and n > 1:
        f.expect = n


def stream_ended(response: Any) -> bool:
    """Had `response`'s stream (a filtered one) said its answer's end (`SseFilter._note`)?"""
    extensions = getattr(response, "extensions", None)
    f = extensions.get(_KEY) if isinstance(extensions, dict) else None
    return isinstance(f, SseFilter) and f.ended


def dropped_events(response: Any) -> int:
    """How many malformed events the filter dropped from `response` (0: none, or not
    filtered)."""
    extensions = getattr(response, "extensions", None)
    f = extensions.get(_KEY) if isinstance(extensions, dict) else None
    return f.dropped if isinstance(f, SseFilter) else 0
