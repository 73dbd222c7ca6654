"""instructor (structured output) over an ``openai.OpenAI(http_client=fallgate.http_client
(policy))``: a pydantic model filled from the fallback's tool call, plain, as partial
objects while streaming, and on the async client."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import instructor
import openai
import pydantic
from harness import ANSWER, PLACEHOLDER_KEY, PLACEHOLDER_URL, PRIMARY, Gate, run_checks

import fallgate

MSG: Any = [{"role": "user", "content": "Weather in Paris?"}]


class Weather(pydantic.BaseModel):
    city: str
    forecast: str


#: The fallback answers instructor's tool call (its TOOLS mode) with the model's fields.
FILLED = {
    "kind": "tool_calls",
    "tool_calls": [{"name": "Weather", "arguments": {"city": "Paris", "forecast": ANSWER}}],
}


def _client(gate: Gate) -> instructor.Instructor:
    sdk = openai.OpenAI(
        api_key=PLACEHOLDER_KEY,
        base_url=PLACEHOLDER_URL,
        http_client=fallgate.http_client(gate.policy()),
    )
    return instructor.from_openai(sdk)


def plain(gate: Gate) -> None:
    gate.script(FILLED)
    got = _client(gate).chat.completions.create(model=PRIMARY, response_model=Weather, messages=MSG)
    assert got.city == "Paris", got
    gate.expect(got.forecast, 1)


def streamed(gate: Gate) -> None:
    gate.script(FILLED)
    partials = list(
        _client(gate).chat.completions.create_partial(
            model=PRIMARY, response_model=Weather, messages=MSG
        )
    )
    assert len(partials) > 1, f"{len(partials)} partial objects: not streamed"
    gate.expect(partials[-1].forecast or "", 1)


def async_plain(gate: Gate) -> None:
    gate.script(FILLED)

    async def main() -> Weather:
        sdk = openai.AsyncOpenAI(
            api_key=PLACEHOLDER_KEY,
            base_url=PLACEHOLDER_URL,
            http_client=fallgate.async_http_client(gate.policy()),
        )
        client = instructor.from_openai(sdk)
        got = await client.chat.completions.create(
            model=PRIMARY, response_model=Weather, messages=MSG
        )
        await sdk.close()
        return got

    gate.expect(asyncio.run(main()).forecast, 1)


def example(gate: Gate) -> None:
    gate.run_example("with_instructor.py", FILLED)


if __name__ == "__main__":
    sys.exit(
        run_checks(
            "instructor",
            [
                ("structured output (a tool call)", plain),
                ("streamed partial objects", streamed),
                ("async", async_plain),
                ("examples/frameworks/with_instructor.py", example),
            ],
        )
    )
