"""The fault server's request handler: routes, and each step kind played over HTTP.

Every reply is written by hand (status line, headers, body or chunked SSE) so
that a step can stop anywhere: before the headers, mid-body, mid-stream.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from . import replies
from .script import Step

if TYPE_CHECKING:
    from .server import _HTTPServer

POLL = 0.05  # how often a held request looks for shutdown / client hang-up


class Closed(Exception):
    """The client went away or the server is stopping: stop writing."""


class Handler(BaseHTTPRequestHandler):
    """One client connection (HTTP/1.1 keep-alive): ``GET /v1/models[/ID]`` and
    ``POST /v1/chat/completions``, each answered by the model's next step."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small SSE/JSON writes must not wait ~40 ms for ACKs
    server_version = "fallgate-fault-server/1"
    sys_version = ""
    timeout = 120  # idle keep-alive connections end after this
    server: _HTTPServer

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

    def _event(self, obj: Any) -> None:
        self._chunk(
            b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        )

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
            if path != "/v1/chat/completions":
                self._error(404, f"no route for POST {path}")
                return
            model = request.get("model")
            if not isinstance(model, str) or not model:
                self._error(400, "the request needs a 'model' string")
                return
            stream = request.get("stream") is True
            auth = self.headers.get("Authorization", "")
            api_key = auth[7:] if auth[:7].lower() == "bearer " else None
            step, index = self.server.owner._take(model, stream, api_key, path, request)
            self._play(step, index, model, stream, request)
        except (Closed, OSError):
            self.close_connection = True

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
        if not isinstance(body, dict):
            self._error(400, "the request body must be a JSON object")
            return None
        return body

    # -- steps

    def _play(
        self, step: Step, index: int | None, model: str, stream: bool, request: Mapping[str, Any]
    ) -> None:
        if step.delay:
            self._hold(step.delay)
        kind = step.kind
        if kind == "answer":
            if stream:
                pieces = replies.answer_pieces(step.text, step.chunks)
                self._stream(step, model, request, pieces, "done")
            else:
                self._json(200, replies.completion(model, step.text, step.finish_reason, request))
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
            full = json.dumps(replies.completion(model, step.text, "stop", request)).encode()
            self._send(200, full[: len(full) // 2], "application/json", length=len(full))
        elif kind == "invalid_json":
            body = step.body if step.body is not None else replies.BROKEN_JSON
            self._send(200, body.encode(), "application/json")
        elif kind == "empty":
            self._send(200, b"", "application/json")
        elif kind == "stream":
            if not stream:
                self._error(
                    400,
                    f"fault script: the step for model {model!r} (index {index}) is a stream "
                    "step, but the request did not ask for stream=true",
                )
                return
            self._stream(step, model, request, replies.stream_pieces(step.chunks), step.then)

    def _stream(
        self,
        step: Step,
        model: str,
        request: Mapping[str, Any],
        pieces: Sequence[str],
        then: str,
    ) -> None:
        opts = request.get("stream_options")
        usage = isinstance(opts, Mapping) and opts.get("include_usage") is True
        ident, created = replies.new_id(), int(time.time())
        if then != "done":
            self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return replies.chunk(ident, created, model, delta, finish, with_usage=usage)

        for n, piece in enumerate(pieces):
            if n and step.interval:
                self._hold(step.interval)
            delta = {"role": "assistant", "content": piece} if n == 0 else {"content": piece}
            self._event(chunk(delta, None))
        if then == "done":
            self._event(chunk({}, step.finish_reason))
            if usage:
                self._event(replies.usage_chunk(ident, created, model, request, "".join(pieces)))
            self._event(b"[DONE]")
            self._chunk(b"")  # the terminating zero-length chunk
        elif then == "error":
            self._event({"error": replies.stream_error(step.error)})
            self._chunk(b"")
        elif then == "hang":
            self._hold(step.seconds)
        # "cut" (and "hang" after holding): return with close_connection set,
        # so the socket closes with the chunked body unfinished.
