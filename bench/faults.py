"""Time to answer under faults: real SDK, real HTTP, the fault server on loopback.

Each (scenario, system) run is a child process (`bench.fault_worker`) so that
a peer that decides to sleep for Retry-After can be capped and killed; the
request counts come from the server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from .fault_worker import SYSTEMS
from .scenarios import SCENARIOS, WARMUP, Scenario, WindowedFaultServer

DEFAULT_CAP = 30.0
READY_TIMEOUT = 120.0  # imports (LiteLLM takes seconds)


def _run_one(
    srv: WindowedFaultServer,
    sc: Scenario,
    system: str,
    cap: float,
    command: Sequence[str] = (sys.executable, "-m", "bench.fault_worker"),
) -> dict[str, Any]:
    """One (scenario, system) run: `command` + the JSON arguments is the worker
    (`bench.fault_worker`, or the hermes venv's `bench/hermes_worker.py`)."""
    srv.script(sc.script)
    srv.set_window(sc.window)
    args = json.dumps({"system": system, "base_url": srv.base_url, "fallback": sc.fallback})
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY="False")
    proc = subprocess.Popen(
        [*command, args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    note = ""
    res: dict[str, Any] = {}
    try:
        line = _readline(proc, READY_TIMEOUT)
        if line.strip() != "ready":
            raise RuntimeError(f"{system}: worker did not start: {line!r} {_stderr(proc)}")
        t0 = time.monotonic()
        line = _readline(proc, cap + 5.0)
        wall = time.monotonic() - t0
        if line:
            res = json.loads(line)
            seconds, answered, error = res["seconds"], res["answered"], res["error"]
            if seconds > cap:
                answered, note = False, f"over the {cap:g} s cap"
        else:
            seconds, answered, error = wall, False, ""
            note = f"capped: still running after {cap:g} s, killed"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()
    time.sleep(0.1)  # let the server see the hang-ups before counting
    counts = {m: n for m, n in srv.counts.items() if m != WARMUP}
    return {
        "scenario": sc.name,
        "system": system,
        "seconds": round(seconds, 3),
        "requests": sum(counts.values()),
        "answered": bool(answered),
        "oracle_seconds": sc.oracle_seconds,
        "_per_model": counts,
        "_note": note or error,
        "_worker": res,
    }


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    """One stdout line, or "" if none came within `timeout` (or the child died)."""
    import selectors

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            return ""
        return proc.stdout.readline()
    finally:
        sel.close()


def _stderr(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.kill()
    try:
        _, err = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        return ""
    return (err or "")[-600:]


def measure(
    scenarios: Sequence[Scenario] = SCENARIOS,
    systems: Sequence[str] = tuple(SYSTEMS),
    cap: float = DEFAULT_CAP,
    log: Any = None,
) -> list[dict[str, Any]]:
    out = []
    with WindowedFaultServer() as srv:
        for sc in scenarios:
            for system in systems:
                r = _run_one(srv, sc, system, cap)
                if log is not None:
                    log(
                        f"  {sc.name[:40]:40s} {system:28s} {r['seconds']:7.2f}s "
                        f"req={r['requests']} answered={r['answered']} {r['_note'][:60]}"
                    )
                out.append(r)
    return out
