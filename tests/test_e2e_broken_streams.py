"""Broken streams are rescued: the real SDK over loopback, scripted faults, sync and async.

A stream cut after 40 of 60 tokens, one that stalls past the idle bound after 20, one
whose 10th event is not JSON, and a cut one whose fallback refuses an assistant prefix:
each ends with the complete text (the continuing target's rest after the seam), or,
where no target can continue, with the clean error that carries the delivered text
(never the refusal in its place). With ``continue_streams = false``, today's error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fallgate.fsm import TurnFailed, instant_waits
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.openai.http.sse import MALFORMED_IN_A_ROW
from fallgate.providers.testing.fault_server import FaultServer

from fallgate import async_http_client, http_client

from helpers import chain

MSG = [{"role": "user", "content": "tell me"}]
WORDS = [f"w{i} " for i in range(60)]
FULL = "".join(WORDS)
CAN = {"assistant_prefix": True}


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


def run(policy: Any, flavour: str, **kw: Any) -> tuple[str, Any]:
    """The caller streams the answer; (the text it got, the stream or the TurnFailed)."""
    got: list[str] = []

    def piece(chunk: Any) -> None:
        if chunk.choices:
            got.append(chunk.choices[0].delta.content or "")

    if flavour == "sync":
        with Fallgate(policy) as gate:
            try:
                with gate.chat.completions.create(messages=MSG, stream=True, **kw) as s:
                    for chunk in s:
                        piece(chunk)
            except TurnFailed as e:
                return "".join(got), e
            return "".join(got), s

    async def main() -> tuple[str, Any]:
        async with AsyncFallgate(policy) as gate:
            try:
                s = await gate.chat.completions.create(messages=MSG, stream=True, **kw)
                async with s:
                    async for chunk in s:
                        piece(chunk)
            except TurnFailed as e:
                return "".join(got), e
            return "".join(got), s

    return asyncio.run(main())


FLAVOURS = pytest.mark.parametrize("flavour", ["sync", "async"])


def _prefix_sent(srv: FaultServer, n: int) -> Any:
    return srv.requests[n].body["messages"][-1]


@FLAVOURS
def test_a_stream_cut_after_40_of_60_tokens_is_finished_by_the_same_target(
    fault_server: FaultServer, flavour: str
) -> None:
    fault_server.script(
        {
            "models": {
                "a": [
                    {"kind": "stream", "chunks": WORDS[:40], "then": "cut"},
                    {"kind": "continue", "text": FULL},
                ]
            }
        }
    )
    policy = chain({"model": "a", **CAN}, "b", server=fault_server)
    text, stream = run(policy, flavour, stream_options={"include_usage": True})
    assert text == FULL  # nothing lost, nothing twice at the seam
    assert _prefix_sent(fault_server, 1) == {"role": "assistant", "content": "".join(WORDS[:40])}
    assert fault_server.counts == {"a": 2}
    assert [e.dest for e in stream.trace] == ["primary", "primary_continuing", "done"]
    assert stream.seams == ((len("".join(WORDS[:40])), 0),)
    assert stream.usage is not None and stream.usage.completion_tokens > 0


@FLAVOURS
def test_a_stream_that_stalls_past_the_idle_bound_after_20_tokens_is_continued(
    fault_server: FaultServer, flavour: str
) -> None:
    stall = {"kind": "stream", "chunks": WORDS[:20], "then": "hang", "seconds": 3}
    fault_server.script({"models": {"a": [stall, {"kind": "continue", "text": FULL}]}})
    policy = chain({"model": "a", **CAN}, server=fault_server, stream_idle_timeout=0.3)
    text, stream = run(policy, flavour)
    assert text == FULL
    assert [e.event for e in stream.trace] == ["start", "stream_interrupted", "success"]
    assert "".join(WORDS[:20]) == _prefix_sent(fault_server, 1)["content"]


def _chunk(text: str | None, finish: str | None = None) -> dict[str, Any]:
    delta = {} if text is None else {"content": text}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "a",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


@FLAVOURS
def test_a_stream_whose_10th_event_is_not_json_goes_on_without_it(
    fault_server: FaultServer, flavour: str, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[Any] = [_chunk(w) for w in WORDS[:9]]
    events += ['{"choices": [{"delta": {"content": "lost'] + [_chunk(w) for w in WORDS[9:]]
    events.append(_chunk(None, "stop"))
    fault_server.script({"models": {"a": [{"kind": "sse", "events": events}]}})
    with caplog.at_level(logging.WARNING, logger="fallgate"):
        text, stream = run(chain("a", "b", server=fault_server), flavour)
    assert text == FULL
    assert fault_server.counts == {"a": 1}  # the same stream went on: no retry, no fallback
    assert stream.trace[-1].detail == "success: 1 malformed stream event dropped"
    warned = [r for r in caplog.records if "not JSON" in r.getMessage()]
    assert len(warned) == 1


@FLAVOURS
def test_bad_events_in_a_row_before_any_output_are_a_malformed_reply_that_falls_back(
    fault_server: FaultServer, flavour: str
) -> None:
    bad = {"kind": "sse", "events": ["{nope"] * MALFORMED_IN_A_ROW + [_chunk("never")]}
    fault_server.script({"models": {"a": [bad], "b": [{"kind": "answer", "text": "from b"}]}})
    text, stream = run(chain("a", "b", server=fault_server, max_attempts=1), flavour)
    assert text == "from b"
    assert [e.event for e in stream.trace] == ["start", "overloaded", "success"]


@FLAVOURS
def test_a_cut_stream_whose_fallback_refuses_a_prefix_goes_to_the_next_that_takes_one(
    fault_server: FaultServer, flavour: str
) -> None:
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "stream", "chunks": WORDS[:40], "then": "cut"}],
                "b": [{"kind": "refuse_prefix"}],
                "c": [{"kind": "continue", "text": FULL}],
            }
        }
    )
    # a cannot continue (no prefix); b says it can but answers 400; c continues
    policy = chain("a", {"model": "b", **CAN}, {"model": "c", **CAN}, server=fault_server)
    text, stream = run(policy, flavour)
    assert text == FULL
    assert fault_server.counts == {"a": 1, "b": 1, "c": 1}
    assert [e.dest for e in stream.trace] == [
        "primary",
        "fallback_1_continuing",
        "fallback_2_continuing",
        "done",
    ]


@FLAVOURS
def test_with_no_target_left_to_continue_the_caller_gets_the_break_not_the_refusal(
    fault_server: FaultServer, flavour: str
) -> None:
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "stream", "chunks": WORDS[:40], "then": "cut"}],
                "b": [{"kind": "refuse_prefix"}],
            }
        }
    )
    text, failed = run(chain("a", {"model": "b", **CAN}, server=fault_server), flavour)
    assert isinstance(failed, TurnFailed)
    assert text == failed.partial == "".join(WORDS[:40])  # exactly what was delivered
    assert failed.last_outcome is not None
    assert failed.last_outcome.kind == "stream_interrupted"  # not the 400 of b
    assert "bad_request (HTTP 400)" in failed.reasons["fallback_1"]
    assert "stream broke" in failed.summary


@FLAVOURS
def test_with_continuation_off_a_cut_stream_fails_cleanly_with_its_partial_text(
    fault_server: FaultServer, flavour: str
) -> None:
    cut = {"kind": "stream", "chunks": WORDS[:40], "then": "cut"}
    fault_server.script({"models": {"a": [cut]}})
    off = chain(
        {"model": "a", **CAN}, {"model": "b", **CAN}, server=fault_server, continue_streams=False
    )
    text, failed = run(off, flavour)
    assert isinstance(failed, TurnFailed)
    assert text == failed.partial == "".join(WORDS[:40])
    assert fault_server.counts == {"a": 1}  # no continuation, no replay
    assert [e.event for e in failed.trace] == ["start", "stream_interrupted"]
    assert "continue_streams is off" in failed.summary


def test_a_continuation_that_repeats_the_delivered_end_is_trimmed_at_the_seam(
    fault_server: FaultServer,
) -> None:
    fault_server.script(
        {
            "models": {
                "a": [
                    {"kind": "stream", "chunks": WORDS[:40], "then": "cut"},
                    {"kind": "continue", "text": FULL, "echo": 12},
                ]
            }
        }
    )
    text, stream = run(chain({"model": "a", **CAN}, server=fault_server), "sync")
    assert text == FULL
    assert stream.seams == ((len("".join(WORDS[:40])), 12),)


def test_a_stream_through_the_http_client_goes_on_past_an_event_that_is_not_json(
    fault_server: FaultServer,
) -> None:
    events: list[Any] = [_chunk(w) for w in WORDS[:9]]
    events += ["not json at all"] + [_chunk(w) for w in WORDS[9:]] + [_chunk(None, "stop")]
    fault_server.script({"models": {"a": [{"kind": "sse", "events": events}]}})
    policy = chain("a", "b", server=fault_server)
    with openai.OpenAI(api_key="unused", http_client=http_client(policy), max_retries=0) as c:
        chunks = list(c.chat.completions.create(model="a", messages=MSG, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == FULL

    async def main() -> str:
        fault_server.script({"models": {"a": [{"kind": "sse", "events": events}]}})
        client = openai.AsyncOpenAI(
            api_key="unused", http_client=async_http_client(policy), max_retries=0
        )
        async with client:
            s = await client.chat.completions.create(model="a", messages=MSG, stream=True)
            return "".join([ch.choices[0].delta.content or "" async for ch in s if ch.choices])

    assert asyncio.run(main()) == FULL


@FLAVOURS
def test_a_stream_cut_after_its_finish_reason_is_a_whole_answer(
    fault_server: FaultServer, flavour: str
) -> None:
    """The text, then ``finish_reason: stop``, then the connection closes before
    ``[DONE]``: the answer ended, only its close was lost. It is the turn's answer, not a
    broken stream (nothing is sent again, no fallback)."""
    events = [_chunk("the whole answer"), _chunk(None, "stop")]
    fault_server.script({"models": {"a": [{"kind": "sse", "events": events, "done": False}]}})
    text, stream = run(chain({"model": "a", **CAN}, "b", server=fault_server), flavour)
    assert not isinstance(stream, TurnFailed), stream
    assert text == "the whole answer"
    assert [e.dest for e in stream.trace] == ["primary", "done"]
    assert "cut after the stream's end" in stream.trace[-1].detail  # what came after is lost
    assert fault_server.counts == {"a": 1}


def _choice(i: int, text: str | None, finish: str | None = None) -> dict[str, Any]:
    delta = {} if text is None else {"content": text}
    return {
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "a",
        "choices": [{"index": i, "delta": delta, "finish_reason": finish}],
    }  # fmt: skip


def test_a_stream_of_two_choices_cut_after_one_finished_is_broken_not_whole(
    fault_server: FaultServer,
) -> None:
    """``n = 2``: choice 0 ends, choice 1 is cut halfway. The stream ended only when
    every choice did: the turn fails with what was delivered, and it is not continued (one
    text prefix cannot carry two choices)."""
    events = [_choice(0, "zero done"), _choice(0, None, "stop"), _choice(1, "one half")]
    fault_server.script({"models": {"a": [{"kind": "sse", "events": events, "done": False}]}})
    _, failed = run(
        chain({"model": "a", **CAN}, {"model": "b", **CAN}, server=fault_server), "sync"
    )
    assert isinstance(failed, TurnFailed), failed
    assert failed.last_outcome.kind == "stream_interrupted"
    assert fault_server.counts == {"a": 1}  # neither continued nor replayed


def test_an_error_event_after_the_finish_reason_is_still_a_break(
    fault_server: FaultServer,
) -> None:
    """Only a cut of the connection after the end is harmless; an error the stream itself
    sends after it (an upstream that retracts its output) is a break like any other."""
    events = [
        _chunk("answer"),
        _chunk(None, "stop"),
        {"error": {"message": "retracted", "code": 500}},
    ]
    fault_server.script({"models": {"a": [{"kind": "sse", "events": events}]}})
    _, stream = run(chain({"model": "a", **CAN}, "b", server=fault_server), "sync")
    assert "stream_interrupted" in [e.event for e in stream.trace], stream.trace
