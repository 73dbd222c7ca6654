"""pydantic-ai over fallgate: the provider's HTTP client carries the policy.

pip install fallgate 'pydantic-ai-slim[openai]'
python examples/frameworks/with_pydantic_ai.py [policy.toml] ["question"]
"""

import sys

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import fallgate

policy = fallgate.Policy.from_toml(sys.argv[1] if len(sys.argv) > 1 else "examples/policy.toml")
question = sys.argv[2] if len(sys.argv) > 2 else "What is the weather in Paris?"

# api_key is a placeholder: each target's key comes from the policy.
provider = OpenAIProvider(api_key="unused", http_client=fallgate.async_http_client(policy))
agent = Agent(OpenAIChatModel(policy.targets[0].model, provider=provider))
print(agent.run_sync(question).output)
