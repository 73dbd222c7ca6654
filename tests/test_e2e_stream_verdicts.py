"""What a stream that says little comes to: real SDK, loopback fault server.

The wrapper (`Fallgate`, `AsyncFallgate`) and the embedded HTTP client
(`fallgate.http_client`, `async_http_client`) judge a stream by one rule
(`providers.openai.calls`): a stream that says nothing but a finish_reason (``error``,
an empty ``stop``, ``tool_calls`` without a call), or a Responses stream completed
without output, is a malformed reply that falls back, never an empty success; one that
says nothing and stops on the content filter is ``content_filtered``, as the same reply
without a stream; one stopped at the token limit is a real (empty) reply, as without a
stream. Audio is content. A choice that finished stays finished: Azure's trailing
content-filter annotation after ``stop`` leaves the answer whole.
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from fallgate.fsm import OutcomeKind, TurnFailed, instant_waits
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from fallgate import async_http_client, http_client

from helpers import chain, response_body

MSG = [{"role": "user", "content": "tell me"}]
MODES = ["wrapper", "async wrapper", "http_client", "async http_client"]
FALLBACK = {"kind": "answer", "text": "from b"}


def chunk(delta: dict[str, Any] | None, finish: str | None = None, **choice: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"index": 0, "finish_reason": finish, **choice}
    if delta is not None:
        c["delta"] = delta
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "a",
        "choices": [c],
    }


OPENER = chunk({"role": "assistant", "content": ""})


@pytest.fixture(autouse=True)
def instant() -> Any:
    with instant_waits():
        yield


def _policy(server: FaultServer, *models: Any) -> Any:
    return chain(*(models or ("a", "b")), server=server)


def _chat_stream(policy: Any, mode: str) -> tuple[str, list[Any]]:
    """One streamed chat turn in `mode`: the text the caller got, and its chunks."""
    if mode == "wrapper":
        with Fallgate(policy) as gate:
            chunks = list(gate.chat.completions.create(messages=MSG, stream=True))
    elif mode == "http_client":
        with openai.OpenAI(api_key="x", http_client=http_client(policy), max_retries=0) as sdk:
            chunks = list(sdk.chat.completions.create(model="a", messages=MSG, stream=True))
    else:
        chunks = asyncio.run(_achat_stream(policy, mode))
    text = "".join(c.delta.content or "" for ch in chunks for c in ch.choices if c.delta)
    return text, chunks


async def _achat_stream(policy: Any, mode: str) -> list[Any]:
    if mode == "async wrapper":
        async with AsyncFallgate(policy) as gate:
            s = await gate.chat.completions.create(messages=MSG, stream=True)
            return [c async for c in s]
    client = async_http_client(policy)
    async with openai.AsyncOpenAI(api_key="x", http_client=client, max_retries=0) as sdk:
        s = await sdk.chat.completions.create(model="a", messages=MSG, stream=True)
        return [c async for c in s]


def _responses_stream(policy: Any, mode: str) -> str:
    """One streamed Responses turn in `mode`: the text the caller got."""
    if mode == "wrapper":
        with Fallgate(policy) as gate:
            events = list(gate.responses.create(input="x", stream=True))
    elif mode == "http_client":
        with openai.OpenAI(api_key="x", http_client=http_client(policy), max_retries=0) as sdk:
            events = list(sdk.responses.create(model="a", input="x", stream=True))
    else:
        events = asyncio.run(_aresponses_stream(policy, mode))
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


async def _aresponses_stream(policy: Any, mode: str) -> list[Any]:
    if mode == "async wrapper":
        async with AsyncFallgate(policy) as gate:
            s = await gate.responses.create(input="x", stream=True)
            return [e async for e in s]
    client = async_http_client(policy)
    async with openai.AsyncOpenAI(api_key="x", http_client=client, max_retries=0) as sdk:
        s = await sdk.responses.create(model="a", input="x", stream=True)
        return [e async for e in s]


def _falls_back(server: FaultServer, events: list[Any], mode: str, *, done: bool = True) -> None:
    server.script(
        {"models": {"a": [{"kind": "sse", "events": events, "done": done}], "b": [FALLBACK]}}
    )
    policy = chain("a", "b", server=server, max_attempts=1)
    text, _ = _chat_stream(policy, mode)
    assert text == "from b"
    assert server.counts == {"a": 1, "b": 1}


# -- a stream that says nothing but its end falls back --------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("done", [True, False], ids=["then [DONE]", "then cut"])
def test_a_stream_that_only_finishes_with_error_falls_back(
    fault_server: FaultServer, mode: str, done: bool
) -> None:
    """OpenRouter's upstream failure: the opener, then ``finish_reason: "error"`` (with
    its error object): not an empty answer, the fallback answers."""
    error = {"code": 502, "message": "upstream failed"}
    _falls_back(fault_server, [OPENER, chunk({}, "error", error=error)], mode, done=done)


@pytest.mark.parametrize("mode", MODES)
def test_a_stream_that_only_finishes_with_a_bare_error_falls_back(
    fault_server: FaultServer, mode: str
) -> None:
    _falls_back(fault_server, [chunk({}, "error")], mode)


@pytest.mark.parametrize("mode", MODES)
def test_an_empty_stop_stream_falls_back(fault_server: FaultServer, mode: str) -> None:
    _falls_back(fault_server, [OPENER, chunk({}, "stop")], mode)


@pytest.mark.parametrize("mode", MODES)
def test_a_tool_calls_finish_without_a_tool_call_falls_back(
    fault_server: FaultServer, mode: str
) -> None:
    _falls_back(fault_server, [OPENER, chunk({}, "tool_calls")], mode)


def _created_then_completed_empty() -> list[Any]:
    ev: list[Any] = [
        {"type": "response.created", "response": response_body("in_progress", [])},
        {"type": "response.completed", "response": response_body("completed", [])},
    ]
    for i, e in enumerate(ev):
        e["sequence_number"] = i
    return ev


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("done", [True, False], ids=["then [DONE]", "then cut"])
def test_a_responses_stream_completed_without_output_falls_back(
    fault_server: FaultServer, mode: str, done: bool
) -> None:
    ev = _created_then_completed_empty()
    fault_server.script(
        {"models": {"a": [{"kind": "sse", "events": ev, "done": done}], "b": [FALLBACK]}}
    )
    policy = chain("a", "b", server=fault_server, max_attempts=1)
    assert _responses_stream(policy, mode) == "from b"
    assert fault_server.counts == {"a": 1, "b": 1}


# -- content_filter / length with nothing said: as without a stream ------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_stream_stopped_by_the_content_filter_before_any_content_is_content_filtered(
    fault_server: FaultServer, mode: str
) -> None:
    """As the same reply without a stream: the turn fails ``content_filtered`` (no
    fallback by default), never a success with nothing in it."""
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "sse", "events": [OPENER, chunk({}, "content_filter")]}],
                "b": [FALLBACK],
            }
        }
    )
    policy = chain("a", "b", server=fault_server, max_attempts=1)
    if "wrapper" in mode:
        with pytest.raises(TurnFailed) as e:
            _chat_stream(policy, mode)
        assert e.value.last_outcome is not None
        assert e.value.last_outcome.kind is OutcomeKind.CONTENT_FILTERED
    else:
        with pytest.raises(openai.InternalServerError) as h:
            _chat_stream(policy, mode)
        assert h.value.status_code == 502 and "content_filtered" in str(h.value)
    assert fault_server.counts == {"a": 1}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "reply"])
@pytest.mark.parametrize("mode", ["wrapper", "http_client"])
def test_a_responses_reply_the_content_filter_stopped_with_nothing_said_is_content_filtered(
    fault_server: FaultServer, mode: str, stream: bool
) -> None:
    """``incomplete`` for the content filter (not the caller's token limit), no output:
    as chat's ``content_filter`` finish, the turn fails ``content_filtered``."""
    stopped = {
        **response_body("incomplete", []),
        "incomplete_details": {"reason": "content_filter"},
    }
    events = [
        {"type": "response.created", "response": response_body("in_progress", [])},
        {"type": "response.incomplete", "response": stopped},
    ]
    step = (
        {"kind": "sse", "events": events}
        if stream
        else {"kind": "status", "status": 200, "body": stopped}
    )
    fault_server.script({"models": {"a": [step], "b": [FALLBACK]}})
    policy = chain("a", "b", server=fault_server, max_attempts=1)
    if mode == "wrapper":
        with Fallgate(policy) as gate, pytest.raises(TurnFailed) as e:
            if stream:
                list(gate.responses.create(input="x", stream=True))
            else:
                gate.responses.create(input="x")
        assert e.value.last_outcome is not None
        assert e.value.last_outcome.kind is OutcomeKind.CONTENT_FILTERED
    else:
        with openai.OpenAI(api_key="x", http_client=http_client(policy), max_retries=0) as sdk:
            with pytest.raises(openai.InternalServerError) as h:
                if stream:
                    list(sdk.responses.create(model="a", input="x", stream=True))
                else:
                    sdk.responses.create(model="a", input="x")
        assert "content_filtered" in str(h.value)
    assert fault_server.counts == {"a": 1}


def test_a_stream_stopped_by_the_content_filter_after_content_keeps_its_content(
    fault_server: FaultServer,
) -> None:
    """Content, then the filter's stop: the caller has the content and its finish."""
    ev = [OPENER, chunk({"content": "part"}), chunk({}, "content_filter")]
    fault_server.script({"models": {"a": [{"kind": "sse", "events": ev}]}})
    text, chunks = _chat_stream(_policy(fault_server), "wrapper")
    assert text == "part"
    assert chunks[-1].choices[0].finish_reason == "content_filter"


@pytest.mark.parametrize("mode", MODES)
def test_a_stream_stopped_at_the_token_limit_before_any_content_is_an_empty_reply(
    fault_server: FaultServer, mode: str
) -> None:
    """A reasoning model can spend the caller's limit before any content: the same reply
    without a stream is an empty answer too (`calls.check_completion`)."""
    empty = {"kind": "answer", "text": "", "finish_reason": "length"}
    ev = [OPENER, chunk({}, "length")]
    fault_server.script({"models": {"a": [{"kind": "sse", "events": ev}, empty], "b": [FALLBACK]}})
    policy = chain("a", "b", server=fault_server, max_attempts=1)
    text, chunks = _chat_stream(policy, mode)
    assert text == "" and chunks[-1].choices[0].finish_reason == "length"
    with Fallgate(policy) as gate:
        reply = gate.chat.completions.create(messages=MSG)
    assert reply.choices[0].message.content == "" and reply.choices[0].finish_reason == "length"
    assert fault_server.counts == {"a": 2}


# -- audio is content -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_streamed_audio_reply_reaches_the_caller(fault_server: FaultServer, mode: str) -> None:
    ev = [
        chunk(
            {"role": "assistant", "content": None, "audio": {"id": "audio_1", "transcript": "Hel"}}
        ),
        chunk({"audio": {"transcript": "lo", "data": "UklGRg=="}}),
        chunk({"audio": {"expires_at": 1, "data": "AAAA"}}),
        chunk({}, "stop"),
    ]
    fault_server.script({"models": {"a": [{"kind": "sse", "events": ev}], "b": [FALLBACK]}})
    _, chunks = _chat_stream(_policy(fault_server), mode)
    audio = [getattr(c.choices[0].delta, "audio", None) for c in chunks if c.choices]
    said = [a.get("transcript") if isinstance(a, dict) else a.transcript for a in audio if a]
    assert [t for t in said if t] == ["Hel", "lo"]  # (a dict, or the SDK's own audio type)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert fault_server.counts == {"a": 1}


# -- a finished choice stays finished ---------------------------------------------------------

CFR = {"hate": {"filtered": False, "severity": "safe"}}


def _azure() -> list[Any]:
    """Azure OpenAI's shape: the prompt's filter results (no choices), the answer, its
    ``stop``, then a content-filter annotation of the finished choice (no delta)."""
    az = {"id": "chatcmpl-z", "object": "chat.completion.chunk", "created": 1, "model": "a"}
    return [
        {
            **az,
            "choices": [],
            "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": CFR}],
        },
        OPENER,
        chunk({"content": "Hello"}),
        chunk({}, "stop"),
        {
            "id": "",
            "object": "",
            "created": 0,
            "model": "",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": None,
                    "content_filter_results": CFR,
                    "content_filter_offsets": {
                        "check_offset": 0,
                        "start_offset": 0,
                        "end_offset": 5,
                    },
                }
            ],
        },
    ]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prefix", [False, True], ids=["no prefix", "assistant_prefix"])
def test_azures_trailing_annotation_after_stop_leaves_the_answer_whole(
    fault_server: FaultServer, mode: str, prefix: bool
) -> None:
    """Not interrupted, not continued: the caller has the answer, one request was sent."""
    more = {"kind": "continue", "text": "Hello EXTRA"}
    fault_server.script({"models": {"a": [{"kind": "sse", "events": _azure()}, more]}})
    policy = chain({"model": "a", "assistant_prefix": prefix}, server=fault_server)
    text, _ = _chat_stream(policy, mode)
    assert text == "Hello"
    assert fault_server.counts == {"a": 1}


@pytest.mark.parametrize("mode", MODES)
def test_a_cut_after_azures_trailing_annotation_loses_nothing(
    fault_server: FaultServer, mode: str
) -> None:
    """The connection cut after the annotation (no ``[DONE]``): the answer had ended, so
    the stream just ends (the wrapper takes it whole; under the HTTP client the SSE
    filter noted the end)."""
    more = {"kind": "continue", "text": "Hello EXTRA"}
    cut = {"kind": "sse", "events": _azure(), "done": False}
    fault_server.script({"models": {"a": [cut, more]}})
    policy = chain({"model": "a", "assistant_prefix": True}, server=fault_server)
    text, _ = _chat_stream(policy, mode)
    assert text == "Hello"
    assert fault_server.counts == {"a": 1}


def test_two_choices_end_only_when_both_finished(fault_server: FaultServer) -> None:
    """n=2: choice 0 finishes, choice 1 has only opened when the stream is cut: the
    answer had not ended (the turn fails interrupted, nothing is called whole)."""
    two = [
        {
            **OPENER,
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None},
                {"index": 1, "delta": {"role": "assistant", "content": ""}, "finish_reason": None},
            ],
        },
        chunk({"content": "zero"}),
        chunk({}, "stop"),
    ]
    fault_server.script({"models": {"a": [{"kind": "sse", "events": two, "done": False}]}})
    with pytest.raises(TurnFailed) as e:
        _chat_stream(_policy(fault_server, "a"), "wrapper")
    assert e.value.last_outcome is not None
    assert e.value.last_outcome.kind is OutcomeKind.STREAM_INTERRUPTED
