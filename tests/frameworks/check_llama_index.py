"""LlamaIndex's ``OpenAI`` LLM (llama-index-llms-openai) over `fallgate.http_client`
(``http_client=`` / ``async_http_client=``): chat, streamed chat, async, a tool call."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (
    PLACEHOLDER_KEY,
    PLACEHOLDER_URL,
    PRIMARY,
    Gate,
    get_weather,
    plain_steps,
    run_checks,
    tool_steps,
)
from llama_index.core.llms import ChatMessage
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai import OpenAI

import fallgate

MSG = [ChatMessage(role="user", content="Weather in Paris?")]
weather = FunctionTool.from_defaults(fn=get_weather)


def _llm(gate: Gate) -> OpenAI:
    policy = gate.policy()
    return OpenAI(
        model=PRIMARY,
        api_key=PLACEHOLDER_KEY,
        api_base=PLACEHOLDER_URL,
        http_client=fallgate.http_client(policy),
        async_http_client=fallgate.async_http_client(policy),
    )


def plain(gate: Gate) -> None:
    gate.script(*plain_steps())
    gate.expect(str(_llm(gate).chat(MSG).message.content), 1)


def streamed(gate: Gate) -> None:
    gate.script(*plain_steps())
    gate.expect("".join(r.delta or "" for r in _llm(gate).stream_chat(MSG)), 1)


def async_plain(gate: Gate) -> None:
    gate.script(*plain_steps())
    reply = asyncio.run(_llm(gate).achat(MSG))
    gate.expect(str(reply.message.content), 1)


def tool(gate: Gate) -> None:
    gate.script(*tool_steps())
    llm = _llm(gate)
    first = llm.chat_with_tools([weather], chat_history=list(MSG))
    history = [*MSG, first.message]
    for call in llm.get_tool_calls_from_response(first, error_on_no_tool_call=True):
        output = weather.call(**call.tool_kwargs)
        history.append(
            ChatMessage(
                role="tool",
                content=str(output),
                additional_kwargs={"tool_call_id": call.tool_id, "name": call.tool_name},
            )
        )
    gate.expect(str(llm.chat(history).message.content), 2, tool=True)


def example(gate: Gate) -> None:
    gate.run_example("with_llama_index.py", *plain_steps())


if __name__ == "__main__":
    sys.exit(
        run_checks(
            "llama-index-llms-openai",
            [
                ("chat", plain),
                ("streamed chat", streamed),
                ("async chat", async_plain),
                ("tool call", tool),
                ("examples/frameworks/with_llama_index.py", example),
            ],
        )
    )
