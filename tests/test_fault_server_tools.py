"""Tool calls and error-stream shapes of the fault server, through the real `openai` SDK.

A ``tool_calls`` step on chat completions (plain, streamed in the real chunked
shape, accumulated by the SDK's stream helper) and on responses
(``function_call`` items); both error-stream shapes (OpenAI's, Anthropic's)
raising in the SDK; script errors naming the bad field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fallgate.providers.testing.fault_server import FaultServer, ScriptError, parse_script
from fault_api_helpers import (
    MESSAGES,
    TOOLS,
    WEATHER,
    client,
    function_calls,
    one,
    raw_post,
    sse,
)


@pytest.fixture
def srv() -> Iterator[FaultServer]:
    with FaultServer() as server:
        yield server
        assert server.errors == [], "the server itself must never fail"


# --------------------------------------------------------------------------- tool calls


def test_a_tool_call_step_answers_a_chat_completion_with_tool_calls(srv: FaultServer) -> None:
    other = {"name": "get_time", "arguments": {"tz": "CET"}, "id": "call_given"}
    srv.script(one("m", kind="tool_calls", tool_calls=[WEATHER, other]))
    with client(srv) as c:
        reply = c.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS)
    [choice] = reply.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = function_calls(choice.message)
    assert [(t.type, t.function.name) for t in calls] == [
        ("function", "get_weather"),
        ("function", "get_time"),
    ]
    assert calls[0].id.startswith("call_") and calls[1].id == "call_given"
    assert json.loads(calls[0].function.arguments) == WEATHER["arguments"]
    assert json.loads(calls[1].function.arguments) == {"tz": "CET"}


def test_a_tool_call_can_come_with_text(srv: FaultServer) -> None:
    srv.script(one("m", kind="tool_calls", text="let me look", tool_calls=[WEATHER]))
    with client(srv) as c:
        message = c.chat.completions.create(model="m", messages=MESSAGES).choices[0].message
    assert message.content == "let me look" and len(function_calls(message)) == 1


def test_streamed_tool_calls_come_in_the_real_chunked_shape(srv: FaultServer) -> None:
    second = {"name": "get_time", "arguments": {"tz": "CET"}}
    srv.script(one("m", kind="tool_calls", tool_calls=[WEATHER, second], chunks=4))
    with client(srv) as c:
        chunks = list(c.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    deltas = [ch.choices[0].delta for ch in chunks]
    assert deltas[0].role == "assistant"
    pieces = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert [p.index for p in pieces] == [0] * 5 + [1] * 5
    opener = pieces[0]
    assert opener.id and opener.type == "function" and opener.function is not None
    assert (opener.function.name, opener.function.arguments) == ("get_weather", "")
    rest = [p.function for p in pieces[1:5] if p.id is None and p.type is None]
    assert len(rest) == 4 and all(f and f.name is None and f.arguments for f in rest)
    args = "".join(f.arguments or "" for f in rest if f)
    assert json.loads(args) == WEATHER["arguments"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_sdk_chat_stream_helper_accumulates_the_tool_call_arguments(srv: FaultServer) -> None:
    srv.script(one("m", kind="tool_calls", tool_calls=[WEATHER], interval=0.01))
    with client(srv) as c, c.chat.completions.stream(model="m", messages=MESSAGES) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    [tool_call] = function_calls(final.choices[0].message)
    assert tool_call.function.name == "get_weather"
    assert json.loads(tool_call.function.arguments) == WEATHER["arguments"]
    assert final.choices[0].finish_reason == "tool_calls"


def test_a_tool_call_step_answers_a_response_with_function_call_items(srv: FaultServer) -> None:
    srv.script(one("m", kind="tool_calls", tool_calls=[WEATHER]))
    with client(srv) as c:
        reply = c.responses.create(model="m", input="weather?")
    [item] = reply.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert item.call_id.startswith("call_") and item.status == "completed"
    assert json.loads(item.arguments) == WEATHER["arguments"]


def test_the_sdk_response_stream_helper_accumulates_function_call_arguments(
    srv: FaultServer,
) -> None:
    srv.script(one("m", kind="tool_calls", text="checking", tool_calls=[WEATHER], chunks=5))
    with client(srv) as c, c.responses.stream(model="m", input="weather?") as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert len(deltas) == 5
    message, item = final.output
    assert message.type == "message" and final.output_text == "checking"
    assert item.type == "function_call" and item.name == "get_weather"
    assert json.loads(item.arguments) == WEATHER["arguments"] == json.loads("".join(deltas))


@pytest.mark.parametrize(
    ("step", "where"),
    [
        ({"kind": "tool_calls"}, ".tool_calls: missing"),
        ({"kind": "tool_calls", "tool_calls": []}, ".tool_calls: expected a non-empty list"),
        ({"kind": "tool_calls", "tool_calls": [{"arguments": {}}]}, ".tool_calls[0].name: missing"),
        (
            {"kind": "tool_calls", "tool_calls": [{"name": "f", "arguments": 3}]},
            ".tool_calls[0].arguments:",
        ),
        (
            {"kind": "tool_calls", "tool_calls": [{"name": "f", "x": 1}]},
            ".tool_calls[0].x: unknown field",
        ),
        ({"kind": "tool_calls", "tool_calls": [WEATHER], "chunks": 0}, ".chunks: expected"),
        (
            {"kind": "stream", "error_shape": "anthropic"},
            '.error_shape: only used with then = "error"',
        ),
        ({"kind": "stream", "then": "error", "error_shape": "x"}, ".error_shape: expected one of"),
    ],
)
def test_a_malformed_tool_call_or_error_shape_names_the_field(
    step: dict[str, Any], where: str
) -> None:
    with pytest.raises(ScriptError) as raised:
        parse_script({"models": {"m": [step]}})
    assert f'models["m"][0]{where}' in str(raised.value)


def test_string_arguments_are_sent_as_is_even_when_not_json(srv: FaultServer) -> None:
    broken = {"name": "f", "arguments": '{"city": "Par'}
    srv.script(one("m", kind="tool_calls", tool_calls=[broken]))
    with client(srv) as c:
        message = c.chat.completions.create(model="m", messages=MESSAGES).choices[0].message
    assert function_calls(message)[0].function.arguments == '{"city": "Par'


# --------------------------------------------------------------------------- error shapes, chat


@pytest.mark.parametrize(
    ("shape", "event", "message"),
    [("openai", None, "scripted stream error"), ("anthropic", "error", "Overloaded")],
)
def test_both_error_stream_shapes_raise_in_the_sdk_on_chat(
    srv: FaultServer, shape: str, event: str | None, message: str
) -> None:
    step = {"kind": "stream", "chunks": 1, "then": "error", "error_shape": shape}
    srv.script({"models": {"m": [step, step]}})
    got: list[str | None] = []
    with client(srv) as c, pytest.raises(openai.APIError, match=message) as raised:
        for chunk in c.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            got.append(chunk.choices[0].delta.content)
    assert got == ["chunk-1 "]
    _, body = raw_post(srv, "/v1/chat/completions", {"model": "m", "stream": True})
    name, data = sse(body)[-1]
    assert name == event
    if shape == "anthropic":
        overloaded = {"type": "overloaded_error", "message": "Overloaded"}
        assert data == {"type": "error", "error": overloaded}
        assert raised.value.body == data["error"]
    else:
        assert data["error"]["message"] == message
