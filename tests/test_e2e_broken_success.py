"""A 200 that carries no usable reply is a malformed reply, never a success.

Real SDK, real HTTP, the fault server scripting each body as providers sent it: an
empty choice, a null message, no choices, an empty message, OpenRouter's
``finish_reason: "error"`` with its error object; as streams: a stream that ends
without content or tool call, one whose only finish_reason is ``error``. Each is
classified (``overloaded`` unless its error object says otherwise) and the turn falls
back to the healthy fallback, which answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fallgate.fsm import TurnFailed, instant_waits
from fallgate.providers import AsyncFallgate, Fallgate

import fallgate

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]
OPENROUTER_ERROR = {
    "code": 502,
    "message": "Provider returned error",
    "metadata": {"provider_name": "SomeHost", "raw": "upstream reset"},
}


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


def completion(*choices: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "created": 1,
        "model": "m0",
        "choices": list(choices),
    }


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish, **extra}
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m0",
        "choices": [choice],
    }


BROKEN_200 = [
    ("an empty choice", completion({}), "overloaded (HTTP 200)", "has no message"),
    (
        "a null message",
        completion({"index": 0, "message": None, "finish_reason": "stop"}),
        "overloaded (HTTP 200)",
        "has no message",
    ),
    ("no choices at all", completion(), "overloaded (HTTP 200)", "without choices"),
    (
        "an empty message",
        completion(
            {"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}
        ),
        "overloaded (HTTP 200)",
        "message is empty",
    ),
    (
        "a message whose content is a number",
        completion(
            {"index": 0, "message": {"role": "assistant", "content": 5}, "finish_reason": "stop"}
        ),
        "overloaded (HTTP 200)",
        "content is int, not text",
    ),
    (
        "OpenRouter's finish_reason error",
        completion({"index": 0, "finish_reason": "error", "error": OPENROUTER_ERROR}),
        "overloaded (HTTP 502)",
        "Provider returned error",
    ),
    (
        "OpenRouter's finish_reason error with an empty message",
        completion(
            {
                "index": 0,
                "message": {"role": "assistant", "content": ""},
                "finish_reason": "error",
                "error": {"code": 429, "message": "Rate limit exceeded upstream"},
            }
        ),
        "rate_limited (HTTP 429)",
        "Rate limit exceeded upstream",
    ),
]


#: Every broken 200 above, as (body, how the trace describes it, a word of the detail).
broken_200 = pytest.mark.parametrize(
    ("body", "described", "detail"),
    [case[1:] for case in BROKEN_200],
    ids=[case[0] for case in BROKEN_200],
)


@broken_200
def test_a_200_without_a_usable_message_falls_back_to_the_healthy_fallback(
    fault_server, body, described, detail
):
    fault_server.script({"models": {"m0": [{"kind": "status", "status": 200, "body": body}]}})
    with Fallgate(chain("m0", "m1", server=fault_server)) as client:
        result = client.run(messages=MSG)
    assert result.target == "fallback_1"
    assert result.value.choices[0].message.content == "ok"
    left = result.trace[1]
    assert (left.source, left.dest) == ("primary", "fallback_1")
    assert (left.detail or "").startswith(described)
    assert left.event == described.split()[0]
    assert detail in (left.detail or "")
    assert fault_server.counts == {"m0": 1, "m1": 1}


def test_with_no_fallback_a_broken_200_is_retried_then_fails_clearly(fault_server):
    body = completion({"index": 0, "message": None, "finish_reason": "stop"})
    fault_server.script({"default": {"kind": "status", "status": 200, "body": body}})
    with Fallgate(chain("m0", server=fault_server, max_attempts=2)) as client:
        with pytest.raises(TurnFailed) as failed:
            client.chat.completions.create(messages=MSG)
    assert "attempted 2x, last: overloaded (HTTP 200): malformed reply" in str(failed.value)
    assert fault_server.count("m0") == 2


def test_a_real_reply_that_says_little_is_still_a_success(fault_server):
    """Tool calls without content, and a reply stopped at the caller's token limit with
    nothing said (a reasoning model), are real replies: no fallback."""
    calls = {"kind": "tool_calls", "tool_calls": [{"name": "f", "arguments": {}}]}
    cut = completion(
        {"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "length"}
    )
    fault_server.script({"models": {"m0": [calls, {"kind": "status", "status": 200, "body": cut}]}})
    with Fallgate(chain("m0", "m1", server=fault_server)) as client:
        first = client.run(messages=MSG)
        second = client.run(messages=MSG)
    assert (first.target, second.target) == ("primary", "primary")
    assert first.value.choices[0].message.tool_calls[0].function.name == "f"
    assert second.value.choices[0].finish_reason == "length"
    assert fault_server.count("m1") == 0


BROKEN_STREAMS = [
    (
        "a stream with a finish_reason and nothing else",
        [chunk({"role": "assistant", "content": ""}), chunk({}, "stop")],
        "overloaded",
    ),
    (
        "a stream whose usage chunk follows an empty answer",
        [
            chunk({"role": "assistant"}),
            chunk({}, "stop"),
            {
                **chunk({}),
                "choices": [],
                "usage": {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1},
            },
        ],
        "overloaded",
    ),
    (
        "OpenRouter's finish_reason error before any content",
        [chunk({"role": "assistant"}), chunk({"content": ""}, "error", error=OPENROUTER_ERROR)],
        "overloaded",
    ),
    (
        "a finish_reason error without an error object",
        [chunk({"role": "assistant"}), chunk({}, "error")],
        "overloaded",
    ),
]


@pytest.mark.parametrize(
    ("events", "kind"),
    [case[1:] for case in BROKEN_STREAMS],
    ids=[case[0] for case in BROKEN_STREAMS],
)
def test_a_stream_that_says_nothing_falls_back_before_the_caller_sees_a_chunk(
    fault_server, events, kind
):
    fault_server.script({"models": {"m0": [{"kind": "sse", "events": events}]}})
    with Fallgate(chain("m0", "m1", server=fault_server)) as client:
        stream = client.chat.completions.create(messages=MSG, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "ok"  # the fallback's words only: nothing of the empty stream
    assert [e.dest for e in stream.trace] == ["primary", "fallback_1", "done"]
    assert stream.trace[1].event == kind


async def test_the_async_stream_falls_back_the_same_way(fault_server):
    events = [chunk({"role": "assistant"}), chunk({}, "error", error=OPENROUTER_ERROR)]
    fault_server.script({"models": {"m0": [{"kind": "sse", "events": events}]}})
    async with AsyncFallgate(chain("m0", "m1", server=fault_server)) as client:
        stream = await client.chat.completions.create(messages=MSG, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "ok"
    assert [e.dest for e in stream.trace] == ["primary", "fallback_1", "done"]


def test_finish_reason_error_after_content_is_an_interrupted_stream_not_a_success(
    fault_server,
):
    events = [
        chunk({"role": "assistant", "content": "Hel"}),
        chunk({"content": ""}, "error", error=OPENROUTER_ERROR),
    ]
    fault_server.script({"models": {"m0": [{"kind": "sse", "events": events}]}})
    with Fallgate(chain("m0", "m1", server=fault_server)) as client:
        with pytest.raises(TurnFailed) as failed:
            stream = client.chat.completions.create(messages=MSG, stream=True)
            for _ in stream:
                pass
    assert failed.value.partial == "Hel"
    assert "stream_interrupted" in str(failed.value)
    assert fault_server.count("m1") == 0  # committed: never replayed elsewhere


def test_a_completed_response_without_output_falls_back(fault_server):
    empty = {
        "id": "resp_x",
        "object": "response",
        "created_at": 1,
        "model": "m0",
        "status": "completed",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    fault_server.script({"models": {"m0": [{"kind": "status", "status": 200, "body": empty}]}})
    with Fallgate(chain("m0", "m1", server=fault_server)) as client:
        result = client.responses.run(input="hi")
    assert result.target == "fallback_1"
    assert result.value.output_text == "ok"
    assert "without any output" in (result.trace[1].detail or "")


def test_a_responses_stream_that_completes_without_output_falls_back(fault_server):
    def response(status: str) -> dict[str, Any]:
        return {"id": "resp_x", "object": "response", "created_at": 1, "model": "m0",
                "status": status, "output": [], "parallel_tool_calls": True,
                "tool_choice": "auto", "tools": []}  # fmt: skip

    events = [
        {"type": "response.created", "sequence_number": 0, "response": response("in_progress")},
        {"type": "response.completed", "sequence_number": 1, "response": response("completed")},
    ]
    fault_server.script({"models": {"m0": [{"kind": "sse", "events": events}]}})
    with Fallgate(chain("m0", "m1", server=fault_server)) as client:
        stream = client.responses.create(input="hi", stream=True)
        kinds = [e.type for e in stream]
    assert "response.output_text.delta" in kinds and kinds[-1] == "response.completed"
    assert [e.dest for e in stream.trace] == ["primary", "fallback_1", "done"]
    assert "completed without any output" in (stream.trace[1].detail or "")
    assert stream.text == "ok"


@broken_200
def test_under_the_sdk_over_fallgates_http_client_a_broken_200_falls_back_the_same_way(
    fault_server, body, described, detail
):
    """The embedded transport judges the body itself (a well-formed reply validated, any
    other read as the SDK reads it): the same outcome, the same words, as the wrapper's."""
    fault_server.script({"models": {"m0": [{"kind": "status", "status": 200, "body": body}]}})
    events: list[Any] = []
    policy = chain("m0", "m1", server=fault_server)
    http = fallgate.http_client(policy, on_transition=events.append)
    with openai.OpenAI(api_key="sk-x", base_url="http://unused.invalid/v1", http_client=http) as c:
        reply = c.chat.completions.create(model="m0", messages=MSG)
    assert reply.choices[0].message.content == "ok"
    assert [e.dest for e in events] == ["primary", "fallback_1", "done"]
    left = events[1]
    assert (left.detail or "").startswith(described)
    assert detail in (left.detail or "")
    assert fault_server.counts == {"m0": 1, "m1": 1}
