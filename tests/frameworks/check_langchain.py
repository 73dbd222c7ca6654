"""LangChain's ``ChatOpenAI`` (langchain-openai) over `fallgate.http_client`
(``http_client=`` / ``http_async_client=``): plain, streamed, async, and a tool call."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

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
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool as as_tool
from langchain_openai import ChatOpenAI

import fallgate

weather = as_tool(get_weather)


def _llm(gate: Gate) -> ChatOpenAI:
    policy = gate.policy()
    return ChatOpenAI(
        model=PRIMARY,
        api_key=PLACEHOLDER_KEY,  # type: ignore[arg-type]
        base_url=PLACEHOLDER_URL,
        http_client=fallgate.http_client(policy),
        http_async_client=fallgate.async_http_client(policy),
    )


def plain(gate: Gate) -> None:
    gate.script(*plain_steps())
    gate.expect(str(_llm(gate).invoke("Weather in Paris?").content), 1)


def streamed(gate: Gate) -> None:
    gate.script(*plain_steps())
    text = "".join(str(chunk.content) for chunk in _llm(gate).stream("Weather in Paris?"))
    gate.expect(text, 1)


def async_streamed(gate: Gate) -> None:
    gate.script(*plain_steps())

    async def main() -> str:
        return "".join([str(c.content) async for c in _llm(gate).astream("Weather in Paris?")])

    gate.expect(asyncio.run(main()), 1)


def tool(gate: Gate) -> None:
    gate.script(*tool_steps())
    llm = _llm(gate).bind_tools([weather])
    messages: list[Any] = [HumanMessage("Weather in Paris?")]
    reply = llm.invoke(messages)
    messages.append(reply)
    for call in reply.tool_calls:
        messages.append(ToolMessage(weather.invoke(call["args"]), tool_call_id=call["id"]))
    gate.expect(str(llm.invoke(messages).content), 2, tool=True)


def example(gate: Gate) -> None:
    gate.run_example("with_langchain.py", *plain_steps())


if __name__ == "__main__":
    sys.exit(
        run_checks(
            "langchain-openai",
            [
                ("plain", plain),
                ("streamed", streamed),
                ("async streamed", async_streamed),
                ("tool call", tool),
                ("examples/frameworks/with_langchain.py", example),
            ],
        )
    )
