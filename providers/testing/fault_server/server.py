"""The fault server itself: `FaultServer` (lifecycle, script, counts, `RequestRecord`s).

Real HTTP on loopback (stdlib ``ThreadingHTTPServer``, HTTP/1.1 keep-alive,
chunked SSE streams). The server binds loopback only: it keeps the bearer
tokens it receives (in memory, for credential-rotation tests), and never prints
or logs them.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Mapping
from http.server import ThreadingHTTPServer
from types import TracebackType
from typing import Any

from .handler import POLL, Closed, Handler
from .limits import Buckets, Limit, parse_limits_table
from .prompt_cache import PromptCache
from .records import RequestHeaders, RequestRecord
from .script import Script, Step, parse_script
from .scriptfile import load_script

__all__ = ["FaultServer", "RequestRecord", "ScriptLike"]

log = logging.getLogger("fallgate.fault_server")


class FaultHTTPServer(ThreadingHTTPServer):
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
        super().__init__(address, Handler)

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
        if isinstance(exc, OSError | Closed):
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


def _is_loopback(host: str) -> bool:
    return host == "localhost" or re.fullmatch(r"127(\.\d{1,3}){3}", host) is not None


ScriptLike = Script | Mapping[str, Any] | str | os.PathLike[str] | None


def _as_script(script: ScriptLike) -> Script:
    if isinstance(script, str | os.PathLike):
        return load_script(script)
    if isinstance(script, Mapping) and "limits" in script:
        script = {k: v for k, v in script.items() if k != "limits"}
    return parse_script(script)


def _limits_of(script: ScriptLike) -> dict[str, Limit]:
    """A mapping script's ``limits`` table (`limits.parse_limits_table`)."""
    if isinstance(script, Mapping):
        return parse_limits_table(script.get("limits"))
    return {}


class FaultServer:
    """The scripted server; a context manager that starts on enter and, on exit,
    stops promptly (held requests are released), closes every socket and joins
    every thread.

    `port`: 0 (the default) takes a free port (read `port` / `base_url` once started);
    a fixed one lets a policy file written beforehand point at the server. `host`
    must be a loopback address."""

    def __init__(
        self,
        script: ScriptLike = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: Mapping[str, Any] | None = None,
    ) -> None:
        if not _is_loopback(host):
            raise ValueError(
                f"the fault server binds IPv4 loopback only (127.0.0.1, 127.x.x.x or "
                f"localhost), not {host!r}"
            )
        self._script = _as_script(script)
        #: Per key and model request and token buckets (`limits`), from `limits=` and the
        #: script's ``limits`` table.
        self.buckets = Buckets({**_limits_of(script), **parse_limits_table(limits)})
        self._host, self._port = host, port
        self._lock = threading.Lock()
        self._cursor: dict[str, int] = {}
        self._counts: dict[str, int] = {}
        self._requests: list[RequestRecord] = []
        self._errors: list[BaseException] = []
        #: The prompt prefixes this server (one deployment) has answered, per key.
        self.prompt_cache = PromptCache()
        self._httpd: FaultHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> FaultServer:
        if self._httpd is not None:
            raise RuntimeError("the fault server is already running")
        self._httpd = FaultHTTPServer(self, (self._host, self._port))
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": POLL},
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
        for limit in _limits_of(script).values():
            self.buckets.set(limit)
        self.buckets.reset()
        with self._lock:
            self._script = parsed
            self._cursor.clear()
            self._counts.clear()
            self._requests.clear()

    def limit(
        self,
        model: str,
        *,
        requests: int | None = None,
        tokens: int | None = None,
        window: float = 60.0,
        style: str = "both",
    ) -> None:
        """Limit each key to `requests` and `tokens` per `window` seconds on `model`
        (`limits`); the model's buckets start empty."""
        self.buckets.set(Limit(model, requests, tokens, window, style))

    @property
    def current_script(self) -> Script:
        return self._script

    def count(self, model: str) -> int:
        """Requests received for `model` (on any endpoint) since the last script."""
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
        headers: RequestHeaders | None = None,
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
                    headers=headers if headers is not None else RequestHeaders(),
                )
            )
            return step, index

    def __repr__(self) -> str:
        where = self.base_url if self._httpd is not None else "stopped"
        return f"FaultServer({where}, counts={self.counts})"
