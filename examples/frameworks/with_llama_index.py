"""LlamaIndex's OpenAI LLM over fallgate: both of its HTTP clients carry the policy.

pip install fallgate llama-index-llms-openai
python examples/frameworks/with_llama_index.py [policy.toml] ["question"]
"""

import sys

from llama_index.core.llms import ChatMessage
from llama_index.llms.openai import OpenAI

import fallgate

policy = fallgate.Policy.from_toml(sys.argv[1] if len(sys.argv) > 1 else "examples/policy.toml")
question = sys.argv[2] if len(sys.argv) > 2 else "What is the weather in Paris?"

llm = OpenAI(
    model=policy.targets[0].model,  # LlamaIndex knows OpenAI's model names (context size)
    api_key="unused",  # each target's key comes from the policy
    http_client=fallgate.http_client(policy),
    async_http_client=fallgate.async_http_client(policy),
)
print(llm.chat([ChatMessage(role="user", content=question)]).message.content)
