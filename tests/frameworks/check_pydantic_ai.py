"""pydantic-ai over `fallgate.async_http_client` (``OpenAIProvider(http_client=...)``):
its chat model, plain, streamed and with a tool call."""

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
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import fallgate


def _agent(gate: Gate, *, tools: bool = False) -> Agent[None, str]:
    provider = OpenAIProvider(
        base_url=PLACEHOLDER_URL,
        api_key=PLACEHOLDER_KEY,
        http_client=fallgate.async_http_client(gate.policy()),
    )
    model = OpenAIChatModel(PRIMARY, provider=provider)
    return Agent(model, instructions="Answer briefly.", tools=[get_weather] if tools else [])


def plain(gate: Gate) -> None:
    gate.script(*plain_steps())
    result = asyncio.run(_agent(gate).run("Weather in Paris?"))
    gate.expect(result.output, 1)


def streamed(gate: Gate) -> None:
    gate.script(*plain_steps())

    async def main() -> str:
        async with _agent(gate).run_stream("Weather in Paris?") as result:
            pieces = [t async for t in result.stream_text(delta=True)]
        return "".join(pieces)

    gate.expect(asyncio.run(main()), 1)


def tool(gate: Gate) -> None:
    gate.script(*tool_steps())
    result = asyncio.run(_agent(gate, tools=True).run("Weather in Paris?"))
    gate.expect(result.output, 2, tool=True)


def example(gate: Gate) -> None:
    gate.run_example("with_pydantic_ai.py", *plain_steps())


if __name__ == "__main__":
    sys.exit(
        run_checks(
            "pydantic-ai",
            [
                ("plain", plain),
                ("streamed", streamed),
                ("tool call", tool),
                ("examples/frameworks/with_pydantic_ai.py", example),
            ],
        )
    )
