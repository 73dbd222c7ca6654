"""Throughput: many concurrent async turns against a fast fault server.

The server runs in its own process; each (system, round) runs in a fresh child
process so that its peak RSS (ru_maxrss) is its own: baseline after imports and
client construction, peak after the turns. Systems alternate across rounds and
each keeps its best wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import resource
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from .scenarios import FALLBACK, PRIMARY

MESSAGES = [{"role": "user", "content": "Say hi."}]
SYSTEMS = ("fallgate", "bare_sdk")
#: The CPU comparison also runs the other embedding: the bare SDK over fallgate.http_client.
INTERLEAVED = ("fallgate", "http_client", "bare_sdk")


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0  # kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    """Restart the peak-RSS mark (VmHWM) here, so that an import-time peak does
    not hide the run's own (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_mb() -> float:
    try:
        return _status_mb("VmHWM")
    except (OSError, RuntimeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _rss_mb() -> float:
    try:
        return _status_mb("VmRSS")
    except (OSError, RuntimeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _client(system: str, base_url: str) -> Callable[[], Awaitable[Any]]:
    if system == "bare_sdk":
        import openai

        c = openai.AsyncOpenAI(base_url=base_url, api_key="sk-primary", timeout=30.0)
        return lambda: c.chat.completions.create(model=PRIMARY, messages=MESSAGES)
    from fallgate.fsm import Policy, Target
    from fallgate.fsm.policy.model import Credential

    from fallgate import providers

    policy = Policy(
        targets=[
            Target("fault", PRIMARY, base_url, credentials=[Credential.literal("sk-primary")]),
            Target("fault", FALLBACK, base_url, credentials=[Credential.literal("sk-fallback")]),
        ],
        attempt_timeout=30.0,
    )
    if system == "http_client":
        import openai

        import fallgate

        http = fallgate.async_http_client(policy)
        c = openai.AsyncOpenAI(base_url=base_url, api_key="unused", http_client=http)
        return lambda: c.chat.completions.create(model=PRIMARY, messages=MESSAGES)
    fg = providers.AsyncFallgate(policy)
    return lambda: fg.chat.completions.create(model=PRIMARY, messages=MESSAGES)


async def _turns(call: Callable[[], Awaitable[Any]], turns: int, concurrency: int) -> int:
    sem = asyncio.Semaphore(concurrency)
    ok = 0

    async def one() -> None:
        nonlocal ok
        async with sem:
            r = await call()
            if r.choices[0].message.content:
                ok += 1

    await asyncio.gather(*(one() for _ in range(turns)))
    return ok


async def _client_main(system: str, base_url: str, turns: int, concurrency: int) -> dict[str, Any]:
    call = _client(system, base_url)
    await _turns(call, 3, 1)  # warm: lazy imports, first connection
    gc.collect()
    _reset_peak()
    base = _rss_mb()  # the growth above this is what the in-flight turns hold
    cpu0 = _cpu()
    t0 = time.perf_counter()
    ok = await _turns(call, turns, concurrency)
    seconds = time.perf_counter() - t0
    cpu = _cpu() - cpu0
    peak = _peak_mb()
    return {
        "seconds": seconds,
        "answered": ok,
        "baseline_mb": base,
        "peak_mb": peak,
        "client_cpu_ms_per_turn": cpu / turns * 1000,
    }


async def _interleaved_main(
    base_url: str, rounds: int, turns: int, concurrency: int
) -> dict[str, Any]:
    """Both systems in one process, round after round (the order alternating): each
    round's CPU ratio compares them at one moment of the machine."""
    calls = {s: _client(s, base_url) for s in INTERLEAVED}
    for call in calls.values():
        await _turns(call, 20, 5)  # warm
    ratios = []
    http_ratios = []
    per_turn: dict[str, list[float]] = {s: [] for s in INTERLEAVED}
    for r in range(rounds):
        cpu: dict[str, float] = {}
        for system in INTERLEAVED if r % 2 == 0 else INTERLEAVED[::-1]:
            gc.collect()
            c0 = time.process_time()
            ok = await _turns(calls[system], turns, concurrency)
            cpu[system] = time.process_time() - c0
            if ok != turns:
                raise RuntimeError(f"{system}: {ok} of {turns} turns answered")
            per_turn[system].append(cpu[system] / turns * 1000)
        ratios.append(cpu["fallgate"] / cpu["bare_sdk"])
        http_ratios.append(cpu["http_client"] / cpu["bare_sdk"])
    ratios.sort()
    http_ratios.sort()
    return {
        "rounds": rounds,
        "turns_per_round": turns,
        "cpu_ratio_median": round(ratios[len(ratios) // 2], 3),
        "cpu_ratios": [round(x, 3) for x in ratios],
        # the bare SDK over fallgate.http_client (the embedding agent frameworks use)
        "http_client_cpu_ratio_median": round(http_ratios[len(http_ratios) // 2], 3),
        "http_client_cpu_ratios": [round(x, 3) for x in http_ratios],
        "cpu_ms_per_turn_min": {s: round(min(v), 3) for s, v in per_turn.items()},
    }


def interleaved(base_url: str, rounds: int = 45, turns: int = 200, concurrency: int = 50) -> Any:
    """`_interleaved_main` in a child process (the parent's CPU is not the client's)."""
    sizes = [str(rounds), str(turns), str(concurrency)]
    out = subprocess.run(
        [sys.executable, "-m", "bench.throughput", "interleaved", base_url, *sizes],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if out.returncode != 0:
        raise RuntimeError(f"interleaved CPU run failed: {out.stderr[-800:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _serve() -> int:
    import fallgate.providers.testing.fault_server as fs

    # 200 clients connect at once: the stdlib default listen backlog (5) would drop SYNs.
    fs.FaultHTTPServer.request_queue_size = 1024
    with fs.FaultServer({"default": {"kind": "answer", "text": "ok"}}) as srv:
        print(srv.base_url, flush=True)
        sys.stdin.read()  # until the parent closes our stdin
        print(json.dumps(srv.counts), flush=True)
    return 0


@contextlib.contextmanager
def server_process() -> Iterator[str]:
    """The fast fault server in its own process (its CPU is not the client's); yields
    its base URL and stops it on the way out."""
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.throughput", "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdin is not None
    try:
        base_url = server.stdout.readline().strip()
        if not base_url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"throughput server did not start: {base_url!r}")
        yield base_url
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        server.stdout.close()


def measure(
    turns: int = 2000,
    concurrency: int = 200,
    rounds: int = 3,
    log: Any = None,
    cpu_rounds: int = 45,
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
    with server_process() as base_url:
        inter = interleaved(base_url, rounds=cpu_rounds)
        if log is not None:
            log(
                f"  client CPU / bare SDK, {cpu_rounds} interleaved rounds in one process: "
                f"the wrapper median {inter['cpu_ratio_median']:.3f}x, fallgate.http_client "
                f"median {inter['http_client_cpu_ratio_median']:.3f}x"
            )
        for r in range(rounds):
            order = SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]
            for system in order:
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "bench.throughput",
                        "client",
                        system,
                        base_url,
                        str(turns),
                        str(concurrency),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                if out.returncode != 0:
                    raise RuntimeError(f"{system} throughput run failed: {out.stderr[-800:]}")
                res = json.loads(out.stdout.strip().splitlines()[-1])
                if res["answered"] != turns:
                    raise RuntimeError(f"{system}: {res['answered']} of {turns} turns answered")
                runs[system].append(res)
                if log is not None:
                    log(
                        f"  round {r + 1} {system:9s} {res['seconds']:7.3f}s "
                        f"rss {res['baseline_mb']:.1f} -> {res['peak_mb']:.1f} MB, "
                        f"client CPU {res['client_cpu_ms_per_turn']:.2f} ms/turn"
                    )

    def best(system: str) -> dict[str, Any]:
        return min(runs[system], key=lambda x: x["seconds"])

    def growth(system: str) -> float:
        # Memory is less noisy than time: the median run's growth above baseline.
        g = sorted(x["peak_mb"] - x["baseline_mb"] for x in runs[system])
        return g[len(g) // 2]

    fg, bare = best("fallgate"), best("bare_sdk")
    # CPU per turn, paired: each round runs both systems back to back, so the ratio of a
    # round compares them at one moment of the machine; the median over rounds is less
    # at the mercy of one busy moment than a ratio of two best-ofs from different rounds.
    ratios = sorted(
        f["client_cpu_ms_per_turn"] / b["client_cpu_ms_per_turn"]
        for f, b in zip(runs["fallgate"], runs["bare_sdk"], strict=True)
    )
    return {
        "turns": turns,
        "concurrency": concurrency,
        "fallgate_seconds": round(fg["seconds"], 3),
        "bare_sdk_seconds": round(bare["seconds"], 3),
        "peak_rss_mb_per_1k_turns": round(growth("fallgate") / turns * 1000, 3),
        "_bare_sdk_peak_rss_mb_per_1k_turns": round(growth("bare_sdk") / turns * 1000, 3),
        # CPU the client process spent per turn (best run): less noisy than wall time
        "_fallgate_cpu_ms_per_turn": round(
            min(x["client_cpu_ms_per_turn"] for x in runs["fallgate"]), 3
        ),
        "_bare_sdk_cpu_ms_per_turn": round(
            min(x["client_cpu_ms_per_turn"] for x in runs["bare_sdk"]), 3
        ),
        "_cpu_ratio_median": round(ratios[len(ratios) // 2], 3),
        "_cpu_ratios": [round(r, 3) for r in ratios],
        "_cpu_interleaved": inter,
        "_runs": runs,
    }


def main(argv: list[str]) -> int:
    if argv[1] == "serve":
        return _serve()
    if argv[1] == "client":
        res = asyncio.run(_client_main(argv[2], argv[3], int(argv[4]), int(argv[5])))
        print(json.dumps(res), flush=True)
        return 0
    if argv[1] == "interleaved":
        res = asyncio.run(_interleaved_main(argv[2], int(argv[3]), int(argv[4]), int(argv[5])))
        print(json.dumps(res), flush=True)
        return 0
    raise SystemExit(f"usage: python -m bench.throughput serve|client ...; got {argv[1:]}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
