"""A fault-injecting, OpenAI-compatible HTTP server for tests, demos and benchmarks.

Real HTTP on loopback (stdlib ``ThreadingHTTPServer``, HTTP/1.1 keep-alive,
chunked SSE streams), scripted per model: each request for a model takes that
model's next step; when the steps are used up the ``default`` step repeats.
It serves ``/v1/chat/completions``, ``/v1/responses`` (plain and streamed),
``/v1/embeddings`` and ``/v1/models``. The real ``openai`` SDK talks to it
exactly as it talks to a provider, so the faults it sees (statuses, hangs,
drops, cut streams, error events) are the real ones.

    with FaultServer({"models": {"glm-5.1": [{"kind": "status", "status": 429}]}}) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)

Modules: `.script` (the script format, its step kinds, parsing and
validation), `.scriptfile` (`load_script`), `.server` (`FaultServer`),
`.records` (`RequestRecord`, `RequestHeaders`), `.handler` (the HTTP request
handler: routes, and each step played), `.replies` (the chat completion,
embedding and error bodies), `.responses` (the Responses API shapes).

The server binds loopback only: it keeps the bearer tokens and headers it
receives (in memory, for credential tests), and never prints or logs a secret
one (`RequestHeaders` redacts them; `RequestRecord.header` reads them).
"""

from __future__ import annotations

import signal
import sys
import threading

from ....fsm.printable import printable
from .records import RequestHeaders, RequestRecord
from .script import Script, ScriptError, Step, ToolCall, parse_script
from .scriptfile import load_script
from .server import FaultHTTPServer as FaultHTTPServer  # bench/throughput.py raises its backlog
from .server import FaultServer

__all__ = [
    "FaultServer",
    "RequestHeaders",
    "RequestRecord",
    "Script",
    "ScriptError",
    "Step",
    "ToolCall",
    "load_script",
    "parse_script",
    "serve_main",
]


def serve_main(script_path: str | None, host: str = "127.0.0.1", port: int = 0) -> int:
    """`fallgate serve`: run until Ctrl-C (or SIGTERM). 0 on a clean stop, 2 on a
    bad script or address (one line on stderr, no traceback)."""
    try:
        script = load_script(script_path) if script_path else Script()
        server = FaultServer(script, host=host, port=port)
        server.start()
    except ScriptError as e:
        print(printable(f"fallgate serve: {e}"), file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:
        print(printable(f"fallgate serve: cannot listen on {host}:{port}: {e}"), file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        print(f"fault server listening on {server.base_url}", flush=True)
        source = script_path or "(no script)"
        print(printable(f"script {source}: {script.summary()}"), flush=True)
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
    print(printable(f"stopped; requests: {counts}"), flush=True)
    return 0
