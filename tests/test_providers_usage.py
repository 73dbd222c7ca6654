"""Token usage across a turn: per attempt and in total, on results, streams and failures.

The fault server counts words: a prompt of "hi" is 1 token, "hello there" 2.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from fallgate.fsm import TurnFailed, instant_waits
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.openai.usage import AttemptUsage, GateResult, Usage, usage_of
from fallgate.providers.testing.fault_server import FaultServer
from openai.types.chat import ChatCompletion

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]
HELLO = {"kind": "answer", "text": "hello there"}


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


def test_a_turn_reports_each_attempts_usage_and_the_total(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": 429}], "b": [HELLO]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        result = gate.run(messages=MSG)
    assert isinstance(result, GateResult) and isinstance(result.value, ChatCompletion)
    assert result.attempts_usage == (
        AttemptUsage("primary", "a", None),  # a 429 is not billed
        AttemptUsage("fallback_1", "b", Usage(1, 2, 3)),
    )
    assert result.usage == Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3)
    assert result.value.usage is not None and result.value.usage.total_tokens == 3  # unchanged


def test_a_billed_failure_counts_in_the_total(fault_server: FaultServer) -> None:
    filtered = {"kind": "answer", "text": "x y z", "finish_reason": "content_filter"}
    fault_server.script({"models": {"a": [filtered], "b": [HELLO]}})
    policy = chain("a", "b", server=fault_server, rules={"content_filtered": {"fall_back": True}})
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
    assert [u for _, _, u in result.attempts_usage] == [Usage(1, 3, 4), Usage(1, 2, 3)]
    assert result.usage == Usage(2, 5, 7)


def test_a_failed_turn_carries_its_usage(fault_server: FaultServer) -> None:
    class Reply(pydantic.BaseModel):
        answer: str

    cut = {"kind": "answer", "text": '{"answer": "tr', "finish_reason": "length"}
    fault_server.script({"models": {"a": [cut]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        with pytest.raises(TurnFailed) as info:  # the SDK's LengthFinishReasonError: bad_request
            gate.chat.completions.parse(messages=MSG, response_format=Reply)
    assert "reply cut at the output token limit" in str(info.value)
    e: Any = info.value
    assert e.attempts_usage == (AttemptUsage("primary", "a", Usage(1, 2, 3)),)
    assert e.usage == Usage(1, 2, 3)
    fault_server.script({"default": {"kind": "status", "status": 503}})
    with Fallgate(chain("a", "b", server=fault_server, max_attempts=1)) as gate:
        with pytest.raises(TurnFailed) as info:
            gate.embeddings.create(input="x")
    e = info.value
    assert [(t, u) for t, _, u in e.attempts_usage] == [("primary", None), ("fallback_1", None)]
    assert e.usage is None


def test_responses_and_embeddings_usage(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": 503}]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        reply = gate.responses.run(input="three words here")
        vectors = gate.embeddings.run(input=["one two", "three"])
    assert reply.usage == Usage(3, 1, 4)  # "ok" is one word
    assert reply.usage is not None and (reply.usage.input_tokens, reply.usage.output_tokens) == (
        3,
        1,
    )
    assert [a.target for a in reply.attempts_usage] == ["primary", "fallback_1"]
    assert vectors.usage == Usage(prompt_tokens=3, completion_tokens=0, total_tokens=3)


def test_a_chat_stream_reports_usage_across_a_fallback(fault_server: FaultServer) -> None:
    early = {"kind": "stream", "chunks": 0, "then": "error"}
    fault_server.script({"models": {"a": [early], "b": [HELLO]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        with gate.chat.completions.create(
            messages=MSG, stream=True, stream_options={"include_usage": True}
        ) as stream:
            chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].choices == []  # the SDK's own chunk
    assert stream.attempts_usage == (
        AttemptUsage("primary", "a", None),
        AttemptUsage("fallback_1", "b", Usage(1, 2, 3)),
    )
    assert stream.usage == Usage(1, 2, 3)
    assert stream.result is not None and stream.result.usage == Usage(1, 2, 3)


def test_a_broken_stream_says_none_when_the_provider_sent_no_usage(
    fault_server: FaultServer,
) -> None:
    fault_server.script({"models": {"a": [{"kind": "stream", "chunks": 2, "then": "cut"}]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        stream = gate.chat.completions.create(
            messages=MSG, stream=True, stream_options={"include_usage": True}
        )
        with pytest.raises(TurnFailed) as info:
            list(stream)
    e: Any = info.value
    assert e.partial == "chunk-1 chunk-2 "
    assert stream.attempts_usage == e.attempts_usage == (AttemptUsage("primary", "a", None),)
    assert stream.usage is None and e.usage is None


def test_a_broken_stream_counts_the_usage_the_provider_sent(fault_server: FaultServer) -> None:
    # Some providers put running usage in every chunk: the last one sent is what is billed.
    def chunk(text: str, tokens: int) -> str:
        body = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "a",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": 1 + tokens},
        }
        return f"data: {json.dumps(body)}\n\n"

    sse = chunk("Once ", 1) + chunk("upon", 2)  # no finish_reason, no [DONE]: broken
    step = {"kind": "status", "status": 200, "body": sse, "content_type": "text/event-stream"}
    fault_server.script({"models": {"a": [step]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        stream = gate.chat.completions.create(messages=MSG, stream=True)
        with pytest.raises(TurnFailed) as info:
            list(stream)
    e: Any = info.value
    assert e.partial == "Once upon"
    assert e.attempts_usage == (AttemptUsage("primary", "a", Usage(1, 2, 3)),)
    assert stream.usage == e.usage == Usage(1, 2, 3)
    assert fault_server.counts == {"a": 1}


def test_a_responses_stream_reports_the_completed_events_usage(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "stream", "chunks": 0, "then": "cut"}] * 4}})

    async def main() -> Any:
        async with AsyncFallgate(chain("a", "b", server=fault_server)) as gate:
            stream = await gate.responses.create(input="two words", stream=True)
            async for _ in stream:
                pass
            return stream

    stream = asyncio.run(main())
    assert stream.attempts_usage[-1] == AttemptUsage("fallback_1", "b", Usage(2, 1, 3))
    assert {a.usage for a in stream.attempts_usage[:-1]} == {None}
    assert stream.usage == Usage(2, 1, 3)


def test_async_run_reports_usage(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": 429}], "b": [HELLO]}})

    async def main() -> GateResult:
        async with AsyncFallgate(chain("a", "b", server=fault_server)) as gate:
            return await gate.arun(messages=MSG)

    result = asyncio.run(main())
    assert [u for _, _, u in result.attempts_usage] == [None, Usage(1, 2, 3)]
    assert result.usage == Usage(1, 2, 3)


def test_usage_of_reads_every_shape() -> None:
    class Obj:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    assert usage_of(None) is None and usage_of(Obj(usage=None)) is None
    assert usage_of(Obj(usage={"input_tokens": 2, "output_tokens": 3})) == Usage(2, 3, 5)
    assert usage_of(Obj(response=Obj(usage=Obj(prompt_tokens=4, total_tokens=4)))) == Usage(4, 0, 4)
    assert usage_of(Obj(usage=Obj(prompt_tokens="x"))) is None
    assert Usage(1, 2, 3) + Usage(1, 1, 2) == Usage(2, 3, 5)
