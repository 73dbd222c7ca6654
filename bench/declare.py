"""Declaration size: time and memory to declare a chain's machine and take its first turn.

    python -m bench --only declare      # 10, 100 and 1,000 targets

For each chain length n: the time to declare the machine, the time to declare it,
compile the executor's table and start the first turn, and the memory the
declaration and table hold (tracemalloc, a separate run). Ratios between
consecutive sizes show the growth: about 10 for a tenfold chain is linear, about
100 quadratic. Chains longer than the policy's limit (`fsm.policy.model.MAX_TARGETS`)
are built with the limit raised for the measurement only.
"""

from __future__ import annotations

import gc
import itertools
import time
import tracemalloc
from typing import Any

SIZES = (10, 100, 1000)


def _policy(n: int) -> Any:
    from fallgate.fsm.policy import model as pol

    limit = getattr(pol, "MAX_TARGETS", None)
    if limit is not None and n > limit:
        pol.MAX_TARGETS = n  # measuring beyond the limit: raised for this build only
    try:
        return pol.Policy(
            targets=[
                pol.Target("bench", f"m{i}", "http://127.0.0.1:9/v1", keyless=True, index=i)
                for i in range(n)
            ]
        )
    finally:
        if limit is not None:
            pol.MAX_TARGETS = limit


def _first_turn(n: int) -> tuple[float, float, Any]:
    """(seconds to declare, seconds to declare + compile + start), the declaration."""
    from fallgate.fsm import HealthStore
    from fallgate.fsm.core.machine import declare
    from fallgate.fsm.core.turn import Turn

    policy = _policy(n)
    gc.collect()
    t0 = time.perf_counter()
    decl = declare(policy)
    t1 = time.perf_counter()
    Turn(policy, health=HealthStore(), clock=lambda: 0.0).start()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t0, decl


def _held_mb(n: int) -> float:
    """MB still allocated after declaring, compiling and starting (what the policy keeps)."""
    from fallgate.fsm import HealthStore
    from fallgate.fsm.core.machine import declare
    from fallgate.fsm.core.turn import Turn

    policy = _policy(n)
    gc.collect()
    tracemalloc.start()
    try:
        declare(policy)
        Turn(policy, health=HealthStore(), clock=lambda: 0.0).start()
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return held / 1e6


def measure(sizes: tuple[int, ...] = SIZES, log: Any = print) -> dict[str, Any]:
    rows = []
    for n in sizes:
        declare_s, first_turn_s, decl = _first_turn(n)
        edges = getattr(decl, "edges", None)
        rows.append(
            {
                "targets": n,
                "declared": len(decl.transitions),
                "edges": sum(1 for _ in edges()) if edges else len(decl.transitions),
                "declare_s": round(declare_s, 4),
                "first_turn_s": round(first_turn_s, 4),
                "held_mb": round(_held_mb(n), 2),
            }
        )
        log(f"  {n} targets: {rows[-1]}")
    for prev, row in itertools.pairwise(rows):
        row["first_turn_growth"] = round(row["first_turn_s"] / max(prev["first_turn_s"], 1e-9), 1)
        row["held_growth"] = round(row["held_mb"] / max(prev["held_mb"], 1e-9), 1)
    return {"rows": rows}


def table(result: dict[str, Any]) -> str:
    lines = [
        "**Declaration size** (declare the machine, compile the executor's table, start the "
        "first turn; memory held afterwards)",
        "",
        "| targets | declared items | edges | declare s | first turn s | growth "
        "| held MB | growth |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['targets']} | {r['declared']} | {r['edges']} | {r['declare_s']:.4f} "
            f"| {r['first_turn_s']:.4f} | {r.get('first_turn_growth', '')} "
            f"| {r['held_mb']:.2f} | {r.get('held_growth', '')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(measure()))
