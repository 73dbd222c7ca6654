"""LangChain's ChatOpenAI over fallgate: both of its HTTP clients carry the policy.

pip install fallgate langchain-openai
python examples/frameworks/with_langchain.py [policy.toml] ["question"]
"""

import sys

from langchain_openai import ChatOpenAI

import fallgate

policy = fallgate.Policy.from_toml(sys.argv[1] if len(sys.argv) > 1 else "examples/policy.toml")
question = sys.argv[2] if len(sys.argv) > 2 else "What is the weather in Paris?"

llm = ChatOpenAI(
    model=policy.targets[0].model,
    api_key="unused",  # each target's key comes from the policy
    http_client=fallgate.http_client(policy),
    http_async_client=fallgate.async_http_client(policy),
)
print(llm.invoke(question).content)
