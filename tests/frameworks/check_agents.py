"""The OpenAI Agents SDK (openai-agents) over `fallgate.async_http_client`: its Chat
Completions model and its Responses model, plain, streamed and with a tool call."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import openai
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
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

import fallgate

set_tracing_disabled(True)
weather = function_tool(get_weather)
Model = Callable[[openai.AsyncOpenAI], Any]
MODELS: dict[str, Model] = {
    "chat completions": lambda c: OpenAIChatCompletionsModel(model=PRIMARY, openai_client=c),
    "responses": lambda c: OpenAIResponsesModel(model=PRIMARY, openai_client=c),
}


def _agent(gate: Gate, model: Model, tools: list[Any]) -> tuple[Agent[Any], openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        api_key=PLACEHOLDER_KEY,
        base_url=PLACEHOLDER_URL,
        http_client=fallgate.async_http_client(gate.policy()),
    )
    agent = Agent(name="weather", instructions="Answer briefly.", model=model(client), tools=tools)
    return agent, client


def plain(model: Model) -> Callable[[Gate], None]:
    def check(gate: Gate) -> None:
        gate.script(*plain_steps())

        async def main() -> str:
            agent, client = _agent(gate, model, [])
            result = await Runner.run(agent, "Weather in Paris?")
            await client.close()
            return str(result.final_output)

        gate.expect(asyncio.run(main()), 1)

    return check


def streamed(model: Model) -> Callable[[Gate], None]:
    def check(gate: Gate) -> None:
        gate.script(*plain_steps())

        async def main() -> str:
            agent, client = _agent(gate, model, [])
            result = Runner.run_streamed(agent, "Weather in Paris?")
            events = [e async for e in result.stream_events()]
            await client.close()
            assert events, "no stream events"
            return str(result.final_output)

        gate.expect(asyncio.run(main()), 1)

    return check


def tool(model: Model) -> Callable[[Gate], None]:
    def check(gate: Gate) -> None:
        gate.script(*tool_steps())

        async def main() -> str:
            agent, client = _agent(gate, model, [weather])
            result = await Runner.run(agent, "Weather in Paris?")
            await client.close()
            return str(result.final_output)

        gate.expect(asyncio.run(main()), 2, tool=True)

    return check


def example(gate: Gate) -> None:
    gate.run_example("with_openai_agents.py", *plain_steps())


if __name__ == "__main__":
    checks = [
        (f"{name}, {how}", make(model))
        for name, model in MODELS.items()
        for how, make in (("plain", plain), ("streamed", streamed), ("tool call", tool))
    ]
    checks.append(("examples/frameworks/with_openai_agents.py", example))
    sys.exit(run_checks("openai-agents", checks))
