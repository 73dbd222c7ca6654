"""A fault-injecting, OpenAI-compatible HTTP server for tests, demos and benchmarks.

Real HTTP on loopback (stdlib ``ThreadingHTTPServer``, HTTP/1.1 keep-alive,
chunked SSE streams), scripted per model: each request for a model takes that
model's next step; when the steps are used up the ``default`` step repeats.
The real ``openai`` SDK talks to it exactly as it talks to a provider, so the
faults it sees (statuses, hangs, drops, cut streams) are the real ones.

Script format (a dict, or a JSON / TOML file read by `load_script`)::

    {"default": {"kind": "answer", "text": "ok"},
     "models": {"glm-5.1": [{"kind": "timeout"},
                            {"kind": "status", "status": 429,
                             "headers": {"retry-after": "20"}}],
                "glm-4.7": [{"kind": "answer", "text": "hello", "delay": 0.1}]}}

Step kinds and their fields (every kind also takes ``delay``, seconds before
anything is sent):

- ``answer``: ``text`` ("ok"), ``finish_reason`` ("stop"); for stream requests
  ``chunks`` (int N: the text cut in N pieces, or a list of strings; default:
  one piece per word) and ``interval`` (seconds between chunks).
- ``status``: ``status`` (required), ``headers``, ``body`` (JSON object/array,
  or a string sent as-is with ``content_type``; default: an OpenAI error body).
- ``timeout`` / ``hang``: hold the request unanswered for ``seconds`` (30),
  then close the connection.
- ``drop``: close the connection without sending a byte.
- ``drop_mid_body``: 200 headers with a Content-Length larger than what is
  sent, half of a JSON body, then close.
- ``invalid_json``: 200, application/json, a body that is not JSON (``body``).
- ``empty``: 200, application/json, an empty body.
- ``stream`` (stream requests only): ``chunks`` (int N -> "chunk-1 ",
  "chunk-2 ", ...; or a list of strings), then ``then``: "done" (a finish
  chunk and ``[DONE]``), "error" (an SSE ``data: {"error": ...}`` event with
  ``error`` as its object, then close), "cut" (close mid-stream: no
  ``[DONE]``, no terminating chunk) or "hang" (stall ``seconds``, then cut);
  ``interval`` between chunks.

The server binds loopback only: it keeps the bearer tokens it receives (in
memory, for credential-rotation tests), and never prints or logs them.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import re
import select
import signal
import socket
import sys
import threading
import time
import tomllib
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any

import attrs

__all__ = [
    "FaultServer",
    "RequestRecord",
    "Script",
    "ScriptError",
    "Step",
    "load_script",
    "parse_script",
    "serve_main",
]

log = logging.getLogger("fallgate.fault_server")

KINDS = (
    "answer",
    "status",
    "timeout",
    "hang",
    "drop",
    "drop_mid_body",
    "invalid_json",
    "empty",
    "stream",
)
STREAM_ENDINGS = ("done", "error", "cut", "hang")
_MAX_SECONDS = 3600.0
_POLL = 0.05  # how often a held request looks for shutdown / client hang-up


# --------------------------------------------------------------------------- errors


class ScriptError(ValueError):
    """A malformed fault script. The message names the file and line (when
    known), the model, the step index and the field: ``models["m"][1].status``."""

    def __init__(
        self,
        problem: str,
        path: Sequence[str | int] = (),
        *,
        file: str | None = None,
        line: int | None = None,
    ) -> None:
        self.problem = problem
        self.path = tuple(path)
        self.file = file
        self.line = line
        super().__init__(self._render())

    @property
    def model(self) -> str | None:
        """The model whose steps are bad ("default" for the default step)."""
        if self.path[:1] == ("default",):
            return "default"
        if len(self.path) >= 2 and self.path[0] == "models":
            return str(self.path[1])
        return None

    @property
    def step(self) -> int | None:
        if len(self.path) >= 3 and self.path[0] == "models" and isinstance(self.path[2], int):
            return self.path[2]
        return None

    @property
    def field(self) -> str | None:
        last = self.path[-1] if self.path else None
        return last if isinstance(last, str) and len(self.path) >= 2 else None

    def located(self, file: str, line: int | None) -> ScriptError:
        return ScriptError(self.problem, self.path, file=file, line=line)

    def _render(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        at = _render_path(self.path)
        return f"fault script {where}{at + ': ' if at else ''}{self.problem}"


def _render_path(path: Sequence[str | int]) -> str:
    out = ""
    for i, p in enumerate(path):
        if isinstance(p, int):
            out += f"[{p}]"
        elif i == 1 and path[0] == "models":
            out += f"[{json.dumps(p)}]"
        else:
            out += f".{p}" if out else p
    return out


# --------------------------------------------------------------------------- script


def _seconds(raw: Any, path: tuple[str | int, ...]) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ScriptError(f"expected a number of seconds, got {raw!r}", path)
    if not math.isfinite(raw) or raw < 0 or raw > _MAX_SECONDS:
        raise ScriptError(f"expected seconds between 0 and {_MAX_SECONDS:g}, got {raw!r}", path)
    return float(raw)


def _string(raw: Any, path: tuple[str | int, ...]) -> str:
    if not isinstance(raw, str):
        raise ScriptError(f"expected a string, got {raw!r}", path)
    return raw


def _chunks(raw: Any, path: tuple[str | int, ...], minimum: int) -> int | tuple[str, ...]:
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < minimum or raw > 100_000:
            raise ScriptError(
                f"expected a chunk count between {minimum} and 100000, got {raw}", path
            )
        return raw
    if isinstance(raw, list) and all(isinstance(c, str) for c in raw):
        if len(raw) < minimum:
            raise ScriptError(f"expected at least {minimum} chunk(s), got an empty list", path)
        return tuple(raw)
    raise ScriptError(f"expected an integer or a list of strings, got {raw!r}", path)


_FIELDS: dict[str, frozenset[str]] = {
    "answer": frozenset({"text", "chunks", "interval", "finish_reason"}),
    "status": frozenset({"status", "headers", "body", "content_type"}),
    "timeout": frozenset({"seconds"}),
    "hang": frozenset({"seconds"}),
    "drop": frozenset(),
    "drop_mid_body": frozenset(),
    "invalid_json": frozenset({"body"}),
    "empty": frozenset(),
    "stream": frozenset({"chunks", "then", "error", "interval", "seconds"}),
}


@attrs.frozen
class Step:
    """One scripted reply. Build with `Step.parse` (validates) or directly."""

    kind: str
    delay: float = 0.0
    text: str = "ok"
    finish_reason: str = "stop"
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: Any = None
    content_type: str | None = None
    seconds: float = 30.0
    chunks: int | tuple[str, ...] | None = None
    then: str = "done"
    error: Mapping[str, Any] | None = None
    interval: float = 0.0

    @classmethod
    def parse(cls, raw: Any, path: Sequence[str | int] = ()) -> Step:
        """Validate one step mapping; `path` locates it in error messages."""
        where = tuple(path)
        if not isinstance(raw, Mapping):
            raise ScriptError(f"expected a step table like {{kind = ...}}, got {raw!r}", where)
        kind = raw.get("kind")
        if kind is None:
            raise ScriptError(f"missing field; one of: {', '.join(KINDS)}", (*where, "kind"))
        if kind not in KINDS:
            raise ScriptError(
                f"unknown kind {kind!r}; expected one of: {', '.join(KINDS)}", (*where, "kind")
            )
        allowed = _FIELDS[kind] | {"kind", "delay"}
        for key in raw:
            if key not in allowed:
                raise ScriptError(
                    f"unknown field for kind {kind!r}; allowed: {', '.join(sorted(allowed))}",
                    (*where, str(key)),
                )
        out: dict[str, Any] = {"kind": kind}
        for key, value in raw.items():
            at = (*where, key)
            if key in ("delay", "seconds", "interval"):
                out[key] = _seconds(value, at)
            elif key in ("text", "finish_reason", "content_type"):
                out[key] = _string(value, at)
            elif key == "status":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ScriptError(f"expected an integer HTTP status, got {value!r}", at)
                if not 200 <= value <= 599:
                    raise ScriptError(
                        f"expected an HTTP status between 200 and 599, got {value}", at
                    )
                out[key] = value
            elif key == "headers":
                out[key] = _headers(value, at)
            elif key == "body":
                if kind == "invalid_json":
                    out[key] = _string(value, at)
                elif not isinstance(value, str | Mapping | list):
                    raise ScriptError(f"expected a JSON object, array or string, got {value!r}", at)
                else:
                    out[key] = value
            elif key == "chunks":
                out[key] = _chunks(value, at, 1 if kind == "answer" else 0)
            elif key == "then":
                if value not in STREAM_ENDINGS:
                    raise ScriptError(
                        f"expected one of: {', '.join(STREAM_ENDINGS)}, got {value!r}", at
                    )
                out[key] = value
            elif key == "error":
                if not isinstance(value, Mapping):
                    raise ScriptError(
                        f"expected an error object like {{message = ...}}, got {value!r}", at
                    )
                out[key] = dict(value)
        if kind == "status" and "status" not in raw:
            raise ScriptError("missing field (an HTTP status, e.g. 429)", (*where, "status"))
        if kind == "answer" and isinstance(out.get("chunks"), tuple):
            joined = "".join(out["chunks"])
            if "text" in out and out["text"] != joined:
                raise ScriptError("the chunks must join to the text", (*where, "chunks"))
            out["text"] = joined
        if kind == "stream" and "error" in out and out.get("then") != "error":
            raise ScriptError('only used with then = "error"', (*where, "error"))
        return cls(**out)

    def describe(self) -> str:
        """A short human label: ``status 429``, ``stream 3 then cut``."""
        if self.kind == "status":
            return f"status {self.status}"
        if self.kind == "stream":
            n = self.chunks if isinstance(self.chunks, int) else len(self.chunks or ())
            return f"stream {n} then {self.then}"
        if self.kind in ("timeout", "hang"):
            return f"{self.kind} {self.seconds:g}s"
        if self.kind == "answer":
            return f"answer {self.text[:20]!r}" + (f" after {self.delay:g}s" if self.delay else "")
        return self.kind


def _headers(raw: Any, path: tuple[str | int, ...]) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        raise ScriptError(f"expected a table of header names to values, got {raw!r}", path)
    out = []
    for name, value in raw.items():
        if not isinstance(name, str) or not re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name):
            raise ScriptError(f"bad header name {name!r}", path)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ScriptError(f"header {name!r}: expected a string or number, got {value!r}", path)
        text = str(value)
        if "\r" in text or "\n" in text:
            raise ScriptError(f"header {name!r}: line breaks are not allowed", path)
        out.append((name, text))
    return tuple(out)


DEFAULT_STEP = Step(kind="answer", text="ok")


def _readonly(models: Mapping[str, tuple[Step, ...]]) -> Mapping[str, tuple[Step, ...]]:
    return MappingProxyType(dict(models))


@attrs.frozen(eq=False)
class Script:
    """A validated script: per-model step lists and the step that repeats after."""

    models: Mapping[str, tuple[Step, ...]] = attrs.field(factory=dict, converter=_readonly)
    default: Step = DEFAULT_STEP

    def summary(self) -> str:
        """One line: each model's steps, then the default."""
        parts = [
            f"{m}: {', '.join(s.describe() for s in steps)}" for m, steps in self.models.items()
        ]
        models = "; ".join(parts) if parts else "no scripted models"
        return f"{models}; then {self.default.describe()}"


def parse_script(raw: Any) -> Script:
    """Validate a script given as a mapping (``None`` or ``{}``: every model answers "ok")."""
    if raw is None:
        return Script()
    if isinstance(raw, Script):
        return raw
    if not isinstance(raw, Mapping):
        raise ScriptError(f"expected a table with 'models' and/or 'default', got {raw!r}")
    for key in raw:
        if key not in ("models", "default"):
            raise ScriptError(
                "unknown top-level key; expected 'models' and/or 'default'", (str(key),)
            )
    default = Step.parse(raw["default"], ("default",)) if "default" in raw else DEFAULT_STEP
    models_raw = raw.get("models", {})
    if not isinstance(models_raw, Mapping):
        raise ScriptError(
            f"expected a table of model name -> list of steps, got {models_raw!r}", ("models",)
        )
    models: dict[str, tuple[Step, ...]] = {}
    for model, steps in models_raw.items():
        if not isinstance(steps, list):
            raise ScriptError(f"expected a list of steps, got {steps!r}", ("models", str(model)))
        models[str(model)] = tuple(
            Step.parse(s, ("models", str(model), i)) for i, s in enumerate(steps)
        )
    return Script(models=models, default=default)


def load_script(path: str | os.PathLike[str]) -> Script:
    """Read and validate a JSON or TOML script file (by suffix, else by content)."""
    name = os.fspath(path)
    try:
        text = Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise ScriptError(f"cannot read the script file: {reason}", file=name) from None
    is_json = name.endswith(".json") or (
        not name.endswith(".toml") and text.lstrip().startswith("{")
    )
    try:
        if is_json:
            raw = json.loads(text)
        else:
            raw = tomllib.loads(text)
    except json.JSONDecodeError as e:
        raise ScriptError(
            f"invalid JSON: {e.msg} (column {e.colno})", file=name, line=e.lineno
        ) from None
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
        line = int(m.group(1)) if m else None
        col = f" (column {m.group(2)})" if m else ""
        raise ScriptError(f"invalid TOML: {msg}{col}", file=name, line=line) from None
    try:
        return parse_script(raw)
    except ScriptError as e:
        line = _json_line(text, e.path) if is_json else _toml_line(text, e.path)
        raise e.located(name, line) from None


def _json_line(text: str, path: tuple[str | int, ...]) -> int | None:
    """Line of the deepest part of `path` found in the JSON text."""
    offsets = _json_offsets(text)
    for n in range(len(path), -1, -1):
        if path[:n] in offsets:
            return text.count("\n", 0, offsets[path[:n]]) + 1
    return None


def _json_offsets(text: str) -> dict[tuple[str | int, ...], int]:
    """Offset of every value in a (valid) JSON document, by its key path."""
    out: dict[tuple[str | int, ...], int] = {}
    decoder = json.JSONDecoder()

    def skip(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    def value(i: int, path: tuple[str | int, ...]) -> int:
        i = skip(i)
        out[path] = i
        if text[i] == "{":
            i = skip(i + 1)
            if text[i] == "}":
                return i + 1
            while True:
                key, i = json.decoder.scanstring(text, skip(i) + 1)  # type: ignore[attr-defined]
                i = value(skip(i) + 1, (*path, key))
                i = skip(i)
                if text[i] != ",":
                    return i + 1
                i += 1
        if text[i] == "[":
            i = skip(i + 1)
            if text[i] == "]":
                return i + 1
            for n in itertools.count():
                i = skip(value(i, (*path, n)))
                if text[i] != ",":
                    return i + 1
                i += 1
        _, end = decoder.raw_decode(text, i)
        return int(end)

    try:
        value(0, ())
    except (ValueError, IndexError, RecursionError):
        pass
    return out


def _toml_line(text: str, path: tuple[str | int, ...]) -> int | None:
    """Best-effort line for `path` in TOML: ``[[models."m"]]`` headers, then ``field =``."""
    lines = text.splitlines()
    if not path:
        return None
    if path[0] == "default":
        header = re.compile(r"^\s*\[\s*default\s*\]")
        starts = [i for i, ln in enumerate(lines) if header.match(ln)]
        field = path[1] if len(path) > 1 else None
    elif path[0] == "models" and len(path) >= 2:
        model = re.escape(str(path[1]))
        key = rf"(?:\"{model}\"|'{model}'|{model})"
        header = re.compile(rf"^\s*\[\[\s*models\s*\.\s*{key}\s*\]\]")
        starts = [i for i, ln in enumerate(lines) if header.match(ln)]
        index = path[2] if len(path) > 2 and isinstance(path[2], int) else 0
        if starts:
            starts = starts[index : index + 1] or starts[-1:]
        else:
            keyed = re.compile(rf"^\s*{key}\s*=")
            starts = [i for i, ln in enumerate(lines) if keyed.match(ln)][:1]
            return starts[0] + 1 if starts else None
        field = path[3] if len(path) > 3 else None
    else:
        return None
    if not starts:
        return None
    start = starts[0]
    if isinstance(field, str):
        assign = re.compile(rf"^\s*(?:\"{re.escape(field)}\"|{re.escape(field)})\s*=")
        for i in range(start + 1, len(lines)):
            if lines[i].lstrip().startswith("["):
                break
            if assign.match(lines[i]):
                return i + 1
    return start + 1


# --------------------------------------------------------------------------- records


@attrs.frozen
class RequestRecord:
    """One request the server received. `api_key` is kept for credential-rotation
    tests only: it is never printed, logged, or shown in the repr."""

    model: str
    stream: bool
    api_key: str | None = attrs.field(repr=False)
    time: float  # time.monotonic() when the request was read
    path: str = "/v1/chat/completions"
    kind: str = "answer"  # the kind of step that answered it
    step: int | None = None  # index in the model's steps; None for the default step
    body: Mapping[str, Any] = attrs.field(factory=dict, repr=False, eq=False)


# --------------------------------------------------------------------------- HTTP


class _Closed(Exception):
    """The client went away or the server is stopping: stop writing."""


class _HTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` that can stop promptly and leave nothing behind.

    The stdlib does not join daemon handler threads, and a keep-alive handler
    blocks reading its idle connection; so every accepted socket and handler
    thread is tracked, sockets are shut down on stop, and threads are joined.
    """

    daemon_threads = True
    allow_reuse_address = False
    request_queue_size = 256  # bursts of concurrent clients must not overflow the backlog

    def __init__(self, owner: FaultServer, address: tuple[str, int]) -> None:
        self.owner = owner
        self.stopping = threading.Event()
        self.conns: set[socket.socket] = set()
        self.handlers: list[threading.Thread] = []
        self.track_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"fault-server-conn:{client_address[1]}",
            daemon=True,
        )
        with self.track_lock:
            self.conns.add(request)
            self.handlers = [t for t in self.handlers if t.is_alive()]
            self.handlers.append(thread)
        thread.start()

    def shutdown_request(self, request: Any) -> None:
        with self.track_lock:
            self.conns.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a client hanging up is normal here; anything else is recorded."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError | _Closed):
            return
        log.debug("fault server handler error", exc_info=True)
        if exc is not None:
            self.owner._errors.append(exc)

    def release_and_join(self) -> None:
        """After `shutdown()`: wake every handler (held, idle or writing), join them."""
        with self.track_lock:
            conns, handlers = list(self.conns), list(self.handlers)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in handlers:
            t.join()


class _Handler(BaseHTTPRequestHandler):
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
        """Wait `seconds`; raise `_Closed` early on shutdown or client hang-up."""
        deadline = time.monotonic() + seconds
        stopping = self.server.stopping
        while True:
            if stopping.is_set():
                raise _Closed
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                readable, _, _ = select.select([self.connection], [], [], min(remaining, _POLL))
                if readable and not self.connection.recv(1, socket.MSG_PEEK):
                    raise _Closed  # EOF: the client gave up
            except (OSError, ValueError):
                raise _Closed from None
            if readable:  # pipelined bytes: cannot watch for EOF, just wait
                if stopping.wait(max(0.0, deadline - time.monotonic())):
                    raise _Closed
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
        self._json(status, _error_body(message, type_))

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
                data = [_model_obj(m) for m in owner._script.models]
                self._json(200, {"object": "list", "data": data})
            elif path.startswith("/v1/models/"):
                self._json(200, _model_obj(path.removeprefix("/v1/models/")))
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
        except (_Closed, OSError):
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
                pieces = _split(step.text, step.chunks)
                self._stream(step, model, request, pieces, "done")
            else:
                self._json(200, _completion(model, step.text, step.finish_reason, request))
        elif kind == "status":
            body = step.body
            if body is None:
                body = _error_body(f"scripted HTTP {step.status}", _error_type(step.status))
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
            full = json.dumps(_completion(model, step.text, "stop", request)).encode()
            self._send(200, full[: len(full) // 2], "application/json", length=len(full))
        elif kind == "invalid_json":
            body = (
                step.body
                if step.body is not None
                else '{"id": "chatcmpl-broken", "choices": [ <html>oops'
            )
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
            chunks = step.chunks if step.chunks is not None else 3
            pieces = (
                [f"chunk-{i} " for i in range(1, chunks + 1)]
                if isinstance(chunks, int)
                else list(chunks)
            )
            self._stream(step, model, request, pieces, step.then)

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
        ident, created = _ident(), int(time.time())
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
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            out: dict[str, Any] = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": [choice],
            }
            if usage:
                out["usage"] = None
            return out

        for n, piece in enumerate(pieces):
            if n and step.interval:
                self._hold(step.interval)
            delta = {"role": "assistant", "content": piece} if n == 0 else {"content": piece}
            self._event(chunk(delta, None))
        if then == "done":
            self._event(chunk({}, step.finish_reason))
            if usage:
                done = chunk({}, None)
                done["choices"] = []
                done["usage"] = _usage(request, "".join(pieces))
                self._event(done)
            self._event(b"[DONE]")
            self._chunk(b"")  # the terminating zero-length chunk
        elif then == "error":
            error = {
                "message": "scripted stream error",
                "type": "server_error",
                "param": None,
                "code": None,
                **(step.error or {}),
            }
            self._event({"error": error})
            self._chunk(b"")
        elif then == "hang":
            self._hold(step.seconds)
        # "cut" (and "hang" after holding): return with close_connection set,
        # so the socket closes with the chunked body unfinished.


def _split(text: str, chunks: int | tuple[str, ...] | None) -> list[str]:
    if isinstance(chunks, tuple):
        return list(chunks)
    if chunks is None:
        return re.findall(r"\s*\S+\s*", text) or [text]
    size, extra = divmod(len(text), chunks)
    out, at = [], 0
    for i in range(chunks):
        n = size + (1 if i < extra else 0)
        out.append(text[at : at + n])
        at += n
    return out


_ids = itertools.count(1)
_ids_lock = threading.Lock()


def _ident() -> str:
    with _ids_lock:
        return f"chatcmpl-fault-{next(_ids):06d}"


def _tokens(text: str) -> int:
    return len(text.split())


def _usage(request: Mapping[str, Any], text: str) -> dict[str, int]:
    prompt = 0
    messages = request.get("messages")
    if isinstance(messages, list):
        for m in messages:
            content = m.get("content") if isinstance(m, Mapping) else None
            prompt += _tokens(content) if isinstance(content, str) else 1
    completion = _tokens(text)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _completion(model: str, text: str, finish: str, request: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": _ident(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": _usage(request, text),
    }


def _error_type(status: int) -> str:
    return {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_exceeded",
    }.get(status, "server_error" if status >= 500 else "invalid_request_error")


def _error_body(message: str, type_: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": None}}


def _model_obj(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "fallgate-fault-server"}


# --------------------------------------------------------------------------- server


def _is_loopback(host: str) -> bool:
    return host == "localhost" or re.fullmatch(r"127(\.\d{1,3}){3}", host) is not None


ScriptLike = Script | Mapping[str, Any] | str | os.PathLike[str] | None


def _as_script(script: ScriptLike) -> Script:
    if isinstance(script, str | os.PathLike):
        return load_script(script)
    return parse_script(script)


class FaultServer:
    """The scripted server; a context manager that starts on enter and, on exit,
    stops promptly (held requests are released), closes every socket and joins
    every thread."""

    def __init__(
        self, script: ScriptLike = None, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        if not _is_loopback(host):
            raise ValueError(f"the fault server binds loopback only, not {host!r}")
        self._script = _as_script(script)
        self._host, self._port = host, port
        self._lock = threading.Lock()
        self._cursor: dict[str, int] = {}
        self._counts: dict[str, int] = {}
        self._requests: list[RequestRecord] = []
        self._errors: list[BaseException] = []
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> FaultServer:
        if self._httpd is not None:
            raise RuntimeError("the fault server is already running")
        self._httpd = _HTTPServer(self, (self._host, self._port))
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": _POLL},
            name=f"fault-server:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        httpd.stopping.set()
        httpd.shutdown()  # ends serve_forever: no new connections
        httpd.release_and_join()
        httpd.server_close()  # closes the listening socket
        if thread is not None:
            thread.join()
        self._httpd = self._thread = None

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the fault server is not running")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What to give an OpenAI client: ``http://127.0.0.1:PORT/v1``."""
        return f"{self.url}/v1"

    # -- script and observations

    def script(self, script: ScriptLike) -> None:
        """Replace the script (validated first) and reset counts and records."""
        parsed = _as_script(script)
        with self._lock:
            self._script = parsed
            self._cursor.clear()
            self._counts.clear()
            self._requests.clear()

    @property
    def current_script(self) -> Script:
        return self._script

    def count(self, model: str) -> int:
        """Chat-completion requests received for `model` since the last script."""
        with self._lock:
            return self._counts.get(model, 0)

    @property
    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._requests)

    @property
    def errors(self) -> list[BaseException]:
        """Unexpected exceptions inside handlers (tests assert this stays empty)."""
        return list(self._errors)

    def _take(
        self,
        model: str,
        stream: bool,
        api_key: str | None,
        path: str,
        body: Mapping[str, Any],
    ) -> tuple[Step, int | None]:
        with self._lock:
            steps = self._script.models.get(model, ())
            i = self._cursor.get(model, 0)
            step, index = (steps[i], i) if i < len(steps) else (self._script.default, None)
            self._cursor[model] = i + 1
            self._counts[model] = self._counts.get(model, 0) + 1
            self._requests.append(
                RequestRecord(
                    model=model,
                    stream=stream,
                    api_key=api_key,
                    time=time.monotonic(),
                    path=path,
                    kind=step.kind,
                    step=index,
                    body=body,
                )
            )
            return step, index

    def __repr__(self) -> str:
        where = self.base_url if self._httpd is not None else "stopped"
        return f"FaultServer({where}, counts={self.counts})"


# --------------------------------------------------------------------------- CLI


def serve_main(script_path: str | None, host: str = "127.0.0.1", port: int = 0) -> int:
    """`fallgate serve`: run until Ctrl-C (or SIGTERM). 0 on a clean stop, 2 on a
    bad script or address (one line on stderr, no traceback)."""
    try:
        script = load_script(script_path) if script_path else Script()
        server = FaultServer(script, host=host, port=port)
        server.start()
    except ScriptError as e:
        print(f"fallgate serve: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:
        print(f"fallgate serve: cannot listen on {host}:{port}: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        print(f"fault server listening on {server.base_url}", flush=True)
        source = script_path or "(no script)"
        print(f"script {source}: {script.summary()}", flush=True)
        try:
            while not stop.wait(0.2):
                pass
        except KeyboardInterrupt:
            pass
    finally:
        server.stop()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    counts = ", ".join(f"{m} x{n}" for m, n in server.counts.items()) or "none"
    print(f"stopped; requests: {counts}", flush=True)
    return 0
