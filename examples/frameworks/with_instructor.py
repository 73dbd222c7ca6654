"""instructor over fallgate: structured output from whichever target answers.

pip install fallgate instructor
python examples/frameworks/with_instructor.py [policy.toml] ["question"]
"""

import sys

import instructor
import openai
import pydantic

import fallgate

policy = fallgate.Policy.from_toml(sys.argv[1] if len(sys.argv) > 1 else "examples/policy.toml")
question = sys.argv[2] if len(sys.argv) > 2 else "What is the weather in Paris?"


class Weather(pydantic.BaseModel):
    city: str
    forecast: str


client = instructor.from_openai(
    openai.OpenAI(api_key="unused", http_client=fallgate.http_client(policy))
)
messages = [{"role": "user", "content": question}]
model = policy.targets[0].model
print(client.chat.completions.create(model=model, response_model=Weather, messages=messages))
