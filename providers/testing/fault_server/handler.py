"""The fault server's request handler: routes, and each step kind played over HTTP.

Every reply is written by hand (status line, headers, body or chunked SSE) so
that a step can stop anywhere: before the headers, mid-body, mid-stream.
"""

from __future__ import annotations

import io
import json
import math
import select
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

import attrs

from . import replies, responses
from .limits import Buckets, refusal, request_cost
from .records import RequestHeaders
from .script import TRICKLE_INTERVAL, TRICKLES, Step

if TYPE_CHECKING:
    from .server import FaultHTTPServer

POLL = 0.05  # how often a held request looks for shutdown / client hang-up

#: The POST endpoints, and which API shapes their replies take.
ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
}


#: Headers a step's ``headers`` cannot replace on a stream: the server frames it.
_FRAMING = frozenset({"content-type", "content-length", "transfer-encoding", "connection"})


class Closed(Exception):
    """The client went away or the server is stopping: stop writing."""


@attrs.frozen
class Asked:
    """One POST as the steps read it: which step of the model's script it drew
    (`index`), the API shape of its endpoint, its model, whether it streams, its body."""

    index: int | None
    api: str
    model: str
    stream: bool
    request: Mapping[str, Any]

    @property
    def step(self) -> str:
        """The step it drew, in words for a script error."""
        return f"the step for model {self.model!r} (index {self.index})"


class Handler(BaseHTTPRequestHandler):
    """One client connection (HTTP/1.1 keep-alive): ``GET /v1/models[/ID]``, and
    ``POST`` to each of `ROUTES`, answered by the model's next step."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small SSE/JSON writes must not wait ~40 ms for ACKs
    server_version = "fallgate-fault-server/1"
    sys_version = ""
    timeout = 120  # idle keep-alive connections end after this
    server: FaultHTTPServer
    _api_key: str | None = None  # the request's bearer key (its deployment's prompt cache)
    #: The rate-limit headers of the reply being sent (`limits`), set per request.
    _limit_headers: tuple[tuple[str, str], ...] = ()

    # -- plumbing

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        """No request logging (and request lines never reach stderr)."""

    def _hold(self, seconds: float) -> None:
        """Wait `seconds`; raise `Closed` early on shutdown or client hang-up."""
        deadline = time.monotonic() + seconds
        stopping = self.server.stopping
        while True:
            if stopping.is_set():
                raise Closed
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                readable, _, _ = select.select([self.connection], [], [], min(remaining, POLL))
                if readable and not self.connection.recv(1, socket.MSG_PEEK):
                    raise Closed  # EOF: the client gave up
            except (OSError, ValueError):
                raise Closed from None
            if readable:  # pipelined bytes: cannot watch for EOF, just wait
                if stopping.wait(max(0.0, deadline - time.monotonic())):
                    raise Closed
                return

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str | None = "application/json",
        headers: Sequence[tuple[str, str]] = (),
        length: int | None = None,
    ) -> None:
        self.send_response(status)
        names = {n.lower() for n, _ in headers}
        if content_type and "content-type" not in names:
            self.send_header("Content-Type", content_type)
        for name, value in headers:
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def _json(self, status: int, obj: Any, headers: Sequence[tuple[str, str]] = ()) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json", headers)

    def _error(self, status: int, message: str, type_: str = "invalid_request_error") -> None:
        self._json(status, replies.error_body(message, type_))

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, obj: Any, name: str | None = None) -> None:
        """One SSE event: ``event: NAME`` (if named) and ``data: JSON``."""
        head = b"event: %s\n" % name.encode() if name else b""
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self._chunk(head + b"data: " + data + b"\n\n")

    def _events(self, events: Sequence[dict[str, Any]]) -> None:
        """Responses API events, each named by its ``type``."""
        for event in events:
            self._event(event, event["type"])

    # -- routes

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        owner = self.server.owner
        try:
            if path == "/v1/models":
                data = [replies.model_object(m) for m in owner.current_script.models]
                self._json(200, {"object": "list", "data": data})
            elif path.startswith("/v1/models/"):
                self._json(200, replies.model_object(path.removeprefix("/v1/models/")))
            else:
                self._error(404, f"no route for GET {path}")
        except OSError:
            self.close_connection = True

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            request = self._read_json()
            if request is None:
                return
            api = ROUTES.get(path)
            if api is None:
                self._error(404, f"no route for POST {path}")
                return
            model = request.get("model")
            if not isinstance(model, str) or not model:
                self._error(400, "the request needs a 'model' string")
                return
            stream = api != "embeddings" and request.get("stream") is True
            if api == "embeddings" and not self._embeddable(request):
                return
            auth = self.headers.get("Authorization", "")
            api_key = auth[7:] if auth[:7].lower() == "bearer " else None
            headers = RequestHeaders(self.headers.items())
            owner = self.server.owner
            self._api_key = api_key
            step, index = owner._take(model, stream, api_key, path, request, headers)
            if owner.buckets.limited(model) and not self._within_limits(
                owner.buckets, model, api_key, step, request
            ):
                return
            self._play(step, Asked(index, api, model, stream, request))
        except (Closed, OSError):
            self.close_connection = True

    def end_headers(self) -> None:
        for name, value in self._limit_headers:  # the rate limits, on every reply
            self.send_header(name, value)
        self._limit_headers = ()
        super().end_headers()

    def _within_limits(
        self, buckets: Buckets, model: str, key: str | None, step: Step, request: Any
    ) -> bool:
        """Charge the request to its key's buckets (`limits`); a request that does not fit
        is answered 429 with Retry-After here (False)."""
        fits, headers, left = buckets.charge(model, key, request_cost(request, step.text))
        self._limit_headers = tuple(headers)
        if not fits:
            self._json(429, *refusal(model, left))
        return fits

    def _embeddable(self, request: Mapping[str, Any]) -> bool:
        """Is this embeddings request one the server can answer? (Else a 400.)"""
        if replies.embedding_inputs(request.get("input")) is None:
            self._error(400, "'input' must be a non-empty string, list of strings or token arrays")
            return False
        dims = request.get("dimensions", replies.EMBEDDING_DIMENSIONS)
        if isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= 8192:
            self._error(400, "'dimensions' must be an integer between 1 and 8192")
            return False
        if request.get("encoding_format", "float") not in ("float", "base64"):
            self._error(400, "'encoding_format' must be 'float' or 'base64'")
            return False
        return True

    def _read_json(self) -> dict[str, Any] | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            self._error(411, "the fault server needs a Content-Length request body")
            return None
        try:
            n = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            n = -1
        if n < 0 or n > 64 * 1024 * 1024:
            self.close_connection = True
            self._error(400, "bad Content-Length")
            return None
        raw = self.rfile.read(n)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._error(400, "the request body is not JSON")
            return None
        except RecursionError:
            self._error(400, "the request body is nested too deeply to parse")
            return None
        if not isinstance(body, dict):
            self._error(400, "the request body must be a JSON object")
            return None
        return body

    # -- steps

    def _play(self, step: Step, asked: Asked) -> None:
        if step.delay:
            self._hold(step.delay)
        kind = step.kind
        if kind in ("answer", "tool_calls", "stream"):
            self._reply(step, asked)
        elif kind == "sse":
            self._sse(step, asked)
        elif kind in ("continue", "refuse_prefix"):
            self._prefixed(step, asked)
        elif kind == "status":
            body = step.body
            if body is None:
                message = f"scripted HTTP {step.status}"
                body = replies.error_body(message, replies.error_type(step.status))
            if isinstance(body, str):
                data = body.encode()
                ctype = step.content_type or "text/plain; charset=utf-8"
            else:
                data = json.dumps(body).encode()
                ctype = step.content_type or "application/json"
            self._send(step.status, data, ctype, step.headers)
        elif kind in ("timeout", "hang"):
            self.close_connection = True
            self._hold(step.seconds)
        elif kind == "drop":
            self.close_connection = True
        elif kind == "drop_mid_body":
            self.close_connection = True
            full = json.dumps(self._body(step, asked)).encode()
            self._send(200, full[: len(full) // 2], "application/json", length=len(full))
        elif kind == "invalid_json":
            body = step.body if step.body is not None else replies.BROKEN_JSON
            self._send(200, body.encode(), "application/json")
        elif kind == "empty":
            self._send(200, b"", "application/json")
        elif kind in TRICKLES:
            self._trickle(step, asked)

    # -- slow servers

    def _render(self, step: Step, asked: Asked) -> bytes:
        """The bytes (status line, headers, body) an ``answer`` with this step's text
        would send, captured instead of sent."""
        answer = Step(kind="answer", text=step.text)
        real, buf = self.wfile, io.BytesIO()
        self.wfile = buf
        try:
            self._reply(answer, asked)
        finally:
            self.wfile = real
        return buf.getvalue()

    def _dribble(self, data: bytes, interval: float, pieces: int) -> None:
        """Send `data` in `pieces` pieces (a byte each when it is that short), `interval`
        seconds apart: it takes ``(pieces - 1) * interval`` seconds."""
        size = max(1, math.ceil(len(data) / max(1, pieces)))
        for i in range(0, len(data), size):
            if i:
                self._hold(interval)
            self.wfile.write(data[i : i + size])
            self.wfile.flush()

    def _trickle(self, step: Step, asked: Asked) -> None:
        """A slow server: ``trickle_headers``, ``trickle_body``, ``keepalive``, ``endless``."""
        self.close_connection = True  # a padded or endless reply never leaves a reusable socket
        interval = step.interval or (0.0 if step.kind == "endless" else TRICKLE_INTERVAL)
        pieces = max(1, math.ceil(step.seconds / interval)) if interval else 0
        if step.kind == "endless":
            self._endless(step, asked.stream, interval)
            return
        whole = self._render(step, asked)
        head, _, body = whole.partition(b"\r\n\r\n")
        status_line, _, fields = head.partition(b"\r\n")
        if step.kind == "trickle_headers":
            pad = b"X-Trickle: " + b"." * max(1, pieces - len(head)) + b"\r\n"
            self._dribble(status_line + b"\r\n" + pad + fields + b"\r\n\r\n", interval, pieces)
            self.wfile.write(body)
            self.wfile.flush()
            return
        if asked.stream:  # chunked SSE: the padding is a comment chunk (keepalive: many)
            if step.kind == "trickle_body":
                comment = b": " + b"." * max(1, pieces) + b"\n\n"
                self.wfile.write(head + b"\r\n\r\n")
                data = b"%X\r\n%s\r\n" % (len(comment), comment) + body
                self._dribble(data, interval, pieces)
            else:
                self.wfile.write(head + b"\r\n\r\n")
                self.wfile.flush()
                for _ in range(pieces):
                    self._chunk(b": keep-alive\n\n")
                    self._hold(interval)
                self.wfile.write(body)
            self.wfile.flush()
            return
        # a JSON body: leading whitespace, which JSON ignores; Content-Length grows to match
        pad = b" " * max(0, pieces - len(body)) if step.kind == "trickle_body" else b"\n" * pieces
        length = b"Content-Length: %d" % (len(pad) + len(body))
        lines = [
            length if f.lower().startswith(b"content-length:") else f for f in fields.split(b"\r\n")
        ]
        self.wfile.write(status_line + b"\r\n" + b"\r\n".join(lines) + b"\r\n\r\n")
        self.wfile.flush()
        if step.kind == "trickle_body":
            self._dribble(pad + body, interval, pieces)
        else:
            self._dribble(pad, interval, pieces)
            self.wfile.write(body)
            self.wfile.flush()

    def _endless(self, step: Step, stream: bool, interval: float) -> None:
        """200, then padding every `interval` until `seconds` pass or the client leaves."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()
        piece = b":" + b"." * max(0, step.bytes - 2) + b"\n" if stream else b" " * step.bytes
        until = time.monotonic() + step.seconds
        stopping = self.server.stopping
        while time.monotonic() < until and not stopping.is_set():
            self._chunk(piece)
            if interval:
                self._hold(interval)

    def _body(self, step: Step, asked: Asked) -> dict[str, Any]:
        """The whole JSON reply of an answer (or tool calls) on this endpoint."""
        calls = replies.identify(step.tool_calls)
        if asked.api == "responses":
            return responses.response(asked.model, asked.request, step.text, calls)
        if asked.api == "embeddings":
            inputs = replies.embedding_inputs(asked.request.get("input")) or [""]
            dims = asked.request.get("dimensions", replies.EMBEDDING_DIMENSIONS)
            encoding = asked.request.get("encoding_format", "float")
            return replies.embeddings(asked.model, inputs, dims, encoding)
        cached = self.server.owner.prompt_cache.read(self._api_key, asked.request)
        return replies.completion(
            asked.model, step.text, step.finish_reason, asked.request, calls, cached
        )

    def _reply(self, step: Step, asked: Asked) -> None:
        """An ``answer``, ``tool_calls`` or ``stream`` step on this endpoint."""
        where = f"{asked.step} is a {step.kind} step"
        if asked.api == "embeddings" and step.kind != "answer":
            self._error(400, f"fault script: {where}, which /v1/embeddings cannot answer")
        elif step.kind == "stream" and not asked.stream:
            self._error(400, f"fault script: {where}, but the request did not ask for stream=true")
        elif not asked.stream:
            self._json(200, self._body(step, asked), step.headers)
        else:
            calls = replies.identify(step.tool_calls)
            if step.kind == "stream":
                pieces, then = replies.stream_pieces(step.chunks), step.then
            elif step.kind == "tool_calls":
                pieces = replies.answer_pieces(step.text, None) if step.text else []
                then = "done"
            else:
                pieces, then = replies.answer_pieces(step.text, step.chunks), "done"
            # a tool_calls step's `chunks`: how many pieces each call's arguments come in
            args = step.chunks if step.kind == "tool_calls" and isinstance(step.chunks, int) else 3
            if asked.api == "responses":
                self._stream_responses(step, asked.model, asked.request, pieces, calls, args, then)
            else:
                deltas = replies.chat_deltas(pieces, calls, args)
                said = replies.spoken("".join(pieces), calls)
                self._stream_chat(step, asked.model, asked.request, deltas, said, then)

    def _prefixed(self, step: Step, asked: Asked) -> None:
        """A ``continue`` or ``refuse_prefix`` step: what it answers depends on whether
        the request ends with an assistant message (a continuation's prefix)."""
        prefix = replies.assistant_prefix(asked.request, asked.api)
        if step.kind == "refuse_prefix":
            if prefix is None:
                self._reply(attrs.evolve(step, kind="answer", status=200), asked)
                return
            body = step.body if step.body is not None else replies.PREFIX_REFUSED
            self._send(step.status, json.dumps(body).encode(), "application/json", step.headers)
            return
        text = step.text
        if prefix is not None:
            if not text.startswith(prefix):
                self._error(
                    400,
                    f"fault script: {asked.step} continues "
                    f"{text[:40]!r}..., but the assistant prefix is {prefix[:40]!r}... "
                    f"({len(prefix)} characters): not the start of the text",
                )
                return
            text = prefix[len(prefix) - min(step.echo, len(prefix)) :] + text[len(prefix) :]
        answer = attrs.evolve(step, kind="answer", text=text, chunks=step.chunks)
        self._reply(answer, asked)

    def _sse(self, step: Step, asked: Asked) -> None:
        """An ``sse`` step: its events as they are (Responses events named by their type)."""
        if not asked.stream or asked.api == "embeddings":
            where = f"{asked.step} is an sse step"
            self._error(400, f"fault script: {where}, but the request did not ask for stream=true")
            return
        self._open_stream("done" if step.done else "cut", step.headers)
        for n, event in enumerate(step.events):
            if n and step.interval:
                self._hold(step.interval)
            if isinstance(event, str):
                self._event(event.encode())
            else:
                kind = event.get("type") if isinstance(event, dict) else None
                self._event(
                    event, kind if asked.api == "responses" and isinstance(kind, str) else None
                )
        if step.done:
            self._event(b"[DONE]")
            self._chunk(b"")

    def _open_stream(self, then: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        if then != "done":
            self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        for name, value in headers:
            if name.lower() not in _FRAMING:
                self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()

    def _end_stream(self, step: Step, openai_error: Callable[[], tuple[str | None, Any]]) -> None:
        """After the last event: the scripted ending other than "done"; on
        "error", the error event in the step's `error_shape` (OpenAI's made by
        `openai_error`: the event name, if any, and the data)."""
        if step.then == "error":
            if step.error_shape == "anthropic":
                self._event(replies.anthropic_error(step.error), "error")
            else:
                name, data = openai_error()
                self._event(data, name)
            self._chunk(b"")
        elif step.then == "hang":
            self._hold(step.seconds)
        elif step.then == "keepalive":  # alive, yet never another event
            for _ in range(max(1, math.ceil(step.seconds / TRICKLE_INTERVAL))):
                self._chunk(b": keep-alive\n\n")
                self._hold(TRICKLE_INTERVAL)
        # "cut" (and "hang", "keepalive" after holding): return with close_connection set,
        # so the socket closes with the chunked body unfinished.

    def _stream_chat(
        self,
        step: Step,
        model: str,
        request: Mapping[str, Any],
        deltas: Sequence[dict[str, Any]],
        said: str,
        then: str,
    ) -> None:
        opts = request.get("stream_options")
        usage = isinstance(opts, Mapping) and opts.get("include_usage") is True
        ident, created = replies.new_id(), int(time.time())
        self._open_stream(then, step.headers)

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return replies.chunk(ident, created, model, delta, finish, with_usage=usage)

        for n, delta in enumerate(deltas):
            if n and step.interval:
                self._hold(step.interval)
            self._event(chunk(delta, None))
        if then == "done":
            self._event(chunk({}, step.finish_reason))
            if usage:
                cached = self.server.owner.prompt_cache.read(self._api_key, request)
                self._event(replies.usage_chunk(ident, created, model, request, said, cached))
            self._event(b"[DONE]")
            self._chunk(b"")  # the terminating zero-length chunk
        else:
            self._end_stream(step, lambda: (None, {"error": replies.stream_error(step.error)}))

    def _stream_responses(
        self,
        step: Step,
        model: str,
        request: Mapping[str, Any],
        pieces: Sequence[str],
        calls: Sequence[replies.IdentifiedCall],
        args: int,
        then: str,
    ) -> None:
        events = responses.ResponseEvents(model, request)
        self._open_stream(then, step.headers)
        self._events(events.start())
        if pieces or not calls:
            self._events(events.open_message())
            for n, piece in enumerate(pieces):
                if n and step.interval:
                    self._hold(step.interval)
                self._events([events.delta(piece)])
        if then != "done":
            self._end_stream(step, lambda: ("error", events.error(step.error)))
            return
        if pieces or not calls:
            self._events(events.close_message())
        for n, call in enumerate(calls):
            if step.interval and (n or pieces):
                self._hold(step.interval)
            self._events(events.function_call(call, args))
        self._events([events.completed(calls)])
        self._chunk(b"")
