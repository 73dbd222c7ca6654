"""Where a stream's answer ends, and what may follow it: real SDK, loopback fault server.

Once a stream reached its end (a finish_reason; a Responses message item done, or the
response completed) nothing follows it: a break after the end is not continued (no text
after the end, no second finish), and under `fallgate.http_client` a cut after the end
is no error: the SDK's iteration just ends. A continuation that opens and says nothing is
held like a new stream: it is cut where the next target's reserve begins, and that target
continues.
A continued Responses stream keeps the items it delivered before the break in its final
response. Under `fallgate.http_client` an empty reasoning delta says nothing either.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fallgate.fsm import TurnFailed, instant_waits
from fallgate.providers import Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from fallgate import async_http_client, http_client

from helpers import (
    OUTPUT_TEXT,
    chain,
    no_collector_pauses,
    response_body,
    response_message,
    sdk_cut_errors,
)

WORDS = [f"w{i} " for i in range(10)]
FULL = "".join(WORDS)
CAN = {"assistant_prefix": True}
MSG = [{"role": "user", "content": "tell me"}]
PART = OUTPUT_TEXT
SLACK = 0.6


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "a",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip


def _msg(text: str | None, status: str) -> dict[str, Any]:
    return response_message(text, status)


def _resp(status: str, output: list[Any]) -> dict[str, Any]:
    return response_body(status, output)


def reasoned(pieces: list[str], *, closed: bool, completed: bool) -> list[dict[str, Any]]:
    """A Responses stream that reasons (item 0), then says `pieces` (message, item 1);
    `closed`: the message's done events follow; `completed`: and `response.completed`."""
    rs = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]}
    at = {"output_index": 1, "content_index": 0, "item_id": "msg_1"}
    ev: list[dict[str, Any]] = [
        {"type": "response.created", "response": _resp("in_progress", [])},
        {"type": "response.output_item.added", "output_index": 0, "item": {**rs, "summary": []}},
        {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0,
         "summary_index": 0, "delta": "hm"},
        {"type": "response.output_item.done", "output_index": 0, "item": rs},
        {"type": "response.output_item.added", "output_index": 1,
         "item": _msg(None, "in_progress")},
        {"type": "response.content_part.added", **at, "part": PART},
    ]  # fmt: skip
    ev += [{"type": "response.output_text.delta", **at, "delta": p, "logprobs": []} for p in pieces]
    text = "".join(pieces)
    if closed:
        ev += [
            {"type": "response.output_text.done", **at, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **at, "part": {**PART, "text": text}},
            {"type": "response.output_item.done", "output_index": 1,
             "item": _msg(text, "completed")},
        ]  # fmt: skip
    if completed:
        done = _resp("completed", [rs, _msg(text, "completed")])
        ev.append({"type": "response.completed", "response": done})
    for i, e in enumerate(ev):
        e["sequence_number"] = i
    return ev


@pytest.fixture
def instant() -> Iterator[None]:
    with instant_waits():
        yield


def test_a_continued_responses_stream_keeps_the_reasoning_it_delivered(
    fault_server: FaultServer, instant: None
) -> None:
    broken = {"kind": "sse", "events": reasoned(WORDS[:4], closed=False, completed=False),
              "done": False}  # fmt: skip
    fault_server.script({"models": {"a": [broken, {"kind": "continue", "text": FULL}]}})
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server)) as gate:
        with gate.responses.stream(input="x") as stream:
            list(stream)
            final = stream.get_final_response()
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output_text == FULL


def test_a_chat_stream_that_breaks_after_its_finish_is_not_continued(
    fault_server: FaultServer, instant: None
) -> None:
    """The text and its finish_reason, then an error event: the answer had ended, so it
    is not continued (nothing after the finish, no second finish); the turn fails with the
    whole text as its partial output."""
    ev = [chunk({"role": "assistant", "content": "hi"}), chunk({}, "stop"),
          {"error": {"message": "boom", "type": "server_error"}}]  # fmt: skip
    fault_server.script(
        {"models": {"a": [{"kind": "sse", "events": ev, "done": False},
                          {"kind": "continue", "text": "hi there"}]}}
    )  # fmt: skip
    seen: list[tuple[Any, Any]] = []
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server)) as gate:
        with pytest.raises(TurnFailed) as e:
            for c in gate.chat.completions.create(messages=MSG, stream=True):
                seen += [(ch.delta.content, ch.finish_reason) for ch in c.choices]
    assert seen == [("hi", None), (None, "stop")]
    assert e.value.partial == "hi" and "reached its end" in str(e.value)
    assert fault_server.count("a") == 1  # the refused continuation was never sent


def test_a_responses_stream_cut_after_its_message_closed_is_not_continued(
    fault_server: FaultServer, instant: None
) -> None:
    ev = reasoned(WORDS[:4], closed=True, completed=False)
    fault_server.script(
        {"models": {"a": [{"kind": "sse", "events": ev, "done": False},
                          {"kind": "continue", "text": FULL}]}}
    )  # fmt: skip
    deltas: list[str] = []
    with Fallgate(chain({"model": "a", **CAN}, server=fault_server)) as gate:
        with pytest.raises(TurnFailed) as e:
            for event in gate.responses.create(input="x", stream=True):
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
    assert "".join(deltas) == e.value.partial == "".join(WORDS[:4])


def test_a_continuation_that_opens_and_says_nothing_is_left_for_the_next_that_continues(
    fault_server: FaultServer,
) -> None:
    """The primary breaks after 3 words; its continuation opens (a role chunk) and then
    sends only empty deltas: held like a new stream, it is cut where the next target's
    reserve begins (deadline 4 s - 1 s), and the fallback continues the answer."""
    cut = {"kind": "stream", "chunks": WORDS[:3], "then": "cut"}
    silent = {"kind": "sse", "interval": 0.4, "done": False,
              "events": [chunk({"role": "assistant", "content": ""})]
              + [chunk({"content": ""})] * 40}  # fmt: skip
    fault_server.script({"models": {"a": [cut, silent], "b": [{"kind": "continue", "text": FULL}]}})
    policy = chain({"model": "a", **CAN}, {"model": "b", **CAN}, server=fault_server,
                   attempt_timeout=1, deadline=4, stream_idle_timeout=3,
                   first_event_timeout=1)  # fmt: skip
    t0 = time.monotonic()
    with no_collector_pauses(), Fallgate(policy) as gate:
        got = "".join(
            c.choices[0].delta.content or ""
            for c in gate.chat.completions.create(messages=MSG, stream=True)
            if c.choices
        )
    took = time.monotonic() - t0
    assert got == FULL
    assert fault_server.counts == {"a": 2, "b": 1}
    assert took < 3.0 + SLACK, took


def test_under_the_http_client_empty_reasoning_deltas_say_nothing(
    fault_server: FaultServer,
) -> None:
    """A Responses stream that opens a reasoning item and then sends only empty reasoning
    deltas is not committed under `fallgate.http_client` either: cut at the hold (3 s of
    the 4 s deadline), the fallback answers."""
    base = reasoned(["x"], closed=True, completed=True)
    empty = {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1",
             "output_index": 0, "summary_index": 0, "delta": ""}  # fmt: skip
    ev = [base[0], base[1]] + [dict(empty, sequence_number=i + 2) for i in range(20)]
    fault_server.script(
        {"models": {"a": [{"kind": "sse", "events": ev, "interval": 0.4, "done": False}],
                    "b": [{"kind": "answer", "text": "from b"}]}}
    )  # fmt: skip
    policy = chain("a", "b", server=fault_server, attempt_timeout=1, deadline=4,
                   stream_idle_timeout=10, first_event_timeout=1, max_attempts=1)  # fmt: skip
    t0 = time.monotonic()
    with (
        no_collector_pauses(),
        openai.OpenAI(api_key="unused", http_client=http_client(policy), max_retries=0) as sdk,
    ):
        events = sdk.responses.create(model="a", input="x", stream=True)
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    took = time.monotonic() - t0
    assert text == "from b"
    assert took < 3.0 + SLACK, took


def _sdk_stream(policy: Any, flavour: str, api: str) -> list[Any]:
    """Every event the real SDK hands its caller for one stream under
    `fallgate.http_client` (`flavour`: sync or async; `api`: chat or responses)."""

    def create(c: Any) -> Any:
        if api == "chat":
            return c.chat.completions.create(model="a", messages=MSG, stream=True)
        return c.responses.create(model="a", input="x", stream=True)

    if flavour == "sync":
        with openai.OpenAI(api_key="unused", http_client=http_client(policy), max_retries=0) as c:
            return list(create(c))

    async def main() -> list[Any]:
        client = openai.AsyncOpenAI(
            api_key="unused", http_client=async_http_client(policy), max_retries=0
        )
        async with client:
            return [e async for e in await create(client)]

    return asyncio.run(main())


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_under_the_http_client_a_chat_stream_cut_after_its_finish_is_whole(
    fault_server: FaultServer, flavour: str
) -> None:
    """The text and its finish_reason, then the connection breaks before ``[DONE]``: the
    answer had ended, so the SDK's iteration just ends (as the wrapper takes such a stream
    whole) instead of raising a connection error at the caller after the whole answer."""
    ev = [chunk({"role": "assistant", "content": "the whole answer"}), chunk({}, "stop")]
    fault_server.script({"models": {"a": [{"kind": "sse", "events": ev, "done": False}]}})
    got = _sdk_stream(chain("a", "b", server=fault_server), flavour, "chat")
    assert [(c.choices[0].delta.content, c.choices[0].finish_reason) for c in got] == [
        ("the whole answer", None),
        (None, "stop"),
    ]
    assert fault_server.counts == {"a": 1}


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_under_the_http_client_a_responses_stream_cut_after_it_completed_is_whole(
    fault_server: FaultServer, flavour: str
) -> None:
    ev = reasoned(WORDS[:4], closed=True, completed=True)
    fault_server.script({"models": {"a": [{"kind": "sse", "events": ev, "done": False}]}})
    got = _sdk_stream(chain("a", "b", server=fault_server), flavour, "responses")
    assert got[-1].type == "response.completed"
    assert got[-1].response.output_text == "".join(WORDS[:4])
    assert fault_server.counts == {"a": 1}


@pytest.mark.parametrize(
    "events",
    [
        pytest.param(reasoned(WORDS[:4], closed=True, completed=False), id="responses-unfinished"),
        pytest.param(
            [
                {**chunk({"content": "zero"}), "choices": [{"index": 0, "delta": {"content": "0"},
                                                             "finish_reason": "stop"}]},
                {**chunk({}), "choices": [{"index": 1, "delta": {"content": "one half"},
                                           "finish_reason": None}]},
            ],
            id="chat-one-of-two-choices-finished",
        ),
    ],
)  # fmt: skip
def test_under_the_http_client_a_cut_before_the_end_still_reaches_the_caller(
    fault_server: FaultServer, events: list[Any]
) -> None:
    """Cut after the commit but before the answer's end (a Responses message closed but
    never completed; one of two choices still open): the SDK raises its connection error,
    as it would without fallgate, and nothing is sent again."""
    api = "responses" if events[0].get("type") else "chat"
    fault_server.script({"models": {"a": [{"kind": "sse", "events": events, "done": False}]}})
    with pytest.raises(sdk_cut_errors()):
        _sdk_stream(chain("a", "b", server=fault_server), "sync", api)
    assert fault_server.counts == {"a": 1}
