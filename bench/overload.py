"""Overload: 1,000 concurrent turns against a healthy loopback server whose accept
queue overflows.

The server (`serve`) is a minimal OpenAI-compatible chat endpoint on asyncio with a
small listen backlog (8): it answers every request it reads at once, but a burst of
1,000 connects overflows its accept queue, so many connects time out and the turns
see transport faults. Each system runs in a fresh child process (`client`) with the
same attempt timeout: the bare SDK with ``max_retries=2`` (its own jittered
retries) and `fallgate.providers.AsyncFallgate` (default policy: 3 attempts,
transport recovery, the 120 s deadline: the bare SDK has none, and a shorter one
would end fallgate's turns while the SDK's still retry, which compares deadlines,
not recovery). Reported per system: turns answered,
wall time, the slowest turn, requests the server answered, and for fallgate the SDK
clients built and transport recoveries that rebuilt them.

`tests/test_e2e_overload.py` runs the same server and clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # `python -m bench.overload` runs from here
MESSAGES = [{"role": "user", "content": "Say hi."}]
SYSTEMS = ("bare_sdk", "fallgate")
MODEL = "overload-model"
BACKLOG = 8
#: Busy loops beside the saturated run (`measure(saturate=...)`).
SATURATE = 2

_BODY = json.dumps(
    {
        "id": "chatcmpl-overload",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()
_REPLY = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(_BODY),
    _BODY,
)


async def _serve(backlog: int) -> int:
    answered = 0

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal answered
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if length:
                    await r.readexactly(length)
                answered += 1
                w.write(_REPLY)
                await w.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        except asyncio.CancelledError:  # the client went away mid-request
            pass
        finally:
            w.close()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = await asyncio.start_server(handle, sock=sock, backlog=backlog)
    print(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    async with server:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until EOF
    print(json.dumps({"answered": answered}), flush=True)
    return 0


def _pin(pid: int, cpus: set[int] | None) -> None:
    if cpus is not None:
        os.sched_setaffinity(pid, cpus)


@contextlib.contextmanager
def busy_loops(n: int, cpus: set[int] | None) -> Iterator[None]:
    """`n` processes that spin on `cpus` until the block ends (a saturated machine)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        for p in procs:
            _pin(p.pid, cpus)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@contextlib.contextmanager
def server_process(
    backlog: int = BACKLOG, cpus: set[int] | None = None
) -> Iterator[tuple[str, dict[str, int]]]:
    """The server in its own process (on `cpus`); yields (base URL, counts), counts
    filled on exit."""
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.overload", "serve", str(backlog)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    _pin(server.pid, cpus)
    assert server.stdout is not None and server.stdin is not None
    counts: dict[str, int] = {}
    try:
        base_url = server.stdout.readline().strip()
        if not base_url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"overload server did not start: {base_url!r}")
        yield base_url, counts
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        last = server.stdout.read().strip().splitlines()
        server.stdout.close()
        if last:
            counts.update(json.loads(last[-1]))


def _client(
    system: str, base_url: str, timeout: float, deadline: float
) -> tuple[Callable[[], Awaitable[Any]], Callable[[], dict[str, Any]]]:
    if system == "bare_sdk":
        import openai

        c = openai.AsyncOpenAI(
            base_url=base_url, api_key="sk-overload", max_retries=2, timeout=timeout
        )
        return (lambda: c.chat.completions.create(model=MODEL, messages=MESSAGES)), dict
    from fallgate.fsm import Policy, Target
    from fallgate.fsm.policy.model import Credential

    from fallgate import providers

    policy = Policy(
        targets=[Target("local", MODEL, base_url, credentials=[Credential.literal("sk-overload")])],
        attempt_timeout=timeout,
        deadline=deadline,
    )
    gate = providers.AsyncFallgate(policy)

    def stats() -> dict[str, Any]:
        s = gate.clients.stats()
        return {
            "clients_built": s["built"],
            "rebuilds": s["rebuilds"],
            "admission_cuts": gate._admission.cuts,
        }

    return (lambda: gate.chat.completions.create(messages=MESSAGES)), stats


async def _client_main(
    system: str, base_url: str, turns: int, timeout: float, deadline: float
) -> dict[str, Any]:
    call, stats = _client(system, base_url, timeout, deadline)
    answered = 0
    slowest = 0.0
    errors: dict[str, int] = {}

    async def one() -> None:
        nonlocal answered, slowest
        t = time.perf_counter()
        try:
            reply = await call()
            answered += bool(reply.choices[0].message.content)
        except Exception as e:  # the outcome is data here
            why = _why(e)
            errors[why] = errors.get(why, 0) + 1
        slowest = max(slowest, time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(turns)))
    return {
        "answered": answered,
        "seconds": round(time.perf_counter() - t0, 3),
        "slowest_turn_seconds": round(slowest, 3),
        "errors": errors,
        **stats(),
    }


_DIGITS = re.compile(r"\d+(\.\d+)?")


def _why(e: Exception) -> str:
    """The failure's kind, with fallgate's summary (numbers masked so that equal causes
    count together): is it the deadline, the retry budget, or attempts used up?"""
    summary = getattr(e, "summary", None)
    if not isinstance(summary, str):
        return type(e).__name__
    return f"{type(e).__name__}: {_DIGITS.sub('N', summary)[:240]}"


def _args(*values: float) -> list[str]:
    return [str(v) for v in values]


def run_client(
    system: str,
    base_url: str,
    turns: int,
    timeout: float,
    deadline: float,
    cap: float = 300,
    cpus: set[int] | None = None,
) -> dict[str, Any]:
    """One system's run in a fresh child process (on `cpus`)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.overload",
            "client",
            system,
            base_url,
            *_args(turns, timeout, deadline),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    _pin(proc.pid, cpus)
    try:
        stdout, stderr = proc.communicate(timeout=cap)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"{system} overload run failed: {stderr[-800:]}")
    res: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return res


def one_cpu() -> set[int] | None:
    """One CPU this process may run on (None where affinity cannot be set)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    return {max(os.sched_getaffinity(0))}


def measure(
    turns: int = 1000,
    timeout: float = 4.0,
    deadline: float = 120.0,
    backlog: int = BACKLOG,
    log: Any = None,
    saturate: int = 0,
) -> dict[str, Any]:
    """Both systems at the same time, each against a server of its own: whatever else
    the machine is doing weighs on both alike (run one after the other, a busy moment
    would decide the comparison).

    `saturate` > 0: a saturated client on purpose, the same on any machine: both
    clients, both servers and `saturate` busy loops share one CPU (Linux affinity), so
    each process gets a fraction of it and the clients' event loops lag by seconds."""
    cpus = one_cpu() if saturate else None
    if saturate and cpus is None:
        raise RuntimeError("saturate needs os.sched_setaffinity (Linux)")
    out: dict[str, Any] = {
        "turns": turns,
        "attempt_timeout": timeout,
        "deadline": deadline,
        "backlog": backlog,
        "saturate": saturate,
    }
    with contextlib.ExitStack() as stack:
        stack.enter_context(busy_loops(saturate, cpus))
        servers = {s: stack.enter_context(server_process(backlog, cpus)) for s in SYSTEMS}
        with ThreadPoolExecutor(len(SYSTEMS)) as pool:
            runs = {
                s: pool.submit(run_client, s, servers[s][0], turns, timeout, deadline, 300, cpus)
                for s in SYSTEMS
            }
            results = {s: f.result() for s, f in runs.items()}
    for system in SYSTEMS:
        res = results[system]
        res["server_answered"] = servers[system][1].get("answered")
        out[system] = res
        if log is not None:
            log(f"  {system:9s} {res['answered']}/{turns} answered in {res['seconds']:.2f}s")
    return out


def table(o: dict[str, Any]) -> list[str]:
    saturated = (
        f"; saturated: both clients, both servers and {o['saturate']} busy loops on one CPU"
        if o.get("saturate")
        else ""
    )
    rows = [
        f"**Overload** ({o['turns']} concurrent turns, loopback server with listen backlog "
        f"{o['backlog']}; attempt timeout {o['attempt_timeout']:g} s, fallgate deadline "
        f"{o['deadline']:g} s{saturated}; one run each)",
        "",
        "| system | answered | seconds | slowest turn s | requests answered | SDK clients built |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    names = {"bare_sdk": "bare `openai.AsyncOpenAI` (max_retries=2)", "fallgate": "fallgate"}
    for system in SYSTEMS:
        r = o[system]
        rows.append(
            f"| {names[system]} | {r['answered']} | {r['seconds']:.2f} "
            f"| {r['slowest_turn_seconds']:.2f} | {r.get('server_answered', '-')} "
            f"| {r.get('clients_built', 1)} |"
        )
    return [*rows, ""]


def main(argv: list[str]) -> int:
    if argv[1] == "serve":
        return asyncio.run(_serve(int(argv[2])))
    if argv[1] == "client":
        system, base_url = argv[2], argv[3]
        turns, timeout, deadline = int(argv[4]), float(argv[5]), float(argv[6])
        res = asyncio.run(_client_main(system, base_url, turns, timeout, deadline))
        print(json.dumps(res), flush=True)
        return 0
    raise SystemExit(f"usage: python -m bench.overload serve|client ...; got {argv[1:]}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
