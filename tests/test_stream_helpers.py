"""`chat.completions.stream` and `responses.stream` on the wrappers: the SDK's own
helpers (events, final completion, structured output) over a fallgate stream."""

from __future__ import annotations

import asyncio
import json

import pydantic
import pytest
from fallgate.fsm import TurnFailed, instant_waits
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]


class City(pydantic.BaseModel):
    name: str
    people: int


def test_chat_stream_falls_back_before_content_and_accumulates_the_answer(
    fault_server: FaultServer,
) -> None:
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "status", "status": 429}],
                "b": [{"kind": "answer", "text": "from b"}],
            }
        }
    )
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        with gate.chat.completions.stream(messages=MSG) as stream:
            deltas = [e.delta for e in stream if e.type == "content.delta"]
            final = stream.get_final_completion()
    assert "".join(deltas) == "from b"
    assert final.choices[0].message.content == "from b"
    assert fault_server.counts == {"a": 1, "b": 1}


def test_chat_stream_parses_structured_output(fault_server: FaultServer) -> None:
    text = json.dumps({"name": "Lyon", "people": 520000})
    fault_server.script({"models": {"a": [{"kind": "answer", "text": text}]}})
    with Fallgate(chain("a", server=fault_server)) as gate:
        with gate.chat.completions.stream(messages=MSG, response_format=City) as stream:
            final = stream.get_final_completion()
    assert final.choices[0].message.parsed == City(name="Lyon", people=520000)
    sent = fault_server.requests[0].body
    assert sent["stream"] is True and sent["response_format"]["type"] == "json_schema"


def test_a_chat_stream_broken_after_content_raises_turn_failed_with_the_partial(
    fault_server: FaultServer,
) -> None:
    fault_server.script({"models": {"a": [{"kind": "stream", "chunks": 2, "then": "cut"}]}})
    with instant_waits(), Fallgate(chain("a", "b", server=fault_server)) as gate:
        with pytest.raises(TurnFailed) as info, gate.chat.completions.stream(messages=MSG) as s:
            for _ in s:
                pass
    assert info.value.partial == "chunk-1 chunk-2 "


def test_responses_stream_and_its_async_twin(fault_server: FaultServer) -> None:
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "status", "status": 503}] * 3,
                "b": [{"kind": "answer", "text": "from b"}] * 3,
            }
        }
    )
    policy = chain("a", "b", server=fault_server)
    with instant_waits(), Fallgate(policy) as gate:
        with gate.responses.stream(input="hi") as stream:
            assert stream.get_final_response().output_text == "from b"

    async def main() -> tuple[str, str]:
        async with AsyncFallgate(policy) as agate:
            async with agate.responses.stream(input="hi") as rs:
                text = (await rs.get_final_response()).output_text
            async with agate.chat.completions.stream(messages=MSG) as cs:
                chat = (await cs.get_final_completion()).choices[0].message.content or ""
        return text, chat

    with instant_waits():
        assert asyncio.run(main()) == ("from b", "from b")
    assert fault_server.counts["b"] == 3


def test_stream_refuses_a_stream_argument(fault_server: FaultServer) -> None:
    with Fallgate(chain("a", server=fault_server)) as gate:
        with pytest.raises(TypeError, match="always streams"):
            gate.chat.completions.stream(messages=MSG, stream=False)
    assert fault_server.requests == []
