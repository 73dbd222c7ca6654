"""Streaming through the engine: retried or fallen back before the first chunk,
committed after it — a broken stream fails with the partial text, never replays."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from fallgate.fsm import TurnFailed, instant_waits
from fallgate.fsm.trace import TraceEvent
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.testing.fault_server import FaultServer
from openai.types.chat import ChatCompletionChunk

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


def text(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_healthy_stream_yields_the_sdks_chunks(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "stream", "chunks": 4, "then": "done"}]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        with gate.chat.completions.create(messages=MSG, stream=True) as stream:
            chunks = list(stream)
        assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
        assert text(chunks) == "chunk-1 chunk-2 chunk-3 chunk-4 "
        assert stream.result is not None and stream.result.value == text(chunks)
        assert stream.state == "done"
    [req] = fault_server.requests
    assert req.stream and req.model == "a"


@pytest.mark.parametrize(
    "failure",
    [
        {"kind": "stream", "chunks": 0, "then": "error"},
        {"kind": "stream", "chunks": 0, "then": "cut"},
        {"kind": "stream", "chunks": [""], "then": "cut"},  # only a role chunk, no text
        {"kind": "status", "status": 503},
        {"kind": "drop"},
    ],
    ids=["error event", "cut", "role chunk then cut", "503", "drop"],
)
def test_a_failure_before_the_first_chunk_falls_back(
    fault_server: FaultServer, failure: dict[str, Any]
) -> None:
    fault_server.script(
        {"models": {"a": [failure] * 5, "b": [{"kind": "answer", "text": "from b"}]}}
    )
    policy = chain("a", "b", server=fault_server, max_attempts=1, recover_transport=False)
    with Fallgate(policy) as gate:
        stream = gate.chat.completions.create(messages=MSG, stream=True)
        chunks = list(stream)
    assert text(chunks) == "from b"
    assert fault_server.counts == {"a": 1, "b": 1}
    assert stream.result is not None and stream.result.model == "b"


def test_a_failure_before_the_first_chunk_is_retried_on_the_same_target(
    fault_server: FaultServer,
) -> None:
    fault_server.script({"models": {"a": [{"kind": "stream", "chunks": 0, "then": "error"}]}})
    with Fallgate(chain("a", server=fault_server, max_attempts=2)) as gate:
        chunks = list(gate.chat.completions.create(messages=MSG, stream=True))
    assert text(chunks) == "ok"
    assert fault_server.counts == {"a": 2}


def test_a_failure_before_the_first_chunk_falls_back_at_once_when_a_fallback_is_free(
    fault_server: FaultServer,
) -> None:
    fault_server.script({"models": {"a": [{"kind": "stream", "chunks": 0, "then": "error"}]}})
    with Fallgate(chain("a", "b", server=fault_server, max_attempts=2)) as gate:
        chunks = list(gate.chat.completions.create(messages=MSG, stream=True))
    assert text(chunks) == "ok"
    assert fault_server.counts == {"a": 1, "b": 1}


@pytest.mark.parametrize("then", ["error", "cut"])
def test_a_stream_broken_after_three_chunks_is_committed(
    fault_server: FaultServer, then: str
) -> None:
    fault_server.script({"models": {"a": [{"kind": "stream", "chunks": 3, "then": then}]}})
    got: list[ChatCompletionChunk] = []
    with Fallgate(chain("a", "b", server=fault_server, max_attempts=3)) as gate:
        with pytest.raises(TurnFailed) as info:
            for chunk in gate.chat.completions.create(messages=MSG, stream=True):
                got.append(chunk)
    failed = info.value
    assert text(got) == "chunk-1 chunk-2 chunk-3 "
    assert failed.partial == text(got)  # exactly what was delivered: no duplicate text
    assert failed.state == "failed"
    assert "stream_interrupted" in failed.reasons["primary"]
    assert fault_server.counts == {"a": 1}  # no retry, no fallback, no replay
    assert [e.event for e in failed.trace] == ["start", "stream_interrupted"]


def test_a_broken_stream_is_resent_with_the_delivered_text_as_prefix(
    fault_server: FaultServer,
) -> None:
    fault_server.script({"models": {"a": [{"kind": "stream", "chunks": 2, "then": "cut"}]}})
    policy = chain({"model": "a", "assistant_prefix": True}, server=fault_server)
    with Fallgate(policy) as gate:
        chunks = list(gate.chat.completions.create(messages=MSG, stream=True))
    assert text(chunks) == "chunk-1 chunk-2 ok"
    second = fault_server.requests[1].body["messages"]
    assert second[-1] == {"role": "assistant", "content": "chunk-1 chunk-2 "}


def test_closing_a_stream_early_aborts_the_turn(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "stream", "chunks": 50, "then": "done"}]}})
    seen: list[TraceEvent] = []
    with Fallgate(chain("a", server=fault_server), on_transition=seen.append) as gate:
        with gate.chat.completions.create(messages=MSG, stream=True) as stream:
            next(stream)
            next(stream)
        assert stream.state == "aborted"
        assert gate.clients.stats()["retired_in_use"] == 0
    assert seen[-1].dest == "aborted"


def test_a_turn_that_fails_before_any_chunk_raises_from_create(fault_server: FaultServer) -> None:
    fault_server.script({"default": {"kind": "status", "status": 400}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        with pytest.raises(TurnFailed) as info:
            gate.chat.completions.create(messages=MSG, stream=True)
    assert info.value.partial is None
    assert "bad_request" in str(info.value)


def test_async_streams_fall_back_before_and_commit_after_the_first_chunk(
    fault_server: FaultServer,
) -> None:
    fault_server.script(
        {
            "models": {
                "a": [
                    {"kind": "stream", "chunks": 0, "then": "cut"},
                    {"kind": "stream", "chunks": 3, "then": "cut"},
                ],
            }
        }
    )
    policy = chain("a", "b", server=fault_server, max_attempts=1, recover_transport=False)

    async def main() -> tuple[str, list[str], TurnFailed]:
        async with AsyncFallgate(policy) as gate:
            first = await gate.chat.completions.create(messages=MSG, stream=True)
            answered = text([c async for c in first])
            got: list[str] = []
            with pytest.raises(TurnFailed) as info:
                async with await gate.chat.completions.create(messages=MSG, stream=True) as s:
                    async for c in s:
                        got.append(c.choices[0].delta.content or "")
            return answered, got, info.value

    answered, got, failed = asyncio.run(main())
    assert answered == "ok"  # from b, after a's stream was cut before its first chunk
    assert "".join(got) == "chunk-1 chunk-2 chunk-3 " == failed.partial
    assert fault_server.counts == {"a": 2, "b": 1}


def test_async_stream_cancellation_aborts(fault_server: FaultServer) -> None:
    step = {"kind": "stream", "chunks": 2, "then": "hang", "seconds": 5}
    fault_server.script({"models": {"a": [step]}})
    seen: list[TraceEvent] = []
    policy = chain("a", server=fault_server)

    async def consume(gate: AsyncFallgate, got: list[str]) -> None:
        async for c in await gate.chat.completions.create(messages=MSG, stream=True):
            got.append(c.choices[0].delta.content or "")

    async def main() -> list[str]:
        got: list[str] = []
        async with AsyncFallgate(policy, on_transition=seen.append) as gate:
            task = asyncio.create_task(consume(gate, got))
            while len(got) < 2:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert gate.clients.stats()["retired_in_use"] == 0
        return got

    assert asyncio.run(main()) == ["chunk-1 ", "chunk-2 "]
    assert seen[-1].dest == "aborted"
