"""Checker: states per second and time to check the default policy exhaustively."""

from __future__ import annotations

import time
from typing import Any


def measure(rounds: int = 3, quick: bool = False) -> dict[str, Any]:
    """Best of `rounds` full checks of the default policy (rounds stop once one
    check takes over 30 s). `quick`: a bounded search of a two-target policy,
    only to show the harness works."""
    try:
        from fallgate.fsm.checker import check_policy, default_policy
    except ImportError as e:  # the checker is another issue's work
        raise RuntimeError(f"fsm.checker is not available yet ({e})") from None
    best: tuple[float, dict[str, Any], bool] | None = None
    for _ in range(max(1, rounds)):
        if quick:
            from .core import bench_policy

            t0 = time.perf_counter()
            report = check_policy(bench_policy(), turns=1, max_states=1500)
        else:
            policy = default_policy()
            t0 = time.perf_counter()
            report = check_policy(policy)
        seconds = time.perf_counter() - t0
        data = report.to_json()
        if best is None or seconds < best[0]:
            best = (seconds, data, bool(getattr(report, "complete", True)))
        if seconds > 30:
            break
    assert best is not None
    seconds, data, complete = best
    states = int(data["states"])
    return {
        "states": states,
        "seconds": round(seconds, 3),
        "states_per_second": round(states / seconds) if seconds > 0 else 0,
        "_transitions": data.get("transitions"),
        "_report_seconds": data.get("seconds"),
        "_complete": complete,
        "_policy": "bench_policy (bounded, quick)" if quick else "default_policy()",
    }
