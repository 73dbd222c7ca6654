"""What an `AsyncFallgate` turn costs its caller beyond the bare SDK's own request,
counted (never timed) in one process against one loopback fault server.

The same request goes through `openai.AsyncOpenAI` directly and through
`AsyncFallgate` (real SDK, real HTTP, keep-alive warm); the counts per turn are
compared. The budgets are the adapter's structure: no async generator of its own
per turn (the asyncio host loop is a coroutine, a lease is a small class), and a
bounded number of Python calls on top of the SDK's (`python -m bench --only
throughput` measures the CPU that follows from them).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType
from typing import Any

import openai
import pytest
from fallgate.providers import AsyncFallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]
TURNS = 20
#: Python calls (and coroutine resumptions) a turn may add to the bare SDK's ~3,600:
#: the engine, the adapter and the attempt bounds, ~130 here (150-160 while the asyncio
#: host loop was an async generator, a lease a generator-based manager, and a call
#: built a GateResult nobody asked for): +142 measured (the fewest of 20 turns), then +4
#: for the router's look at a chain without groups (`fsm.core.members.route`) and +10
#: for the transport's look for an SSE reply to filter (`providers.openai.http.sse`).
EXTRA_CALLS = 160
#: Bytes a turn may allocate at its peak beyond the bare SDK's, and keep once done.
EXTRA_PEAK_BYTES = 10_000
KEPT_BYTES_PER_TURN = 256


@pytest.fixture(scope="module")
def server() -> Iterator[FaultServer]:
    with FaultServer({"default": {"kind": "answer", "text": "ok"}}) as srv:
        yield srv


Call = Callable[[], Awaitable[Any]]


def systems(srv: FaultServer) -> tuple[Call, Call, Callable[[], Awaitable[None]]]:
    bare = openai.AsyncOpenAI(base_url=srv.base_url, api_key="sk-bare-0000", max_retries=0)
    gate = AsyncFallgate(chain("m0", "m1", server=srv))

    async def close() -> None:
        await bare.close()
        await gate.aclose()

    return (
        lambda: bare.chat.completions.create(model="m0", messages=MSG),
        lambda: gate.chat.completions.create(model="m0", messages=MSG),
        close,
    )


async def per_turn(call: Call, count: Callable[[Call], Awaitable[int]]) -> float:
    for _ in range(3):  # warm: lazy imports, the first connection
        await call()
    return await count(call) / TURNS


async def python_calls(call: Call) -> int:
    """The fewest Python calls any one of TURNS turns made (times TURNS, as `per_turn`
    divides): a busy machine only adds calls (more event-loop rounds while a socket is
    not ready yet), so the fewest is the turn's own work."""
    counts: list[int] = []
    n = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal n
        if event == "call":
            n += 1

    for _ in range(TURNS):
        n = 0
        sys.setprofile(profile)
        try:
            await call()
        finally:
            sys.setprofile(None)
        counts.append(n)
    return min(counts) * TURNS


async def async_generators(call: Call) -> int:
    """How many async generators the turns start (the event loop's own hook counts them)."""
    n = 0
    firstiter, finalizer = sys.get_asyncgen_hooks()

    def counted(agen: Any) -> None:
        nonlocal n
        n += 1
        if firstiter is not None:
            firstiter(agen)

    sys.set_asyncgen_hooks(firstiter=counted, finalizer=finalizer)
    try:
        for _ in range(TURNS):
            await call()
    finally:
        sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=finalizer)
    return n


def measure(srv: FaultServer, count: Callable[[Call], Awaitable[int]]) -> tuple[float, float]:
    async def main() -> tuple[float, float]:
        bare, gate, close = systems(srv)
        try:
            return await per_turn(bare, count), await per_turn(gate, count)
        finally:
            await close()

    return asyncio.run(main())


def test_an_async_turn_starts_no_async_generator_beyond_the_sdks_own(server):
    bare, gate = measure(server, async_generators)
    assert gate == bare, f"async generators per turn: fallgate {gate}, bare SDK {bare}"


def test_an_async_turn_adds_a_bounded_number_of_python_calls_to_the_sdks(server):
    bare, gate = measure(server, python_calls)
    assert bare > 1000  # the count saw the SDK's own work (the profile hook was live)
    assert gate - bare <= EXTRA_CALLS, (
        f"python calls per turn: fallgate {gate:.0f}, bare SDK {bare:.0f} "
        f"(+{gate - bare:.0f}, budget +{EXTRA_CALLS})"
    )
    assert gate / bare <= 1.05


async def peak_bytes(call: Call) -> int:
    """The most memory (tracemalloc) one turn has allocated at once above what was live
    before it, summed over the turns (each turn's peak measured on its own)."""
    import tracemalloc

    total = 0
    tracemalloc.start()
    try:
        for _ in range(TURNS):
            before, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            await call()
            _, peak = tracemalloc.get_traced_memory()
            total += peak - before
    finally:
        tracemalloc.stop()
    return total


async def kept_bytes(call: Call) -> int:
    """Memory still allocated after the turns that was not before them (what turns keep)."""
    import gc
    import tracemalloc

    tracemalloc.start()
    try:
        gc.collect()
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(TURNS):
            await call()
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before


def test_an_async_turn_allocates_a_bounded_amount_beyond_the_sdks_own(server):
    """A turn's allocations in the hot path: its peak above the bare SDK's is a few KB (the
    turn's state, its lease, the attempt's bounds), and turns keep nothing."""
    bare, gate = measure(server, peak_bytes)
    assert bare > 10_000  # tracemalloc saw the SDK's own allocations
    assert gate - bare <= EXTRA_PEAK_BYTES, (
        f"peak bytes per turn: fallgate {gate:.0f}, bare SDK {bare:.0f} "
        f"(+{gate - bare:.0f}, budget +{EXTRA_PEAK_BYTES})"
    )
    bare_kept, gate_kept = measure(server, kept_bytes)
    assert gate_kept - bare_kept <= KEPT_BYTES_PER_TURN, (bare_kept, gate_kept)
