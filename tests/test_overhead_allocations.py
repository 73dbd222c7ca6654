"""The work fallgate's own code does in a happy `AsyncFallgate` turn, counted (never
timed): the Python calls made in fallgate's modules (the engine, the host loop, the
adapter, the attempt bounds), and the objects they allocate that the cyclic GC tracks
(closures, dicts, lists, coroutines, instances: what makes it collect more often).

`tests/test_adapter_cost.py` compares a whole turn with the bare SDK's; here only
fallgate's frames are counted, so the counts do not move with the SDK's version, and
the bounds are tight: work added to the hot path (a check per turn that the client
could make once, an object nobody reads) fails them. The turns go to the fault server
on loopback (real SDK, real HTTP, keep-alive warm); the fewest of several turns is
taken (a busy machine only adds event-loop rounds).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType
from typing import Any

import pytest
from fallgate.providers import AsyncFallgate
from fallgate.providers.testing.fault_server import FaultServer

import fallgate

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]
TURNS = 15
#: Where fallgate's code lives (a checkout: fsm/ and providers/ beside fallgate/).
_ROOTS = tuple(
    os.path.realpath(os.path.join(os.path.dirname(fallgate.__file__), *up, name)) + os.sep
    for up in ((), ("..",))
    for name in ("fsm", "providers")
)
#: The fault server's own code runs in its threads (not profiled), but keep it out anyway.
_TESTING = os.sep + os.path.join("providers", "testing") + os.sep

#: Python calls in fallgate's modules per happy non-streaming turn: 140 measured (150
#: while the drivers checked the wrappers' keywords on every call, the classifier was
#: built per turn instead of per failure, and a create()'s reply usage was read for
#: nobody); coroutine resumptions count as calls.
CHAT_CALLS = 160
#: The same for a happy streaming turn read to its end (measured: 323).
STREAM_CALLS = 360


def _ours(filename: str) -> bool:
    path = os.path.realpath(filename)
    return path.startswith(_ROOTS) and _TESTING not in path


@pytest.fixture(scope="module")
def server() -> Iterator[FaultServer]:
    with FaultServer({"default": {"kind": "answer", "text": "ok"}}) as srv:
        yield srv


Call = Callable[[], Awaitable[Any]]


def calls_in_fallgate(turn: Call) -> Callable[[], Awaitable[int]]:
    """The fewest Python calls in fallgate's modules over TURNS turns."""

    async def count() -> int:
        fewest = None
        cache: dict[str, bool] = {}
        n = 0

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            nonlocal n
            if event == "call":
                name = frame.f_code.co_filename
                ours = cache.get(name)
                if ours is None:
                    ours = cache[name] = _ours(name)
                n += ours

        for _ in range(TURNS):
            n = 0
            sys.setprofile(profile)
            try:
                await turn()
            finally:
                sys.setprofile(None)
            fewest = n if fewest is None else min(fewest, n)
        assert fewest is not None
        return fewest

    return count


def measure(
    srv: FaultServer, make: Callable[[Call], Callable[[], Awaitable[int]]], *, stream: bool = False
) -> int:
    async def main() -> int:
        gate = AsyncFallgate(chain("m0", "m1", server=srv))

        async def chat() -> Any:
            return await gate.chat.completions.create(model="m0", messages=MSG)

        async def streamed() -> Any:
            s = await gate.chat.completions.create(model="m0", messages=MSG, stream=True)
            async for _ in s:
                pass

        turn = streamed if stream else chat
        try:
            for _ in range(3):  # warm: lazy imports, the first connection
                await turn()
            return await make(turn)()
        finally:
            await gate.aclose()

    return asyncio.run(main())


def test_a_happy_turn_makes_a_bounded_number_of_calls_in_fallgate(server):
    n = measure(server, calls_in_fallgate)
    assert n > 50  # the count saw fallgate's frames (the hook was live, the paths matched)
    assert n <= CHAT_CALLS, f"fallgate's Python calls per happy turn: {n} (budget {CHAT_CALLS})"


def test_a_happy_streaming_turn_makes_a_bounded_number_of_calls_in_fallgate(server):
    n = measure(server, calls_in_fallgate, stream=True)
    assert n > 50
    assert n <= STREAM_CALLS, (
        f"fallgate's Python calls per happy streaming turn: {n} (budget {STREAM_CALLS})"
    )
