"""Shared by the fault server API tests: clients, scripts, raw HTTP and SSE parsing."""

from __future__ import annotations

import http.client
import json
from typing import Any

import openai
from fallgate.providers.testing.fault_server import FaultServer
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageFunctionToolCall

KEY = "sk-fault-api-test-key-0123456789"
MESSAGES: list[Any] = [{"role": "user", "content": "what is the weather"}]
WEATHER = {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
RESPONSE_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def client(srv: FaultServer, timeout: float = 5.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0, timeout=timeout)


def one(model: str, **step: Any) -> dict[str, Any]:
    return {"models": {model: [step]}}


def call(c: openai.OpenAI, endpoint: str, model: str = "m") -> Any:
    """One SDK call on `endpoint`, non-streaming."""
    if endpoint == "chat":
        return c.chat.completions.create(model=model, messages=MESSAGES)
    if endpoint == "responses":
        return c.responses.create(model=model, input="what is the weather")
    return c.embeddings.create(model=model, input=["what is", "the weather"])


def function_calls(message: ChatCompletionMessage) -> list[ChatCompletionMessageFunctionToolCall]:
    calls = message.tool_calls or []
    assert all(isinstance(t, ChatCompletionMessageFunctionToolCall) for t in calls)
    return [t for t in calls if isinstance(t, ChatCompletionMessageFunctionToolCall)]


def raw_post(srv: FaultServer, path: str, body: dict[str, Any]) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        conn.request("POST", path, json.dumps(body), {"Authorization": f"Bearer {KEY}"})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def sse(text: str) -> list[tuple[str | None, Any]]:
    """The (event name, data) of each SSE event in a stream body."""
    out = []
    for block in filter(None, text.split("\n\n")):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        data = fields["data"]
        out.append((fields.get("event"), data if data == "[DONE]" else json.loads(data)))
    return out
