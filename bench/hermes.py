"""hermes-agent alone and with fallgate attached, on the faults table's scenarios.

The scenarios, the windowed fault server, the cap and the per-run child
process are the faults table's (`bench.faults`, `bench.scenarios`); the child
is `bench/hermes_worker.py` run by the hermes venv's python (`make hermes-venv`:
hermes-agent 0.19.0, its openai 2.24.0, fallgate's wheel), which times one whole
`AIAgent.run_conversation` (a warm agent: one conversation on another model
first). hermes' own timeouts are 1 s (``HERMES_STREAM_READ_TIMEOUT``,
``HERMES_API_TIMEOUT``), like every system's client timeout in the faults table.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .faults import DEFAULT_CAP, _run_one
from .scenarios import FALLBACK, PRIMARY, SCENARIOS, Scenario, WindowedFaultServer

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "bench" / "hermes_worker.py"
SYSTEMS = ("hermes-agent", "hermes-agent + fallgate")


def hermes_python() -> str:
    """The hermes venv's python (``FALLGATE_HERMES_PYTHON`` overrides)."""
    py = os.environ.get("FALLGATE_HERMES_PYTHON") or str(ROOT / "build/hermes-venv/bin/python")
    if not Path(py).exists():
        raise SystemExit(
            f"bench --only hermes needs the hermes venv ({py} is missing): run "
            "`make bench-hermes` (or `make hermes-venv` first)"
        )
    return py


def measure(
    scenarios: Sequence[Scenario] = SCENARIOS,
    systems: Sequence[str] = SYSTEMS,
    cap: float = DEFAULT_CAP,
    log: Any = None,
) -> list[dict[str, Any]]:
    command = (hermes_python(), "-P", str(WORKER))
    out = []
    with WindowedFaultServer() as srv:
        for sc in scenarios:
            for system in systems:
                r = _run_one(srv, sc, system, cap, command)
                worker = r.pop("_worker")
                r["requests_per_model"] = r["_per_model"]
                r["hermes_fallback"] = bool(worker.get("hermes_fallback", False))
                if log is not None:
                    log(
                        f"  {sc.name[:40]:40s} {system:24s} {r['seconds']:7.2f}s "
                        f"req={r['requests_per_model']} answered={r['answered']} "
                        f"hermes-fallback={r['hermes_fallback']} {r['_note'][:60]}"
                    )
                out.append(r)
    return out


def table(rows: Sequence[dict[str, Any]], cap: float = DEFAULT_CAP) -> list[str]:
    lines = [
        "**Inside hermes-agent** (`python -m bench --only hermes`: a whole "
        "`AIAgent.run_conversation` of hermes-agent 0.19.0 over real HTTP to the fault "
        f"server; hermes' timeouts and fallgate's attempt timeout 1 s; each run capped at "
        f"{cap:g} s)",
        "",
        "| scenario | oracle s | system | seconds | requests per model | answered "
        "| hermes' own fallback |",
        "|---|---:|---|---:|---|:---:|:---:|",
    ]
    last = None
    for r in rows:
        sc = r["scenario"] if r["scenario"] != last else ""
        orc = f"{r['oracle_seconds']:.2f}" if sc else ""
        last = r["scenario"]
        per = ", ".join(f"{m} x{n}" for m, n in sorted(r["requests_per_model"].items(), key=_order))
        lines.append(
            f"| {sc} | {orc} | {r['system']} | {r['seconds']:.2f} | {per or '-'} "
            f"| {'yes' if r['answered'] else '**no**'} "
            f"| {'fired' if r['hermes_fallback'] else '-'} |"
        )
    lines.append("")
    return lines


def _order(item: tuple[str, int]) -> tuple[int, str]:
    """The primary first, then the fallback, then anything else."""
    model = item[0]
    return ({PRIMARY: 0, FALLBACK: 1}.get(model, 2), model)
