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
from fallgate.providers.fault_server import FaultServer

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]
TURNS = 20
#: Python calls (and coroutine resumptions) a turn may add to the bare SDK's ~3,600:
#: the engine, the adapter and the attempt bounds, ~130 here (150-160 while the asyncio
#: host loop was an async generator, a lease a generator-based manager, and a call
#: built a GateResult nobody asked for).
EXTRA_CALLS = 145


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
    n = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal n
        if event == "call":
            n += 1

    sys.setprofile(profile)
    try:
        for _ in range(TURNS):
            await call()
    finally:
        sys.setprofile(None)
    return n


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
