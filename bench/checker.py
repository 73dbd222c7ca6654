"""Checker: states per second and time to check the default policy exhaustively, and
the time to check a chain of 8 targets with 3 keys each (the scale of a real chain)."""

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
    chain = measure_chain(quick=quick)
    return {
        "states": states,
        "seconds": round(seconds, 3),
        "states_per_second": round(states / seconds) if seconds > 0 else 0,
        "chain_8x3_states": chain["states"],
        "chain_8x3_seconds": chain["seconds"],
        "_transitions": data.get("transitions"),
        "_report_seconds": data.get("seconds"),
        "_complete": complete,
        "_policy": "bench_policy (bounded, quick)" if quick else "default_policy()",
        "_chain_transitions": chain["transitions"],
        "_chain_complete": chain["complete"],
    }


def chain_policy(targets: int = 8, keys: int = 3) -> Any:
    """A chain of `targets` distinct providers with `keys` keys each, every other field
    the default (what `fallgate check` reads from such a TOML)."""
    from fallgate.fsm import Policy

    entries = [
        {
            "provider": f"p{i}",
            "model": f"model-{i}",
            "base_url": f"https://p{i}.example/v1",
            "key_envs": [f"BENCH_KEY_{i}_{k}" for k in range(keys)],
        }
        for i in range(targets)
    ]
    return Policy.from_dict(
        {"max_attempts": 3, "primary": entries[0], "fallback_providers": entries[1:]}
    )


def measure_chain(quick: bool = False) -> dict[str, Any]:
    """One exhaustive check of the 8 x 3 chain (`quick`: cut at 1,500 states)."""
    from fallgate.fsm.checker import check_policy

    policy = chain_policy()
    t0 = time.perf_counter()
    report = check_policy(policy, max_states=1500 if quick else 400_000)
    seconds = time.perf_counter() - t0
    return {
        "states": report.states,
        "seconds": round(seconds, 3),
        "transitions": report.transitions,
        "complete": bool(report.complete),
    }
