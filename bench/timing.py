"""Interleaved best-of-N timing: every system runs once per round, in turn.

Absolute times on a shared 2-core machine are noisy; interleaving the systems
inside each round and keeping each one's best round makes the ratios fair.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping


def best_of(
    systems: Mapping[str, Callable[[], object]],
    *,
    number: int,
    rounds: int,
    per_round: dict[str, list[float]] | None = None,
) -> dict[str, float]:
    """Best µs per call of each zero-argument callable, interleaved over rounds
    (every round's figure is appended to `per_round[name]` when given)."""
    best = {name: float("inf") for name in systems}
    items = list(systems.items())
    for f in systems.values():  # warm caches (compiled tables, imports)
        for _ in range(max(1, number // 10)):
            f()
    was = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            order = items if r % 2 == 0 else items[::-1]
            for name, f in order:
                t0 = time.perf_counter()
                for _ in range(number):
                    f()
                dt = (time.perf_counter() - t0) / number * 1e6
                best[name] = min(best[name], dt)
                if per_round is not None:
                    per_round.setdefault(name, []).append(dt)
            gc.collect()
    finally:
        if was:
            gc.enable()
    return best


def median_ratio(per_round: Mapping[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of a/b measured in the same round (robust to load bursts)."""
    ratios = sorted(x / y for x, y in zip(per_round[a], per_round[b], strict=True) if y > 0)
    return ratios[len(ratios) // 2] if ratios else float("nan")
