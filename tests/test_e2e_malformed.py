"""Malformed and broken replies, end to end: each is a classified outcome in the
trace and a clear final TurnFailed — never a crash inside the engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fallgate.fsm import TurnFailed, instant_waits
from fallgate.providers import Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


BROKEN = [
    (
        "HTML 502 page",
        {
            "kind": "status",
            "status": 502,
            "body": "<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1>nginx</body></html>",
            "content_type": "text/html",
        },
        "overloaded",
        "overloaded (HTTP 502): HTML error page",
    ),
    (
        "invalid JSON with 200",
        {"kind": "invalid_json"},
        "overloaded",
        "malformed reply: not valid JSON",
    ),
    ("empty body", {"kind": "empty"}, "overloaded", "malformed reply: not valid JSON"),
    (
        "body cut mid-way",
        {"kind": "drop_mid_body"},
        "transport",
        "peer closed connection without sending complete message body",
    ),
    (
        "connection dropped",
        {"kind": "drop"},
        "transport",
        "Server disconnected without sending a response",
    ),
    (
        "hang past the timeout",
        {"kind": "hang", "seconds": 3},
        "transport",
        "timeout (AttemptTimeout: attempt exceeded its 0.5 s total time bound)",
    ),
]


@pytest.mark.parametrize(("name", "step", "event", "reason"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_reply_is_classified_and_fails_clearly(
    fault_server: FaultServer, name: str, step: dict[str, Any], event: str, reason: str
) -> None:
    fault_server.script({"default": step})
    policy = chain(
        "a", server=fault_server, attempt_timeout=0.5, max_attempts=2, recover_transport=False
    )
    with Fallgate(policy) as gate:
        with pytest.raises(TurnFailed) as info:
            gate.run(messages=MSG)
    failed = info.value
    assert failed.state == "failed"
    assert str(failed).startswith("turn failed: primary ended with ")
    assert reason in failed.reasons["primary"], failed.reasons
    assert [e.event for e in failed.trace] == ["start", event, "waited", event]
    assert fault_server.count("a") == 2


@pytest.mark.parametrize(("name", "step", "event", "reason"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_reply_falls_back_to_a_healthy_target(
    fault_server: FaultServer, name: str, step: dict[str, Any], event: str, reason: str
) -> None:
    fault_server.script({"models": {"a": [step]}})
    policy = chain(
        "a", "b", server=fault_server, attempt_timeout=0.5, max_attempts=1, recover_transport=False
    )
    with Fallgate(policy) as g:
        result = g.run(messages=MSG)
    assert result.model == "b"
    assert [e.event for e in result.trace] == ["start", event, "success"]


def test_a_stream_cut_before_its_first_chunk_is_a_transport_fault(
    fault_server: FaultServer,
) -> None:
    fault_server.script({"default": {"kind": "stream", "chunks": 0, "then": "cut"}})
    policy = chain(
        "a", server=fault_server, attempt_timeout=0.5, max_attempts=2, recover_transport=False
    )
    with Fallgate(policy) as gate:
        with pytest.raises(TurnFailed) as info:
            gate.chat.completions.create(messages=MSG, stream=True)
    assert "transport: connection error (RemoteProtocolError" in info.value.reasons["primary"]
    assert info.value.partial is None


@pytest.mark.parametrize(
    ("value", "waited"),
    [("1e308", None), ("-5", 0.0), ("soon, honestly", None), ("NaN", None), ("0", 0.0)],
)
def test_odd_retry_after_values_are_tolerated(
    fault_server: FaultServer, value: str, waited: float | None
) -> None:
    rl = {"kind": "status", "status": 429, "headers": {"retry-after": value}}
    fault_server.script({"models": {"a": [rl]}})
    # prefer_waiting: with no fallback the engine may wait for the same key
    p = chain("a", server=fault_server, attempt_timeout=0.5, prefer_waiting=True, retry_after_cap=5)
    with Fallgate(p) as gate:
        if value == "1e308":  # a day: beyond the cap, the turn fails rather than sleeping
            with pytest.raises(TurnFailed) as info:
                gate.run(messages=MSG)
            assert "rate_limited (HTTP 429)" in str(info.value)
            return
        result = gate.run(messages=MSG)
    waits = [e.wait for e in result.trace if e.wait is not None]
    assert len(waits) == 1 and 0.0 <= waits[0] <= 5.0
    if waited is not None:
        assert waits[0] == waited
    assert fault_server.count("a") == 2


def _completion(*choices: tuple[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "a",
        "choices": [
            {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": f}
            for i, (text, f) in enumerate(choices)
        ],
    }  # fmt: skip


def _response(status: Any, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "resp_1", "object": "response", "created_at": 1, "model": "a",
        "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress",
                    "content": [{"type": "output_text", "text": "half an", "annotations": []}]}],
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], **extra,
    }  # fmt: skip
    if status is not ...:
        body["status"] = status
    return body


UNFINISHED = [
    ("chat, finish_reason ''", "chat", _completion(("half an ans", ""))),
    ("chat, one of two choices unfinished", "chat", _completion(("done", "stop"), ("half", None))),
    ("responses, in_progress", "responses", _response("in_progress")),
    ("responses, queued", "responses", _response("queued")),
]


@pytest.mark.parametrize(("name", "api", "body"), UNFINISHED, ids=[u[0] for u in UNFINISHED])
def test_a_reply_that_never_ended_is_never_the_answer(
    fault_server: FaultServer, name: str, api: str, body: dict[str, Any]
) -> None:
    """Text that never reached its end (no finish_reason, one choice of several unfinished,
    a Responses status short of completed) is a malformed reply: the fallback answers.
    (A Responses reply with no status at all is taken as it comes: a compatible server
    may not say, and OpenAI always does.)"""
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "status", "status": 200, "body": body}],
                "b": [{"kind": "answer", "text": "fallback answer"}],
            }
        }
    )
    policy = chain("a", "b", server=fault_server, max_attempts=1, recover_transport=False)
    with Fallgate(policy) as g:
        if api == "chat":
            r = g.chat.completions.create(messages=MSG)
            got = [(c.message.content, c.finish_reason) for c in r.choices]
            assert got == [("fallback answer", "stop")], got
        else:
            assert g.responses.create(input="hi").output_text == "fallback answer"
    assert fault_server.counts == {"a": 1, "b": 1}


def test_a_background_response_answered_queued_is_the_answer(fault_server: FaultServer) -> None:
    """``background=True`` is answered at once, queued: that is the reply, not a fault."""
    body = _response("queued", background=True)
    fault_server.script({"models": {"a": [{"kind": "status", "status": 200, "body": body}]}})
    with Fallgate(chain("a", "b", server=fault_server)) as g:
        r = g.responses.create(input="hi", background=True)
    assert r.status == "queued" and fault_server.counts == {"a": 1}
