"""Time belongs to the chain (issue 22), end to end: the real SDK over real sockets to the
fault server on loopback, timings scaled down from real providers' (seconds, not minutes).

- a silent primary (it accepts the request and never answers) leaves the turn time for
  the healthy fallback, sync, async and streaming (the `reserve` guard's part);
- a stream that started at once but whose first token comes late is the primary's
  answer, not cut at ``attempt_timeout`` (a started stream has the idle bound);
- a committed stream that stalls ends with its partial text at the idle bound;
- a primary down for a while is left for the fallback, probed one turn at a time, and
  serves again once healthy;
- an event stream sent to a non-streaming caller that ends without ``[DONE]``, a
  ``finish_reason`` or an error is never returned as a complete answer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fallgate.providers.testing.fault_server import FaultServer

from fallgate import AsyncFallgate, Fallgate, TurnFailed

from helpers import achat_text, chain, chat_text, no_collector_pauses

MESSAGES = [{"role": "user", "content": "hi"}]
#: Scheduling slack on a shared, loaded 2-core machine (an idle one needs 50 ms).
SLACK = 0.6
SILENT = {"kind": "timeout", "seconds": 30}
FAST = {"kind": "answer", "text": "fallback answer"}


@pytest.fixture(autouse=True)
def _scaled_bounds() -> Iterator[None]:
    """Every test here runs on bounds of tenths of a second."""
    with no_collector_pauses():
        yield


def _silent_policy(server: Any, **fields: Any) -> Any:
    return chain("silent", "fast", server=server, **fields)


def _turn(policy: Any, *, use_async: bool, stream: bool) -> tuple[str, float]:
    """One turn (sync or async, streamed or not): its text and how long it took."""

    async def agoes() -> str:
        async with AsyncFallgate(policy) as gate:
            return await achat_text(gate, MESSAGES, stream=stream)

    t0 = time.monotonic()
    if use_async:
        text = asyncio.run(agoes())
    else:
        with Fallgate(policy) as gate:
            text = chat_text(gate, MESSAGES, stream=stream)
    return text, time.monotonic() - t0


# -- a silent primary: the fallback answers within the deadline --
# These wait on the `reserve` guard (issue 22 item 1): without it the turn spends the whole
# deadline retrying the primary (3 attempts of 1 s do not leave 2.5 s any room).


@pytest.mark.parametrize(
    ("use_async", "stream"),
    [(False, False), (True, False), (False, True), (True, True)],
    ids=["sync", "async", "sync-stream", "async-stream"],
)
def test_a_silent_primary_leaves_time_for_the_fallback(fault_server, use_async, stream):
    fault_server.script({"models": {"silent": [SILENT] * 5, "fast": [FAST]}})
    policy = _silent_policy(fault_server, attempt_timeout=1, deadline=2.5)
    text, took = _turn(policy, use_async=use_async, stream=stream)
    assert text == "fallback answer"
    assert fault_server.count("fast") == 1
    assert took < 2.5 + SLACK, f"the 2.5 s deadline held the turn {took:.2f} s"


@pytest.mark.parametrize(
    ("use_async", "stream"), [(False, False), (True, True)], ids=["sync", "async-stream"]
)
def test_a_silent_primary_group_leaves_the_next_entry_its_attempt(fault_server, use_async, stream):
    """The primary entry is a group of two deployments, both silent: its first member
    takes its whole bound (1 s); a move to the second would take another and leave the
    fallback 0.5 s of the 2.5 s deadline, so the turn moves to the next entry instead.
    A second region must not turn the single deployment's answer into a failure."""
    fault_server.script({"models": {"p": [SILENT] * 5, "fast": [FAST] * 5}})
    with FaultServer() as other:
        other.script({"models": {"p": [SILENT] * 5}})
        members = [
            {"base_url": f"{srv.base_url}", "api_key": f"sk-{i}-0000000000"}
            for i, srv in enumerate((fault_server, other))
        ]
        group = {"provider": "fault", "model": "p", "members": members}
        policy = chain(group, "fast", server=fault_server, attempt_timeout=1, deadline=2.5)
        text, took = _turn(policy, use_async=use_async, stream=stream)
        asked = (fault_server.count("p"), other.count("p"), fault_server.count("fast"))
    assert text == "fallback answer"
    assert asked == (1, 0, 1), "the second member would have spent the fallback's reserve"
    assert took < 2.5 + SLACK, took


@pytest.mark.parametrize("length", [16000, None], ids=["known-length", "unknown-length"])
def test_after_a_context_overflow_a_silent_group_still_leaves_the_next_entry_its_attempt(
    fault_server, length
):
    """The primary overflows its 8k context; the group after it (of known length, or of
    unknown length: reached the other way after an overflow) has two silent members: the
    second is not asked, and the last entry answers within the 2.5 s deadline."""
    from fault_steps import CONTEXT_TOO_LONG_8K

    fault_server.script({"models": {"a": [CONTEXT_TOO_LONG_8K], "g": [SILENT], "u": [FAST]}})
    with FaultServer() as other:
        other.script({"models": {"g": [SILENT]}})
        members = [
            {"base_url": srv.base_url, "api_key": f"sk-{i}-0000000000"}
            for i, srv in enumerate((fault_server, other))
        ]
        group: dict[str, Any] = {"provider": "fault", "model": "g", "members": members}
        if length:
            group["context_length"] = length
        policy = chain("a@8192", group, "u", server=fault_server, attempt_timeout=1, deadline=2.5)
        text, took = _turn(policy, use_async=False, stream=False)
        asked = (fault_server.count("g"), other.count("g"), fault_server.count("u"))
    assert text == "fallback answer"
    assert asked == (1, 0, 1)
    assert took < 2.5 + SLACK, took


#: The default knobs scaled down 40 times (attempt 60 s -> 1.5 s, deadline 120 s -> 3 s).
SCALED_DEFAULTS = {
    "attempt_timeout": 1.5,
    "deadline": 3.0,
    "connect_timeout": 5 / 40,
    "first_event_timeout": 30 / 40,
    "stream_idle_timeout": 1.5,
    "backoff": {"initial": 0.5 / 40, "cap": 8 / 40},
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_silent_primary_with_the_default_knobs_scaled_is_left_for_the_fallback(
    fault_server, stream
):
    fault_server.script({"models": {"silent": [SILENT] * 5, "fast": [FAST]}})
    policy = _silent_policy(fault_server, **SCALED_DEFAULTS)
    text, took = _turn(policy, use_async=False, stream=stream)
    assert text == "fallback answer"
    assert took < 3.0 + SLACK


# -- a slow first token is the primary's answer --


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_stream_whose_first_token_comes_late_is_answered_by_the_primary(fault_server, use_async):
    """The primary's stream starts at once (its role chunk, as OpenAI's does) and its first
    token comes after 1.5 s (a reasoning model thinking), past ``attempt_timeout`` (1 s)
    but inside the idle bound (2 s) and the deadline (4 s): the primary answers. On main
    the stream was cut at attempt_timeout until its first token, so the fallback did."""
    slow = {"kind": "stream", "chunks": ["", "slow answer"], "interval": 1.5}
    fault_server.script({"models": {"silent": [slow], "fast": [FAST]}})
    policy = _silent_policy(fault_server, attempt_timeout=1, deadline=4, stream_idle_timeout=2)
    text, took = _turn(policy, use_async=use_async, stream=True)
    assert text == "slow answer"
    assert fault_server.count("fast") == 0
    assert fault_server.count("silent") == 1
    assert 1.5 <= took < 1.5 + SLACK


def test_with_the_default_knobs_a_first_event_after_20_s_is_still_the_primarys(fault_server):
    """Scaled 40 times: the primary says nothing for 20 s (0.5 s), then streams. The
    default first-event bound (30 s: 0.75 s) leaves it room, so it answers (a guard on
    the default: a tighter one would send slow-to-start providers to the fallback)."""
    late = {"kind": "answer", "text": "primary answer", "delay": 20 / 40}
    fault_server.script({"models": {"silent": [late], "fast": [FAST]}})
    policy = _silent_policy(fault_server, **SCALED_DEFAULTS)
    text, _ = _turn(policy, use_async=False, stream=True)
    assert text == "primary answer"
    assert fault_server.count("fast") == 0


# -- a stream that opens and says nothing: its time is the chain's until it commits --


def _stream_text(policy: Any, api: str, use_async: bool) -> tuple[str, float]:
    """One streamed turn on `api` ("chat" or "responses"): its text and how long it took."""

    async def agoes() -> str:
        async with AsyncFallgate(policy) as gate:
            if api == "chat":
                return await achat_text(gate, MESSAGES, stream=True)
            events = await gate.responses.create(input="hi", stream=True)
            return "".join([e.delta async for e in events if e.type.endswith("text.delta")])

    t0 = time.monotonic()
    if use_async:
        text = asyncio.run(agoes())
    else:
        with Fallgate(policy) as gate:
            if api == "chat":
                text = chat_text(gate, MESSAGES, stream=True)
            else:
                events = gate.responses.create(input="hi", stream=True)
                text = "".join(e.delta for e in events if e.type.endswith("text.delta"))
    return text, time.monotonic() - t0


APIS = pytest.mark.parametrize(
    ("api", "use_async"),
    [("chat", False), ("chat", True), ("responses", False), ("responses", True)],
    ids=["chat", "chat-async", "responses", "responses-async"],
)


@APIS
def test_a_stream_that_opens_and_then_says_nothing_leaves_the_fallback_its_attempt(
    fault_server, api, use_async
):
    """The primary's stream opens at once (a role chunk; Responses' created and item
    events) and then says nothing, with an idle bound (5 s) past the deadline (4 s): it
    is cut where the fallback's reserve begins (4 - 1 = 3 s), and the fallback answers.
    It used to be held to the idle bound, capped only by the deadline: the turn failed at
    4 s without asking the fallback."""
    opens = {"kind": "stream", "chunks": [""], "then": "hang", "seconds": 30}
    fault_server.script({"models": {"silent": [opens] * 3, "fast": [FAST] * 3}})
    policy = _silent_policy(fault_server, attempt_timeout=1, deadline=4, stream_idle_timeout=5)
    text, took = _stream_text(policy, api, use_async)
    assert text == "fallback answer"
    assert fault_server.count("silent") == 1 and fault_server.count("fast") == 1
    assert 2.9 <= took < 3.0 + SLACK, took


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_under_the_http_client_too_a_stream_that_opens_and_says_nothing_is_left(fault_server, api):
    """The same primary under `fallgate.http_client` (what agent frameworks embed): cut
    where the fallback's reserve begins, and the caller's stream is the fallback's."""
    import openai

    from fallgate import http_client

    opens = {"kind": "stream", "chunks": [""], "then": "hang", "seconds": 30}
    fault_server.script({"models": {"silent": [opens] * 3, "fast": [FAST] * 3}})
    policy = _silent_policy(fault_server, attempt_timeout=1, deadline=4, stream_idle_timeout=5)
    t0 = time.monotonic()
    with openai.OpenAI(api_key="unused", http_client=http_client(policy), max_retries=0) as sdk:
        if api == "chat":
            chunks = sdk.chat.completions.create(model="silent", messages=MESSAGES, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            events = sdk.responses.create(model="silent", input="hi", stream=True)
            text = "".join(e.delta for e in events if e.type.endswith("text.delta"))
    took = time.monotonic() - t0
    assert text == "fallback answer"
    assert 2.9 <= took < 3.0 + SLACK, took


def _chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "silent",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


@pytest.mark.parametrize("via", ["wrapper", "http_client"])
def test_a_model_that_streams_its_reasoning_past_the_hold_is_the_primarys(fault_server, via):
    """Reasoning deltas for 3.5 s before the first content (the hold is at 3 s): the
    stream is working, not silent, so it is not cut for the fallback's reserve, under the
    wrapper and `fallgate.http_client` alike."""
    import openai

    from fallgate import http_client

    thinking = [_chat_chunk({"reasoning_content": f"step {i} "}) for i in range(14)]
    events = [_chat_chunk({"role": "assistant", "content": ""}), *thinking]
    events += [_chat_chunk({"content": "primary answer"}), _chat_chunk({}, "stop")]
    thinks = {"kind": "sse", "events": events, "interval": 0.25}
    fault_server.script({"models": {"silent": [thinks], "fast": [FAST]}})
    policy = _silent_policy(
        fault_server,
        deadline=4,
        attempt_timeout=1,
        first_event_timeout=0.5,
        stream_idle_timeout=1,
        max_attempts=1,
    )
    if via == "wrapper":
        text, _ = _turn(policy, use_async=False, stream=True)
    else:
        with openai.OpenAI(api_key="u", http_client=http_client(policy), max_retries=0) as sdk:
            chunks = sdk.chat.completions.create(model="silent", messages=MESSAGES, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "primary answer"
    assert fault_server.count("fast") == 0


def test_the_hold_keeps_no_time_for_a_fallback_that_cannot_be_tried(fault_server):
    """The only fallback is benched (its key refused): nothing to keep time for, so the
    primary's late first token (3.5 s, past where the hold would be) is its answer."""
    fault_server.script(
        {"models": {"silent": [{"kind": "drop"}], "fast": [{"kind": "status", "status": 401}]}}
    )
    policy = _silent_policy(
        fault_server,
        deadline=5,
        attempt_timeout=1,
        first_event_timeout=1,
        stream_idle_timeout=4,
        reserve=2.0,
        max_attempts=1,
        recover_transport=False,
    )
    late = [_chat_chunk({"role": "assistant", "content": ""}), _chat_chunk({"content": "late"})]
    with Fallgate(policy) as gate:
        with pytest.raises(TurnFailed):
            gate.chat.completions.create(messages=MESSAGES)  # benches the fallback's key
        fault_server.script(
            {
                "models": {
                    "silent": [
                        {"kind": "sse", "events": [*late, _chat_chunk({}, "stop")], "interval": 3.5}
                    ]
                }
            }
        )
        text = chat_text(gate, MESSAGES, stream=True)
    assert text == "late"


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_an_empty_first_delta_does_not_commit_a_responses_stream(fault_server, use_async):
    """An empty ``response.output_text.delta`` at once, the text 2 s later: nothing was
    delivered, so the stream is not committed and the deadline (1.2 s) still holds it;
    the fallback answers. It used to commit at the empty delta: the turn ran to 2.3 s."""
    slow = {"kind": "stream", "chunks": ["", "slow answer"], "interval": 2.0}
    fault_server.script({"models": {"silent": [slow] * 3, "fast": [FAST] * 3}})
    policy = _silent_policy(fault_server, attempt_timeout=1, deadline=1.2, stream_idle_timeout=5)
    text, took = _stream_text(policy, "responses", use_async)
    assert text == "fallback answer"
    assert took < 1.2 + SLACK, took


# -- a committed stream that stalls --


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_committed_stream_that_stalls_ends_at_the_idle_bound_with_its_partial_text(
    fault_server, use_async
):
    """Content, then silence: the caller gets a clear error carrying the text so far, at
    ``stream_idle_timeout`` (1.5 s), not at ``attempt_timeout`` (0.5 s: on main the SDK's
    own read timeout, set to attempt_timeout, cut it there)."""
    stall = {"kind": "stream", "chunks": 2, "then": "hang", "seconds": 8}
    fault_server.script({"models": {"silent": [stall], "fast": [FAST]}})
    policy = _silent_policy(fault_server, attempt_timeout=0.5, deadline=5, stream_idle_timeout=1.5)
    got: list[str] = []

    async def ago() -> None:
        async with AsyncFallgate(policy) as gate:
            s = await gate.chat.completions.create(messages=MESSAGES, stream=True)
            async with s:
                async for c in s:
                    got.append(c.choices[0].delta.content or "" if c.choices else "")

    t0 = time.monotonic()
    with pytest.raises(TurnFailed) as err:
        if use_async:
            asyncio.run(ago())
        else:
            with Fallgate(policy) as gate:
                with gate.chat.completions.create(messages=MESSAGES, stream=True) as s:
                    for c in s:
                        got.append(c.choices[0].delta.content or "" if c.choices else "")
    took = time.monotonic() - t0
    assert "".join(got) == err.value.partial == "chunk-1 chunk-2 "
    assert err.value.last_outcome.kind == "stream_interrupted"
    assert "stream idle for 1.5 s (stream_idle_timeout)" in err.value.last_outcome.detail
    assert fault_server.count("fast") == 0, "a committed stream is never replayed"
    assert 1.5 <= took < 1.5 + SLACK


# -- a primary down for a while, then healthy --


def test_a_primary_down_for_a_while_is_probed_one_turn_at_a_time_and_serves_again(
    fault_server: FaultServer, caplog: pytest.LogCaptureFixture
) -> None:
    """20 turns. One turn alone finds the primary silent (the fallback answers, the
    primary's breaker opens: on a starved machine the first turn's time can run out before
    its request reached the network, which counts against no one, so up to 3 turns alone
    until the breaker is open); then 16 turns from 4 threads at once while it stays silent:
    the fallback answers them, and the primary sees one probe at a time (never two
    requests in flight); then it is healthy again, and the last 3 turns are its own.
    Every turn ends inside its deadline."""
    fault_server.script({"models": {"silent": [SILENT] * 99, "fast": [FAST] * 99}})
    policy = _silent_policy(
        fault_server,
        attempt_timeout=0.3,
        deadline=0.9,  # without the reserve, three 0.3 s attempts on the primary spend it all
        breaker={"allowed_failures": 0, "window": 10},
        cooldown={"initial": 0.2, "cap": 0.2},
    )
    answers: list[str] = []
    slow: list[float] = []

    def one(gate: Fallgate) -> None:
        t0 = time.monotonic()
        reply = gate.chat.completions.create(messages=MESSAGES)
        took = time.monotonic() - t0
        if took > 0.9 + SLACK:
            slow.append(took)
        answers.append(str(reply.choices[0].message.content))

    def worker(gate: Fallgate) -> None:
        for _ in range(4):
            one(gate)
            time.sleep(0.2)

    def breaker_opened() -> bool:
        return any("breaker is open" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.WARNING, logger="fallgate"), Fallgate(policy) as gate:
        while not breaker_opened() and len(answers) < 3:
            one(gate)
        alone = len(answers)
        assert breaker_opened(), "the silent primary's breaker never opened"
        assert answers == ["fallback answer"] * alone
        opened = time.monotonic()
        threads = [threading.Thread(target=worker, args=(gate,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        probes = sorted(
            r.time
            for r in fault_server.requests
            if r.body.get("model") == "silent" and r.time > opened
        )
        healthy = {"kind": "answer", "text": "primary answer"}
        fault_server.script({"models": {"silent": [healthy] * 9, "fast": [FAST] * 9}})
        for _ in range(3):
            time.sleep(0.25)  # past the breaker's 0.2 s span: the first turn probes
            one(gate)
    assert len(answers) == alone + 19, answers
    assert not slow, f"turns past their 0.9 s deadline: {slow}"
    assert answers[: alone + 16] == ["fallback answer"] * (alone + 16), answers
    assert answers[alone + 16 :] == ["primary answer"] * 3, answers
    assert probes, "the primary was never probed while the fallback served"
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    # a silent probe runs its 0.3 s bound before the next may go out
    assert all(g >= 0.25 for g in gaps), f"probes in flight at once: {gaps}"


# -- an answer that just stops, to a non-streaming caller --


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_an_unfinished_answer_is_never_a_complete_one(fault_server, use_async):
    """A proxy that gathers an upstream stream for a non-streaming caller, and the stream
    stopped after some content (no ``[DONE]``, no ``finish_reason``, no error event):
    the completion it sends has the text so far and ``finish_reason: null``. On main it
    was returned as the answer; it is a malformed reply, and the fallback answers."""
    unfinished = {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "silent",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "half an ans"},
                "finish_reason": None,
            }
        ],
    }
    step = {"kind": "status", "status": 200, "body": unfinished}
    fault_server.script({"models": {"silent": [step] * 5, "fast": [FAST]}})
    policy = _silent_policy(fault_server, attempt_timeout=1, deadline=4)
    text, _ = _turn(policy, use_async=use_async, stream=False)
    assert text == "fallback answer"


def test_an_event_stream_sent_to_a_non_streaming_caller_is_never_an_answer(fault_server):
    """The same stream sent raw (``text/event-stream``) to a non-streaming request: the
    SDK hands back its text; fallgate refuses it (kept: this held on main too)."""
    chunk = (
        '{"id":"c1","object":"chat.completion.chunk","created":1,"model":"silent",'
        '"choices":[{"index":0,"delta":{"role":"assistant","content":"half an ans"},'
        '"finish_reason":null}]}'
    )
    raw = {
        "kind": "status",
        "status": 200,
        "body": f"data: {chunk}\n\n",
        "content_type": "text/event-stream",
    }
    fault_server.script({"models": {"silent": [raw] * 5, "fast": [FAST]}})
    policy = _silent_policy(fault_server, attempt_timeout=1, deadline=4)
    text, _ = _turn(policy, use_async=False, stream=False)
    assert text == "fallback answer"


# -- the deadline is hard: a slow client build does not push it out ----------------------------


@pytest.mark.parametrize(
    ("use_async", "stream"),
    [(False, False), (True, False), (False, True), (True, True)],
    ids=["sync", "async", "sync-stream", "async-stream"],
)
def test_the_time_a_client_takes_to_build_counts_to_the_deadline(fault_server, use_async, stream):
    """A client factory that takes 1 s (a cold TLS trust store, a slow credential
    helper), a silent primary, attempt_timeout = deadline = 2 s: the turn ends at its
    deadline, not 1 s past it (on main the attempt's bound started after the build)."""
    from fallgate.providers.openai.http.pools import async_openai_factory, openai_factory

    fault_server.script({"models": {"silent": [SILENT] * 5}})
    build = async_openai_factory(2.0) if use_async else openai_factory(2.0)

    def slow_build(target: Any, key: str) -> Any:
        time.sleep(1.0)
        return build(target, key)

    policy = chain("silent", server=fault_server, attempt_timeout=2, deadline=2)
    t0 = time.monotonic()
    with pytest.raises(TurnFailed):
        if use_async:

            async def go() -> None:
                async with AsyncFallgate(policy, client_factory=slow_build) as gate:
                    if stream:
                        s = await gate.chat.completions.create(messages=MESSAGES, stream=True)
                        async with s:
                            async for _ in s:
                                pass
                    else:
                        await gate.chat.completions.create(messages=MESSAGES)

            asyncio.run(go())
        else:
            with Fallgate(policy, client_factory=slow_build) as gate:
                if stream:
                    with gate.chat.completions.create(messages=MESSAGES, stream=True) as s:
                        for _ in s:
                            pass
                else:
                    gate.chat.completions.create(messages=MESSAGES)
    took = time.monotonic() - t0
    assert took < 2.0 + SLACK, f"a 2 s deadline held the turn {took:.2f} s"


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_rebuilding_and_closing_clients_takes_no_time_to_speak_of(fault_server, use_async):
    """Transport recovery rebuilds a target's clients (three keys here) and closes the
    old ones, whose connection a silent server still holds open; closing the gate closes
    the rest. Each takes milliseconds, not a slice of the deadline (50 ms allowed)."""
    fault_server.script({"models": {"silent": [SILENT] * 9}})
    policy = chain("silent", keys=3, server=fault_server, attempt_timeout=0.3, deadline=0.6)
    took: dict[str, float] = {}

    async def ago() -> None:
        gate = AsyncFallgate(policy)
        with pytest.raises(TurnFailed):
            await gate.chat.completions.create(messages=MESSAGES)
        t0 = time.monotonic()
        await gate.rebuild("primary")
        took["rebuild"] = time.monotonic() - t0
        t0 = time.monotonic()
        await gate.aclose()
        took["close"] = time.monotonic() - t0

    if use_async:
        asyncio.run(ago())
    else:
        gate = Fallgate(policy)
        with pytest.raises(TurnFailed):
            gate.chat.completions.create(messages=MESSAGES)
        t0 = time.monotonic()
        gate.rebuild("primary")
        took["rebuild"] = time.monotonic() - t0
        t0 = time.monotonic()
        gate.close()
        took["close"] = time.monotonic() - t0
    assert took["rebuild"] < 0.05 and took["close"] < 0.05, took
