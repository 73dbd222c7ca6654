"""The OpenAI Agents SDK over fallgate: every model call is one turn of the policy.

pip install fallgate openai-agents
python examples/frameworks/with_openai_agents.py [policy.toml] ["question"]
"""

import asyncio
import sys

import openai
from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

import fallgate

policy = fallgate.Policy.from_toml(sys.argv[1] if len(sys.argv) > 1 else "examples/policy.toml")
question = sys.argv[2] if len(sys.argv) > 2 else "What is the weather in Paris?"
set_tracing_disabled(True)  # or keep the SDK's tracing: fallgate does not mind


async def main() -> None:
    # api_key / base_url are placeholders: each target's come from the policy.
    client = openai.AsyncOpenAI(api_key="unused", http_client=fallgate.async_http_client(policy))
    model = OpenAIChatCompletionsModel(model=policy.targets[0].model, openai_client=client)
    result = await Runner.run(Agent(name="assistant", model=model), question)
    print(result.final_output)


asyncio.run(main())
