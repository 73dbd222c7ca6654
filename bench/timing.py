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
) -> dict[str, float]:
    """Best µs per call of each zero-argument callable, interleaved over rounds."""
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
            gc.collect()
    finally:
        if was:
            gc.enable()
    return best
