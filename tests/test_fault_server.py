"""The fault server, seen through the real `openai` SDK over real loopback HTTP.

Each scripted step kind must produce exactly what a client of a real provider
would see; scripts are validated with errors that point at the bad field.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fallgate.providers.openai.http import transport
from fallgate.providers.testing.fault_server import (
    FaultServer,
    RequestRecord,
    Script,
    ScriptError,
    Step,
    load_script,
    parse_script,
    serve_main,
)
from openai.types.chat import ChatCompletion, ChatCompletionChunk

MESSAGES: list[Any] = [{"role": "user", "content": "say something"}]


@pytest.fixture
def srv() -> Iterator[FaultServer]:
    with FaultServer() as server:
        yield server
        assert server.errors == [], "the server itself must never fail"


# The SDK's own default HTTP client, sharing one TLS context: building a context per
# client costs ~0.1 s, and everything here is plain HTTP on loopback anyway.
TLS = ssl.create_default_context()


# What iterating a broken stream raises: recent openai 3.x releases wrap the HTTP library's
# error in their own (APIConnectionError / APITimeoutError, with it as the cause), as for
# a request that fails before the reply; openai 2.x and early 3.x let it through.
STREAM_CUT = (openai.APIConnectionError, transport.http.RemoteProtocolError)
STREAM_TIMEOUT = (openai.APITimeoutError, transport.http.ReadTimeout)


def library_error(e: BaseException) -> BaseException:
    """The HTTP library's own error behind what the SDK raised."""
    return e.__cause__ if isinstance(e, openai.APIConnectionError) and e.__cause__ else e


def client(srv: FaultServer, timeout: float = 5.0, key: str = "sk-test") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=srv.base_url,
        api_key=key,
        max_retries=0,
        timeout=timeout,
        http_client=openai.DefaultHttpxClient(verify=TLS),
    )


def async_client(srv: FaultServer, timeout: float = 5.0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=srv.base_url,
        api_key="sk-test",
        max_retries=0,
        timeout=timeout,
        http_client=openai.DefaultAsyncHttpxClient(verify=TLS),
    )


def ask(srv: FaultServer, model: str, timeout: float = 5.0, key: str = "sk-test") -> ChatCompletion:
    with client(srv, timeout, key) as c:
        return c.chat.completions.create(model=model, messages=MESSAGES)


def stream_into(srv: FaultServer, model: str, got: list[str], timeout: float = 5.0) -> None:
    """Consume a stream, appending each chunk's text to `got` as it arrives."""
    with client(srv, timeout) as c:
        for chunk in c.chat.completions.create(model=model, messages=MESSAGES, stream=True):
            assert isinstance(chunk, ChatCompletionChunk)
            if chunk.choices and chunk.choices[0].delta.content is not None:
                got.append(chunk.choices[0].delta.content)


def one(model: str, **step: Any) -> dict[str, Any]:
    return {"models": {model: [step]}}


# --------------------------------------------------------------------------- answers


def test_an_answer_is_parsed_by_the_sdk_into_its_own_chat_completion(srv: FaultServer) -> None:
    srv.script(one("glm-4.7", kind="answer", text="hello from 4.7"))
    reply = ask(srv, "glm-4.7")
    assert isinstance(reply, ChatCompletion)
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.model == "glm-4.7"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "hello from 4.7"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 3


def test_an_answer_can_report_another_finish_reason(srv: FaultServer) -> None:
    srv.script(one("m", kind="answer", text="no", finish_reason="content_filter"))
    assert ask(srv, "m").choices[0].finish_reason == "content_filter"


def test_an_answer_with_a_delay_arrives_after_the_delay(srv: FaultServer) -> None:
    srv.script(one("slow", kind="answer", text="late", delay=0.25))
    started = time.monotonic()
    assert ask(srv, "slow").choices[0].message.content == "late"
    assert time.monotonic() - started >= 0.25


def test_a_delay_longer_than_the_client_timeout_is_a_timeout(srv: FaultServer) -> None:
    srv.script(one("slow", kind="answer", text="too late", delay=2))
    with pytest.raises(openai.APITimeoutError):
        ask(srv, "slow", timeout=0.3)


def test_unscripted_models_get_the_default_answer(srv: FaultServer) -> None:
    assert ask(srv, "anything").choices[0].message.content == "ok"
    assert srv.count("anything") == 1


def test_the_models_endpoint_lists_the_scripted_models(srv: FaultServer) -> None:
    srv.script({"models": {"glm-5.1": [], "glm-4.7": []}})
    with client(srv) as c:
        assert sorted(m.id for m in c.models.list()) == ["glm-4.7", "glm-5.1"]
        assert c.models.retrieve("glm-5.1").id == "glm-5.1"


# --------------------------------------------------------------------------- statuses


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, openai.BadRequestError),
        (401, openai.AuthenticationError),
        (402, openai.APIStatusError),
        (403, openai.PermissionDeniedError),
        (404, openai.NotFoundError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
        (503, openai.InternalServerError),
        (529, openai.InternalServerError),
    ],
)
def test_a_status_step_raises_the_sdk_error_class_for_that_status(
    srv: FaultServer, status: int, error_class: type[openai.APIStatusError]
) -> None:
    srv.script(one("m", kind="status", status=status))
    with pytest.raises(error_class) as caught:
        ask(srv, "m")
    assert caught.value.status_code == status
    assert f"scripted HTTP {status}" in caught.value.message


def test_a_rate_limit_carries_its_headers_and_error_body_to_the_sdk(srv: FaultServer) -> None:
    body = {"error": {"message": "rate limited", "type": "rate_limit_exceeded", "code": "x"}}
    srv.script(one("glm-5.1", kind="status", status=429, headers={"retry-after": 20}, body=body))
    with pytest.raises(openai.RateLimitError) as caught:
        ask(srv, "glm-5.1")
    err = caught.value
    assert err.response.headers["retry-after"] == "20"
    assert err.body == body["error"]
    assert err.code == "x"
    assert "rate limited" in err.message


def test_an_html_502_page_is_sent_as_is(srv: FaultServer) -> None:
    page = "<html><body><h1>502 Bad Gateway</h1></body></html>"
    srv.script(one("m", kind="status", status=502, body=page, content_type="text/html"))
    with pytest.raises(openai.InternalServerError) as caught:
        ask(srv, "m")
    assert caught.value.response.headers["content-type"] == "text/html"
    assert caught.value.response.text == page


# --------------------------------------------------------------------------- transport faults


def test_a_timeout_step_makes_the_sdk_time_out(srv: FaultServer) -> None:
    srv.script({"models": {"glm-5.1": [{"kind": "timeout"}, {"kind": "hang", "seconds": 5}]}})
    for _ in range(2):
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            ask(srv, "glm-5.1", timeout=0.3)
        assert time.monotonic() - started < 2
    assert srv.count("glm-5.1") == 2


def test_a_hang_shorter_than_the_client_timeout_ends_in_a_closed_connection(
    srv: FaultServer,
) -> None:
    srv.script(one("m", kind="hang", seconds=0.1))
    with pytest.raises(openai.APIConnectionError) as caught:
        ask(srv, "m", timeout=3)
    assert not isinstance(caught.value, openai.APITimeoutError)


def test_stopping_the_server_releases_a_hanging_request_promptly() -> None:
    """A 30 s hang must not hold up shutdown; the client then sees a closed connection."""
    errors: list[BaseException] = []
    server = FaultServer(one("m", kind="timeout")).start()

    def call() -> None:
        try:
            ask(server, "m", timeout=10)
        except BaseException as e:
            errors.append(e)

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 5
    while server.count("m") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 1
    caller.join(5)
    assert not caller.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], openai.APIConnectionError)


def test_a_dropped_connection_is_a_connection_error(srv: FaultServer) -> None:
    srv.script(one("m", kind="drop"))
    with pytest.raises(openai.APIConnectionError) as caught:
        ask(srv, "m")
    assert not isinstance(caught.value, openai.APITimeoutError)


def test_a_connection_dropped_mid_body_is_a_connection_error(srv: FaultServer) -> None:
    srv.script(one("m", kind="drop_mid_body"))
    with pytest.raises(openai.APIConnectionError):
        ask(srv, "m")


def test_invalid_json_with_200_reaches_the_sdk_as_a_decode_error(srv: FaultServer) -> None:
    # The SDK lets json.JSONDecodeError (a ValueError) escape; classifiers must expect it.
    srv.script(one("m", kind="invalid_json", body="{not json"))
    with pytest.raises(ValueError, match="Expecting"):
        ask(srv, "m")


def test_an_empty_200_reaches_the_sdk_as_a_decode_error(srv: FaultServer) -> None:
    srv.script(one("m", kind="empty"))
    with pytest.raises(ValueError, match="Expecting value"):
        ask(srv, "m")


def test_a_fault_does_not_poison_the_next_request_on_the_same_client(srv: FaultServer) -> None:
    srv.script(
        {
            "models": {
                "m": [
                    {"kind": "drop"},
                    {"kind": "drop_mid_body"},
                    {"kind": "stream", "chunks": 1, "then": "cut"},
                ]
            }
        }
    )
    with client(srv) as c:
        for stream in (False, False, True):
            with pytest.raises(STREAM_CUT if stream else openai.APIConnectionError) as caught:
                reply = c.chat.completions.create(model="m", messages=MESSAGES, stream=stream)
                for _ in reply:
                    pass
            if stream:
                assert isinstance(library_error(caught.value), transport.http.RemoteProtocolError)
        assert c.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content
    assert srv.count("m") == 4


# --------------------------------------------------------------------------- streams


def test_a_stream_that_ends_in_an_error_event_yields_n_chunks_then_raises(
    srv: FaultServer,
) -> None:
    srv.script(one("m", kind="stream", chunks=3, then="error", error={"message": "boom"}))
    got: list[str] = []
    with pytest.raises(openai.APIError, match="boom"):
        stream_into(srv, "m", got)
    assert got == ["chunk-1 ", "chunk-2 ", "chunk-3 "]


def test_an_error_event_before_any_chunk_raises_before_anything_is_yielded(
    srv: FaultServer,
) -> None:
    srv.script(one("m", kind="stream", chunks=0, then="error"))
    got: list[str] = []
    with pytest.raises(openai.APIError, match="scripted stream error"):
        stream_into(srv, "m", got)
    assert got == []


def test_a_cut_stream_yields_n_chunks_then_a_connection_error(srv: FaultServer) -> None:
    srv.script(one("m", kind="stream", chunks=["Hel", "lo"], then="cut"))
    got: list[str] = []
    with pytest.raises(STREAM_CUT) as caught:
        stream_into(srv, "m", got)
    assert isinstance(library_error(caught.value), transport.http.RemoteProtocolError)
    assert got == ["Hel", "lo"]


def test_a_stream_that_stalls_yields_its_chunks_then_times_out(srv: FaultServer) -> None:
    srv.script(one("m", kind="stream", chunks=2, then="hang", seconds=5))
    got: list[str] = []
    started = time.monotonic()
    with pytest.raises(STREAM_TIMEOUT) as caught:
        stream_into(srv, "m", got, timeout=0.3)
    assert isinstance(library_error(caught.value), transport.http.ReadTimeout)
    assert got == ["chunk-1 ", "chunk-2 "]
    assert time.monotonic() - started < 2


def test_a_complete_stream_ends_with_a_finish_chunk_and_done(srv: FaultServer) -> None:
    srv.script(one("m", kind="stream", chunks=2))
    with client(srv) as c:
        chunks = list(c.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert [ch.choices[0].delta.content for ch in chunks] == ["chunk-1 ", "chunk-2 ", None]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [ch.choices[0].finish_reason for ch in chunks] == [None, None, "stop"]
    assert len({ch.id for ch in chunks}) == 1


def test_an_answer_to_a_stream_request_is_streamed_word_by_word(srv: FaultServer) -> None:
    srv.script(one("m", kind="answer", text="hello from the fault server"))
    got: list[str] = []
    stream_into(srv, "m", got)
    assert got == ["hello ", "from ", "the ", "fault ", "server"]


def test_an_answer_can_be_streamed_in_a_given_number_of_chunks(srv: FaultServer) -> None:
    srv.script(one("m", kind="answer", text="abcdefg", chunks=3, interval=0.01))
    got: list[str] = []
    stream_into(srv, "m", got)
    assert got == ["abc", "de", "fg"]


def test_usage_is_streamed_when_the_client_asks_for_it(srv: FaultServer) -> None:
    srv.script(one("m", kind="answer", text="one two"))
    with client(srv) as c:
        chunks = list(
            c.chat.completions.create(
                model="m",
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2


def test_a_stream_step_refuses_a_non_stream_request_loudly(srv: FaultServer) -> None:
    srv.script(one("m", kind="stream", chunks=2))
    with pytest.raises(openai.BadRequestError, match="stream step"):
        ask(srv, "m")


def test_an_sse_step_sends_its_events_as_they_are(srv: FaultServer) -> None:
    """Chunks no well-behaved server sends (an empty choice with finish_reason "error"),
    for testing how a client copes: each event reaches the SDK unchanged."""
    odd = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
           "choices": [{"index": 0, "delta": {}, "finish_reason": "error",
                        "error": {"code": 502, "message": "upstream"}}]}  # fmt: skip
    srv.script(one("m", kind="sse", events=[odd]))
    with client(srv) as c:
        got = list(c.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert [ch.choices[0].finish_reason for ch in got] == ["error"]
    assert got[0].choices[0].error == {"code": 502, "message": "upstream"}  # type: ignore[attr-defined]


def test_an_sse_step_refuses_a_non_stream_request_loudly(srv: FaultServer) -> None:
    srv.script(one("m", kind="sse", events=["{}"]))
    with pytest.raises(openai.BadRequestError, match="sse step"):
        ask(srv, "m")


def test_a_200_with_any_body_is_a_status_step(srv: FaultServer) -> None:
    srv.script(one("m", kind="status", status=200, body={"choices": []}))
    with client(srv) as c:
        assert c.chat.completions.create(model="m", messages=MESSAGES).choices == []


# --------------------------------------------------------------------------- the wire


def raw_post(srv: FaultServer, body: dict[str, Any]) -> tuple[http.client.HTTPResponse, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        conn.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"Authorization": "Bearer k"}
        )
        response = conn.getresponse()
        return response, response.read()
    finally:
        conn.close()


def test_replies_are_http_1_1_with_content_length_and_streams_are_chunked(
    srv: FaultServer,
) -> None:
    srv.script({"models": {"m": [{"kind": "answer"}, {"kind": "stream", "chunks": 1}]}})
    plain, data = raw_post(srv, {"model": "m", "messages": MESSAGES})
    assert plain.version == 11
    assert plain.getheader("Content-Length") == str(len(data))
    assert json.loads(data)["object"] == "chat.completion"
    streamed, data = raw_post(srv, {"model": "m", "messages": MESSAGES, "stream": True})
    assert streamed.getheader("Transfer-Encoding") == "chunked"
    assert streamed.getheader("Content-Type", "").startswith("text/event-stream")
    events = [e for e in data.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0].removeprefix("data: "))["object"] == "chat.completion.chunk"


def test_a_keep_alive_connection_serves_many_requests(srv: FaultServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        for _ in range(3):
            conn.request("POST", "/v1/chat/completions", json.dumps({"model": "m"}))
            response = conn.getresponse()
            assert response.status == 200 and response.getheader("Connection") is None
            response.read()
        assert conn.sock is not None  # the same socket stayed open all along
    finally:
        conn.close()
    assert srv.count("m") == 3


def test_requests_the_server_cannot_understand_get_a_400_and_are_not_counted(
    srv: FaultServer,
) -> None:
    for body in (b"not json", b"[1, 2]", b'{"messages": []}'):
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        try:
            conn.request("POST", "/v1/chat/completions", body)
            response = conn.getresponse()
            assert response.status == 400
            assert "message" in json.loads(response.read())["error"]
        finally:
            conn.close()
    assert srv.counts == {}


# --------------------------------------------------------------------------- script semantics


def test_steps_are_taken_in_order_per_model_then_the_default_repeats(srv: FaultServer) -> None:
    srv.script(
        {
            "default": {"kind": "answer", "text": "fallback text"},
            "models": {
                "glm-5.1": [
                    {"kind": "status", "status": 503},
                    {"kind": "answer", "text": "second"},
                ],
                "glm-4.7": [{"kind": "answer", "text": "hello from 4.7"}],
            },
        }
    )
    with pytest.raises(openai.InternalServerError):
        ask(srv, "glm-5.1")
    assert ask(srv, "glm-4.7").choices[0].message.content == "hello from 4.7"
    assert ask(srv, "glm-5.1").choices[0].message.content == "second"
    assert ask(srv, "glm-5.1").choices[0].message.content == "fallback text"
    assert ask(srv, "glm-4.7").choices[0].message.content == "fallback text"
    assert srv.counts == {"glm-5.1": 3, "glm-4.7": 2}
    assert srv.count("glm-5.1") == 3 and srv.count("never-asked") == 0
    assert [(r.model, r.kind, r.step) for r in srv.requests] == [
        ("glm-5.1", "status", 0),
        ("glm-4.7", "answer", 0),
        ("glm-5.1", "answer", 1),
        ("glm-5.1", "answer", None),
        ("glm-4.7", "answer", None),
    ]


def test_a_new_script_restarts_the_steps_and_resets_the_counts(srv: FaultServer) -> None:
    srv.script(one("m", kind="status", status=500))
    with pytest.raises(openai.InternalServerError):
        ask(srv, "m")
    srv.script(one("m", kind="status", status=500))
    assert srv.counts == {} and srv.requests == []
    with pytest.raises(openai.InternalServerError):
        ask(srv, "m")
    assert srv.count("m") == 1


def test_requests_record_the_key_used_without_showing_it(srv: FaultServer) -> None:
    ask(srv, "m", key="sk-first-key-123456")
    with client(srv) as c:
        list(c.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    first, second = srv.requests
    assert isinstance(first, RequestRecord)
    assert (first.api_key, first.stream) == ("sk-first-key-123456", False)
    assert (second.api_key, second.stream) == ("sk-test", True)
    assert first.time <= second.time
    assert first.body["messages"] == MESSAGES
    shown = repr(srv.requests) + repr(srv)
    assert "sk-first" not in shown and "sk-test" not in shown


def test_the_server_binds_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultServer(host="0.0.0.0")


def test_no_thread_is_left_behind_after_the_server_stops() -> None:
    before = set(threading.enumerate())
    with FaultServer({"models": {"m": [{"kind": "hang", "seconds": 30}]}}) as server:
        with pytest.raises(openai.APITimeoutError):
            ask(server, "m", timeout=0.2)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/v1/models")  # leaves an idle keep-alive connection open
        conn.getresponse().read()
        assert set(threading.enumerate()) - before
    conn.close()
    assert set(threading.enumerate()) == before


def test_the_pytest_fixture_gives_a_running_server_with_an_empty_script(
    fault_server: FaultServer,
) -> None:
    assert fault_server.base_url.startswith("http://127.0.0.1:")
    assert fault_server.counts == {}
    fault_server.script(one("m", kind="answer", text="from the fixture"))
    assert ask(fault_server, "m").choices[0].message.content == "from the fixture"


# --------------------------------------------------------------------------- concurrency


async def test_fifty_concurrent_async_requests_each_get_their_scripted_reply(
    srv: FaultServer,
) -> None:
    srv.script(
        {
            "default": {"kind": "answer", "text": "default", "delay": 0.05},
            "models": {
                "busy": [{"kind": "status", "status": 429}] * 10,
                "flaky": [{"kind": "drop"}] * 5,
            },
        }
    )
    models = ["busy"] * 20 + ["flaky"] * 10 + ["calm"] * 20
    async with async_client(srv, timeout=10) as c:
        results = await asyncio.gather(
            *(c.chat.completions.create(model=m, messages=MESSAGES) for m in models),
            return_exceptions=True,
        )
    outcome: dict[str, dict[str, int]] = {}
    for model, result in zip(models, results, strict=True):
        name = type(result).__name__
        per_model = outcome.setdefault(model, {})
        per_model[name] = per_model.get(name, 0) + 1
        if isinstance(result, ChatCompletion):
            assert result.choices[0].message.content == "default"
    assert outcome == {
        "busy": {"RateLimitError": 10, "ChatCompletion": 10},
        "flaky": {"APIConnectionError": 5, "ChatCompletion": 5},
        "calm": {"ChatCompletion": 20},
    }
    assert srv.counts == {"busy": 20, "flaky": 10, "calm": 20}


async def test_async_streams_see_the_same_faults(srv: FaultServer) -> None:
    srv.script(one("m", kind="stream", chunks=2, then="error"))
    got: list[str] = []
    async with async_client(srv) as c:
        stream = await c.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        with pytest.raises(openai.APIError, match="scripted stream error"):
            async for chunk in stream:
                got.append(chunk.choices[0].delta.content or "")
    assert got == ["chunk-1 ", "chunk-2 "]


# --------------------------------------------------------------------------- bad scripts


@pytest.mark.parametrize(
    ("script", "path", "words"),
    [
        (one("glm-5.1", kind="explode"), 'models["glm-5.1"][0].kind', "unknown kind 'explode'"),
        ({"models": {"m": [{"text": "hi"}]}}, 'models["m"][0].kind', "missing"),
        (
            {"models": {"glm-5.1": [{"kind": "timeout"}, {"kind": "status"}]}},
            'models["glm-5.1"][1].status',
            "missing",
        ),
        (one("m", kind="status", status="429"), 'models["m"][0].status', "integer"),
        (one("m", kind="status", status=99), 'models["m"][0].status', "between 200 and 599"),
        (one("m", kind="answer", delay=-1), 'models["m"][0].delay', "seconds"),
        (one("m", kind="answer", delay=True), 'models["m"][0].delay', "seconds"),
        (one("m", kind="timeout", seconds=float("nan")), 'models["m"][0].seconds', "seconds"),
        (one("m", kind="answer", txt="hi"), 'models["m"][0].txt', "unknown field"),
        (one("m", kind="stream", then="explode"), 'models["m"][0].then', "done, error, cut"),
        (one("m", kind="stream", chunks=[1, 2]), 'models["m"][0].chunks', "list of strings"),
        (one("m", kind="status", status=429, headers=[1]), 'models["m"][0].headers', "table"),
        (one("m", kind="status", status=500, body=5), 'models["m"][0].body', "JSON object"),
        ({"models": {"m": {"kind": "drop"}}}, 'models["m"]', "list of steps"),
        ({"default": {"kind": "answr"}}, "default.kind", "unknown kind"),
        ({"modles": {}}, "modles", "unknown top-level key"),
        (one("m", kind="sse"), 'models["m"][0].events', "missing"),
        (one("m", kind="sse", events=[]), 'models["m"][0].events', "non-empty list"),
        (one("m", kind="sse", events=[5]), 'models["m"][0].events[0]', "JSON object or a string"),
        (one("m", kind="sse", events=["a\nb"]), 'models["m"][0].events[0]', "line breaks"),
        (one("m", kind="sse", events=["x"], done="yes"), 'models["m"][0].done', "true or false"),
    ],
)
def test_a_malformed_script_names_the_model_step_and_field(
    script: Any, path: str, words: str
) -> None:
    with pytest.raises(ScriptError) as caught:
        parse_script(script)
    message = str(caught.value)
    assert path in message
    assert words in message


def test_script_errors_expose_the_model_step_and_field_as_attributes() -> None:
    with pytest.raises(ScriptError) as caught:
        FaultServer({"models": {"glm-5.1": [{"kind": "timeout"}, {"kind": "status"}]}})
    err = caught.value
    assert (err.model, err.step, err.field) == ("glm-5.1", 1, "status")


def test_a_bad_new_script_leaves_the_running_script_in_place(srv: FaultServer) -> None:
    srv.script(one("m", kind="answer", text="still here"))
    with pytest.raises(ScriptError):
        srv.script(one("m", kind="nope"))
    assert ask(srv, "m").choices[0].message.content == "still here"


JSON_SCRIPT = """{
  "models": {
    "glm-5.1": [
      {"kind": "timeout"},
      {"kind": "status",
       "status": "soon"}
    ]
  }
}
"""

TOML_SCRIPT = """\
[default]
kind = "answer"
text = "ok"

[[models."glm-5.1"]]
kind = "timeout"

[[models."glm-5.1"]]
kind = "status"
status = 429
headers = { retry-after = "20" }

[[models."glm-4.7"]]
kind = "answer"
delay = "soon"
"""


def test_a_json_file_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(JSON_SCRIPT)
    with pytest.raises(ScriptError) as caught:
        load_script(path)
    assert str(caught.value).startswith(f"fault script {path}:6: ")
    assert 'models["glm-5.1"][1].status' in str(caught.value)


def test_a_toml_file_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "script.toml"
    path.write_text(TOML_SCRIPT)
    with pytest.raises(ScriptError) as caught:
        load_script(path)
    assert str(caught.value).startswith(f"fault script {path}:15: ")
    assert 'models["glm-4.7"][0].delay' in str(caught.value)


def test_a_valid_toml_file_loads_into_the_same_script_as_the_dict(tmp_path: Path) -> None:
    path = tmp_path / "script.toml"
    path.write_text(TOML_SCRIPT.replace('"soon"', "0.5"))
    script = load_script(path)
    assert isinstance(script, Script)
    assert script.default == Step(kind="answer", text="ok")
    assert [s.kind for s in script.models["glm-5.1"]] == ["timeout", "status"]
    assert script.models["glm-5.1"][1].headers == (("retry-after", "20"),)
    assert script.models["glm-4.7"][0].delay == 0.5


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("s.json", '{"models": {"m": [\n  {"kind": "drop"},\n]}}', ":3: invalid JSON"),
        ("s.toml", '[[models.m]]\nkind = "drop"\nkind = "empty"\n', ":3: invalid TOML"),
        ("s.toml", "", None),  # an empty TOML file is an empty script, not an error
    ],
)
def test_a_file_that_does_not_parse_names_the_file_and_line(
    tmp_path: Path, name: str, text: str, expected: str | None
) -> None:
    path = tmp_path / name
    path.write_text(text)
    if expected is None:
        assert load_script(path).models == {}
        return
    with pytest.raises(ScriptError, match=expected):
        load_script(path)


def test_a_missing_file_is_a_script_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match=r"nowhere\.toml: cannot read"):
        load_script(tmp_path / "nowhere.toml")


# --------------------------------------------------------------------------- serve_main


def test_serve_main_on_a_malformed_script_prints_one_line_and_returns_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(TOML_SCRIPT)
    assert serve_main(str(path)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert str(path) in err and "glm-4.7" in err and "delay" in err
    assert "Traceback" not in err


def test_serve_main_refuses_a_non_loopback_host(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve_main(None, host="0.0.0.0") == 2
    assert "loopback" in capsys.readouterr().err


def test_serve_main_serves_the_script_until_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(one("glm-4.7", kind="answer", text="served")))
    code = (
        "import sys; from fallgate.providers.testing.fault_server import serve_main; "
        "sys.exit(serve_main(sys.argv[1]))"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        summary = proc.stdout.readline()
        base_url = first.split()[-1]
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        assert "glm-4.7: answer 'served'" in summary
        with openai.OpenAI(base_url=base_url, api_key="sk-x", max_retries=0, timeout=5) as c:
            reply = c.chat.completions.create(model="glm-4.7", messages=MESSAGES)
        assert reply.choices[0].message.content == "served"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "glm-4.7 x1" in out
    assert err == ""


def test_every_step_field_has_one_value_parser():
    """`Step.parse` is table-driven: a field some kind accepts without a parser (or a
    parser no kind uses) is caught here, not by a KeyError on a user's script."""
    from fallgate.providers.testing.fault_server import script

    accepted = set().union(*script._FIELDS.values()) | {"delay"}
    assert accepted == set(script._FIELD_PARSERS)
    for kind, (field, _) in script._REQUIRED.items():
        assert field in script._FIELDS[kind], (kind, field)
