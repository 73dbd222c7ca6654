"""Retry storm: the primary answers 503 to everything and there is no fallback.

1,000 turns at concurrency 100 (threads), each system in its own process against one
fault server: how many requests reach the failing provider per turn. Retries multiply
the load on a provider that is already down; fallgate's retry budget (on by default)
and its breaker stop that. The peers are `bench.fault_worker`'s, configured as their
users would (SDK `max_retries=2`; tenacity's cookbook recipe around the SDK; LiteLLM's
Router with `num_retries=2`), with their real waits.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .scenarios import PRIMARY, WARMUP

SYSTEMS = ("fallgate", "tenacity + SDK", "openai SDK (max_retries=2)", "LiteLLM Router")
#: more steps than any system sends in a run (tenacity: 6 a turn); the default answers
#: the warm-up model
SCRIPT = {"models": {PRIMARY: [{"kind": "status", "status": 503}] * 10_000}}


def _client(system: str, base_url: str, turns: int, concurrency: int) -> dict[str, Any]:
    from .fault_worker import SYSTEMS as BUILD

    call, warm = BUILD[system](base_url, False)
    warm()
    print("ready", flush=True)
    sys.stdin.readline()  # go

    def one(_: int) -> bool:
        try:
            call()
        except Exception:  # the turn failing is the expected outcome here
            return False
        return True

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        answered = sum(pool.map(one, range(turns)))
    return {"seconds": time.perf_counter() - t0, "answered": answered}


def measure(
    turns: int = 1000,
    concurrency: int = 100,
    systems: tuple[str, ...] = SYSTEMS,
    log: Any = None,
) -> dict[str, Any]:
    import fallgate.providers.testing.fault_server as fs

    fs.FaultHTTPServer.request_queue_size = 1024  # 100 clients connect at once
    rows: list[dict[str, Any]] = []
    with fs.FaultServer(SCRIPT) as srv:
        for system in systems:
            srv.script(SCRIPT)
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.storm", system, srv.base_url, str(turns),
                 str(concurrency)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            assert proc.stdin is not None and proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                _, err = proc.communicate(timeout=30)
                raise RuntimeError(f"storm worker {system} did not start: {err[-800:]}")
            srv.script(SCRIPT)  # forget the warm-up requests
            proc.stdin.write("go\n")
            proc.stdin.flush()
            out, err = proc.communicate(timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(f"storm worker {system} failed: {err[-800:]}")
            res = json.loads(out.strip().splitlines()[-1])
            requests = srv.count(PRIMARY)
            if requests >= len(SCRIPT["models"][PRIMARY]):
                raise RuntimeError(f"{system}: the script's 503s ran out ({requests} requests)")
            row = {
                "system": system,
                "turns": turns,
                "requests": requests,
                "requests_per_turn": round(requests / turns, 3),
                "seconds": round(res["seconds"], 2),
                "_answered": res["answered"],
                "_other": {m: n for m, n in srv.counts.items() if m not in (PRIMARY, WARMUP)},
            }
            if log is not None:
                log(f"  {system:28s} {requests:6d} requests, {row['requests_per_turn']:.2f}/turn, "
                    f"{row['seconds']:.1f} s")
            rows.append(row)
    return {"turns": turns, "concurrency": concurrency, "systems": rows}


def main(argv: list[str]) -> int:
    res = _client(argv[1], argv[2], int(argv[3]), int(argv[4]))
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
