"""Many concurrent async turns through one AsyncFallgate, with failing targets.

Every turn must end correctly, rebuilds by one turn must not break another
turn's in-flight request, and nothing may be left open afterwards (ResourceWarning
is an error in this suite's configuration).
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections import Counter
from collections.abc import Iterator

import pytest
from fallgate.fsm import TurnFailed, TurnResult, instant_waits
from fallgate.providers import AsyncFallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]
TURNS = 200


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


def open_sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to count sockets")
def test_200_concurrent_turns_all_end_correctly_and_leave_nothing_open() -> None:
    gc.collect()
    before = open_sockets()
    # a: every request drops (transport: retry budget 1, one rebuild, then fall back);
    # b: alternately answers and rejects with a 400 (bad request: the turn fails).
    b_steps = [
        {"kind": "answer", "text": "b-ok"} if i % 2 == 0 else {"kind": "status", "status": 400}
        for i in range(TURNS)
    ]
    script = {"models": {"a": [{"kind": "drop"}] * (2 * TURNS), "b": b_steps}}
    with FaultServer(script) as srv:
        # no retry budget: this is about concurrency, and every turn is to use its recovery
        policy = chain(
            "a",
            "b",
            server=srv,
            max_attempts=1,
            attempt_timeout=20,
            retry_budget={"enabled": False},
            breaker={"allowed_failures": 1000},
        )

        async def main() -> tuple[list[TurnResult | BaseException], dict[str, object]]:
            async with AsyncFallgate(policy) as gate:
                results = await asyncio.gather(
                    *(gate.arun(messages=MSG) for _ in range(TURNS)), return_exceptions=True
                )
                stats = gate.clients.stats()
            assert gate.clients.open_clients == 0
            return results, stats

        results, stats = asyncio.run(main())
        counts = srv.counts
    gc.collect()

    done = [r for r in results if isinstance(r, TurnResult)]
    failed = [r for r in results if isinstance(r, TurnFailed)]
    assert len(done) + len(failed) == TURNS, [
        r for r in results if not isinstance(r, TurnResult | TurnFailed)
    ]
    assert len(done) == len(failed) == TURNS // 2
    assert {r.model for r in done} == {"b"}
    assert all(r.value.choices[0].message.content == "b-ok" for r in done)
    assert Counter(e.dest for r in done for e in r.trace) == Counter(
        {
            "primary": 2 * len(done),
            "primary_recovering": len(done),
            "fallback_1": len(done),
            "done": len(done),
        }
    )
    for f in failed:
        assert f.state == "failed"
        assert "bad_request (HTTP 400)" in f.reasons["fallback_1"]
        assert "transport" in f.reasons["primary"]
    assert counts == {"a": 2 * TURNS, "b": TURNS}
    assert stats["retired_in_use"] == 0
    assert open_sockets() == before
