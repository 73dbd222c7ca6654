"""The fault server's other endpoints, through the real `openai` SDK over loopback HTTP.

``/v1/responses`` (plain and streamed, with the SDK's own stream accumulator),
``/v1/embeddings`` (the SDK asks for base64 by default and decodes it), every
fault kind on every endpoint, and the request headers each record keeps
without ever showing a key. Tool calls and error shapes: test_fault_server_tools.py.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fallgate.providers.openai.http import transport
from fallgate.providers.testing.fault_server import FaultServer, load_script
from fault_api_helpers import (
    KEY,
    RESPONSE_EVENTS,
    WEATHER,
    call,
    client,
    one,
    raw_post,
    sse,
)
from openai.types import CreateEmbeddingResponse
from openai.types.responses import Response


@pytest.fixture
def srv() -> Iterator[FaultServer]:
    with FaultServer() as server:
        yield server
        assert server.errors == [], "the server itself must never fail"


# --------------------------------------------------------------------------- /v1/responses


def test_a_response_answer_is_parsed_by_the_sdk_into_its_own_response(srv: FaultServer) -> None:
    srv.script(one("gpt-x", kind="answer", text="hello from responses"))
    with client(srv) as c:
        reply = c.responses.create(model="gpt-x", input="say hello please")
    assert isinstance(reply, Response)
    assert (reply.object, reply.status, reply.model) == ("response", "completed", "gpt-x")
    assert reply.output_text == "hello from responses"
    [message] = reply.output
    assert message.type == "message" and message.role == "assistant"
    assert [part.type for part in message.content] == ["output_text"]
    assert reply.usage is not None
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (3, 3)
    assert reply.usage.total_tokens == 6
    assert srv.requests[0].path == "/v1/responses"


def test_a_streamed_response_is_the_real_event_sequence_with_the_scripted_text(
    srv: FaultServer,
) -> None:
    srv.script(one("m", kind="answer", text="streamed from responses"))
    with client(srv) as c:
        events = list(c.responses.create(model="m", input="hi", stream=True))
    assert [e.type for e in events] == RESPONSE_EVENTS
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["streamed ", "from ", "responses"]
    done = events[-1]
    assert done.type == "response.completed" and done.response.status == "completed"
    assert done.response.output_text == "streamed from responses"
    assert done.response.usage is not None and done.response.usage.output_tokens == 3
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1


def test_the_sdk_stream_helper_accumulates_a_streamed_response(srv: FaultServer) -> None:
    srv.script(one("m", kind="answer", text="one two three four", chunks=3))
    with client(srv) as c, c.responses.stream(model="m", input="hi") as stream:
        snapshots = [e.snapshot for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert snapshots == ["one tw", "one two thre", "one two three four"]
    assert final.output_text == "one two three four"


def test_every_event_of_a_response_stream_is_named_by_its_type(srv: FaultServer) -> None:
    srv.script(one("m", kind="answer", text="a b c"))
    status, body = raw_post(srv, "/v1/responses", {"model": "m", "input": "x", "stream": True})
    events = sse(body)
    assert status == 200
    assert [name for name, _ in events] == RESPONSE_EVENTS
    assert all(data["type"] == name for name, data in events)
    added = events[2][1]["item"]
    assert (added["type"], added["status"], added["content"]) == ("message", "in_progress", [])


@pytest.mark.parametrize(
    ("shape", "message"), [("openai", "the backend fell over"), ("anthropic", "Overloaded")]
)
def test_a_response_stream_that_ends_in_an_error_event_raises_in_the_sdk(
    srv: FaultServer, shape: str, message: str
) -> None:
    error = {"message": "the backend fell over"} if shape == "openai" else None
    step = {"kind": "stream", "chunks": 2, "then": "error", "error_shape": shape}
    srv.script(one("m", **step, **({"error": error} if error else {})))
    deltas: list[str] = []
    with client(srv) as c, pytest.raises(openai.APIError, match=message):
        for event in c.responses.create(model="m", input="hi", stream=True):
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
    assert deltas == ["chunk-1 ", "chunk-2 "]


def test_a_response_error_event_carries_both_the_documented_and_the_live_fields(
    srv: FaultServer,
) -> None:
    error = {"message": "slow down", "type": "rate_limit_exceeded", "code": "rate_limited"}
    srv.script(one("m", kind="stream", chunks=1, then="error", error=error))
    _, body = raw_post(srv, "/v1/responses", {"model": "m", "input": "x", "stream": True})
    name, data = sse(body)[-1]
    assert name == "error" and data["type"] == "error"
    assert (data["code"], data["message"]) == ("rate_limited", "slow down")
    assert data["error"]["message"] == "slow down"
    assert data["sequence_number"] == len(sse(body)) - 1


@pytest.mark.parametrize(
    ("then", "raised", "underneath"),
    [
        ("cut", openai.APIConnectionError, "RemoteProtocolError"),
        ("hang", openai.APITimeoutError, "ReadTimeout"),
    ],
)
def test_a_response_stream_cut_or_stalled_yields_its_deltas_then_fails(
    srv: FaultServer, then: str, raised: type[Exception], underneath: str
) -> None:
    """openai 3.x wraps the HTTP library's error while a stream is read; 2.x lets the
    library's own error through: either way it is that error underneath."""
    srv.script(one("m", kind="stream", chunks=["Hel", "lo"], then=then, seconds=5))
    deltas: list[str] = []
    library = getattr(transport.http, underneath)
    with client(srv, timeout=0.5) as c, pytest.raises((raised, library)) as caught:
        for event in c.responses.create(model="m", input="hi", stream=True):
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
    assert deltas == ["Hel", "lo"]
    err = caught.value
    assert isinstance(err.__cause__ if isinstance(err, raised) else err, library)


def test_a_response_answer_with_a_delay_arrives_after_the_delay(srv: FaultServer) -> None:
    srv.script(one("m", kind="answer", text="late", delay=0.25))
    started = time.monotonic()
    with client(srv) as c:
        assert c.responses.create(model="m", input="hi").output_text == "late"
    assert time.monotonic() - started >= 0.25


# --------------------------------------------------------------------------- /v1/embeddings


def test_the_sdk_default_embeddings_call_gets_one_float_vector_per_input(
    srv: FaultServer,
) -> None:
    with client(srv) as c:
        reply = c.embeddings.create(model="emb", input=["first text", "second", "third one"])
    assert srv.requests[0].body["encoding_format"] == "base64"  # what the SDK asks for
    assert isinstance(reply, CreateEmbeddingResponse)
    assert (reply.object, reply.model) == ("list", "emb")
    assert [d.index for d in reply.data] == [0, 1, 2]
    for d in reply.data:
        assert d.object == "embedding" and len(d.embedding) == 16
        assert all(isinstance(x, float) for x in d.embedding)
        assert math.isclose(math.fsum(x * x for x in d.embedding), 1.0, rel_tol=1e-5)
    assert len({tuple(d.embedding) for d in reply.data}) == 3
    assert (reply.usage.prompt_tokens, reply.usage.total_tokens) == (5, 5)


def test_embeddings_are_deterministic_whatever_the_encoding(srv: FaultServer) -> None:
    with client(srv) as c:
        default = c.embeddings.create(model="a", input=["same text", "other"])
        floats = c.embeddings.create(model="b", input="same text", encoding_format="float")
        again = c.embeddings.create(model="a", input=["same text"])
        raw = c.embeddings.create(model="a", input="same text", encoding_format="base64")
    assert floats.data[0].embedding == default.data[0].embedding == again.data[0].embedding
    assert default.data[1].embedding != default.data[0].embedding
    assert isinstance(raw.data[0].embedding, str)  # asked for base64: left encoded


def test_embeddings_honour_the_requested_dimensions_and_token_inputs(srv: FaultServer) -> None:
    with client(srv) as c:
        wide = c.embeddings.create(model="m", input="text", dimensions=100)
        tokens = c.embeddings.create(model="m", input=[[1, 2, 3], [4, 5]])
    assert len(wide.data[0].embedding) == 100
    assert len(tokens.data) == 2 and tokens.usage.prompt_tokens == 5


def test_a_step_embeddings_cannot_play_is_refused_loudly(srv: FaultServer) -> None:
    srv.script(
        {"models": {"m": [{"kind": "stream"}, {"kind": "tool_calls", "tool_calls": [WEATHER]}]}}
    )
    with client(srv) as c:
        for kind in ("stream", "tool_calls"):
            with pytest.raises(openai.BadRequestError, match=f"{kind} step.*embeddings"):
                call(c, "embeddings")


def test_embeddings_requests_without_usable_input_get_a_400_and_are_not_counted(
    srv: FaultServer,
) -> None:
    for body in ({"model": "m"}, {"model": "m", "input": []}, {"model": "m", "input": [1, "x"]}):
        status, text = raw_post(srv, "/v1/embeddings", body)
        assert status == 400 and "input" in json.loads(text)["error"]["message"]
    status, _ = raw_post(srv, "/v1/embeddings", {"model": "m", "input": "x", "dimensions": 0})
    assert status == 400
    assert srv.counts == {}


# --------------------------------------------------------------------------- faults, every endpoint


@pytest.mark.parametrize("endpoint", ["responses", "embeddings"])
@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, openai.BadRequestError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
        (503, openai.InternalServerError),
    ],
)
def test_a_scripted_status_is_the_sdk_status_error(
    srv: FaultServer, endpoint: str, status: int, error: type[openai.APIStatusError]
) -> None:
    srv.script(one("m", kind="status", status=status, headers={"retry-after": "7"}))
    with client(srv) as c, pytest.raises(error) as raised:
        call(c, endpoint)
    assert isinstance(raised.value, openai.APIStatusError)
    assert raised.value.status_code == status
    assert raised.value.response.headers["retry-after"] == "7"
    assert srv.count("m") == 1


@pytest.mark.parametrize("endpoint", ["chat", "responses", "embeddings"])
@pytest.mark.parametrize(
    ("kind", "raised"),
    [
        ("drop", openai.APIConnectionError),
        ("drop_mid_body", openai.APIConnectionError),
        ("hang", openai.APITimeoutError),
        ("invalid_json", json.JSONDecodeError),
        ("empty", json.JSONDecodeError),
    ],
)
def test_every_fault_kind_reaches_the_sdk_on_every_endpoint(
    srv: FaultServer, endpoint: str, kind: str, raised: type[Exception]
) -> None:
    srv.script({"models": {"m": [{"kind": kind}]}})
    with client(srv, timeout=0.3) as c:
        with pytest.raises(raised):
            call(c, endpoint)
        assert call(c, endpoint) is not None  # the next (default) step answers again
    assert [r.kind for r in srv.requests] == [kind, "answer"]


# --------------------------------------------------------------------------- recorded headers


def test_requests_record_their_headers_and_never_show_the_key(srv: FaultServer) -> None:
    with client(srv) as c:
        c.responses.create(model="m", input="hi", extra_headers={"X-Trace-Id": "trace-42"})
        c.embeddings.create(model="e", input="hi", extra_headers={"x-api-key": "xk-secret-999"})
    first, second = srv.requests
    assert first.headers["x-trace-id"] == first.headers["X-TRACE-ID"] == "trace-42"
    assert "X-Trace-Id" in first.headers and "x-missing" not in first.headers
    assert first.headers["user-agent"].startswith("OpenAI/Python")
    assert first.header("Authorization") == f"Bearer {KEY}" == f"Bearer {first.api_key}"
    assert first.headers["authorization"] == "Bearer <redacted>"
    assert second.header("X-Api-Key") == "xk-secret-999"
    assert second.headers["x-api-key"] == "<redacted>"
    assert first.header("x-missing") is None and first.header("x-missing", "-") == "-"
    shown = [repr(srv.requests), str(first), str(first.headers), repr(dict(second.headers))]
    shown += [json.dumps(dict(r.headers)) for r in srv.requests]
    for text in shown:
        assert KEY not in text and "xk-secret" not in text


@pytest.mark.parametrize("kind", ["answer", "stream", "tool_calls"])
def test_a_replying_step_sends_its_headers_plain_and_streamed(srv: FaultServer, kind: str) -> None:
    step: dict[str, Any] = {"kind": kind, "headers": {"x-request-id": "req-7", "x-n": 3}}
    if kind == "tool_calls":
        step["tool_calls"] = [WEATHER]
    srv.script({"models": {"m": [step, step, step]}})
    with client(srv) as c:
        got = []
        if kind != "stream":
            got.append(c.chat.completions.with_raw_response.create(model="m", messages=[]))
        raw = c.responses.with_raw_response.create(model="m", input="hi", stream=True)
        assert raw.headers["content-type"].startswith("text/event-stream")
        with raw.parse() as events:
            assert [e.type for e in events][-1] == "response.completed"
        got.append(raw)
    for raw in got:
        assert (raw.headers["x-request-id"], raw.headers["x-n"]) == ("req-7", "3")


def test_a_repeated_header_keeps_every_value(srv: FaultServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        conn.putrequest("POST", "/v1/chat/completions")
        body = json.dumps({"model": "m"}).encode()
        for name, value in [("X-Tag", "a"), ("x-tag", "b"), ("Content-Length", str(len(body)))]:
            conn.putheader(name, value)
        conn.endheaders(body)
        conn.getresponse().read()
    finally:
        conn.close()
    [record] = srv.requests
    assert record.headers.get_all("X-TAG") == ["a", "b"]
    assert record.headers["x-tag"] == record.header("x-tag") == "a, b"


# --------------------------------------------------------------------------- async and docs


async def test_the_async_sdk_streams_responses_and_gets_embeddings(srv: FaultServer) -> None:
    srv.script(one("m", kind="answer", text="async hello"))
    async with openai.AsyncOpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0) as c:
        stream = await c.responses.create(model="m", input="hi", stream=True)
        types = [event.type async for event in stream]
        vectors = await c.embeddings.create(model="e", input=["x", "y"])
    assert types == RESPONSE_EVENTS[:5] + RESPONSE_EVENTS[6:]  # two words: two deltas
    assert len(vectors.data) == 2 and isinstance(vectors.data[0].embedding[0], float)


def test_every_toml_example_in_the_fault_server_docs_loads(tmp_path: Path) -> None:
    doc = (Path(__file__).parent.parent / "docs" / "fault-server.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", doc, re.S)
    assert len(blocks) >= 2
    for i, block in enumerate(blocks):
        path = tmp_path / f"example-{i}.toml"
        path.write_text(block)
        assert load_script(path).models
