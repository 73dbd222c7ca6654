"""The SDK surface the wrappers cover, each call one turn, over real HTTP.

For every covered method (chat create / stream / parse, responses create /
stream, embeddings, the with_raw_response twins, the namespaces' run), sync
and async: a 429 or 503 on the primary falls back to the fallback, and the
answer is the fallback's (the fault server's records say which path and
model each request went to). Then the Responses stream commit rule, raw
responses of the target that answered, models.list, and the message for
what is not wrapped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pydantic
import pytest
from fallgate.fsm import TurnFailed, instant_waits
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.testing.fault_server import FaultServer
from fallgate.providers.testing.fault_server import responses as fault_responses
from openai.pagination import AsyncPage, SyncPage
from openai.types import CreateEmbeddingResponse, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]
ANSWER = '{"city": "Paris"}'
CHAT, RESPONSES, EMBEDDINGS = "/v1/chat/completions", "/v1/responses", "/v1/embeddings"


class City(pydantic.BaseModel):
    city: str


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


def answered_by(value: Any) -> str:
    """The model named in what a surface returned (a reply, a raw response, events)."""
    if isinstance(value, list):  # stream events: chat chunks, or Responses events
        last = value[-1]
        return str(last.model if isinstance(last, ChatCompletionChunk) else last.response.model)
    if hasattr(value, "http_response"):  # the SDK's raw response
        return answered_by(value.parse())
    if hasattr(value, "value"):  # a GateResult
        return answered_by(value.value)
    assert isinstance(value, ChatCompletion | Response | CreateEmbeddingResponse)
    if isinstance(value, ChatCompletion) and value.choices[0].message.content == ANSWER:
        parsed = getattr(value.choices[0].message, "parsed", None)
        assert parsed is None or parsed == City(city="Paris")
    return value.model


SYNC: dict[str, tuple[str, Callable[[Fallgate], Any]]] = {
    "chat.create": (CHAT, lambda g: g.chat.completions.create(messages=MSG)),
    "chat.stream": (CHAT, lambda g: list(g.chat.completions.create(messages=MSG, stream=True))),
    "chat.parse": (
        CHAT,
        lambda g: g.chat.completions.parse(messages=MSG, response_format=City),
    ),
    "chat.run": (CHAT, lambda g: g.chat.completions.run(messages=MSG)),
    "chat.raw": (CHAT, lambda g: g.chat.completions.with_raw_response.create(messages=MSG)),
    "chat.raw.parse": (
        CHAT,
        lambda g: g.chat.completions.with_raw_response.parse(messages=MSG, response_format=City),
    ),
    "responses.create": (RESPONSES, lambda g: g.responses.create(input="hi")),
    "responses.stream": (RESPONSES, lambda g: list(g.responses.create(input="hi", stream=True))),
    "responses.run": (RESPONSES, lambda g: g.responses.run(input="hi")),
    "responses.raw": (RESPONSES, lambda g: g.responses.with_raw_response.create(input="hi")),
    "embeddings.create": (EMBEDDINGS, lambda g: g.embeddings.create(input=["a b", "c"])),
    "embeddings.run": (EMBEDDINGS, lambda g: g.embeddings.run(input="a b")),
    "embeddings.raw": (EMBEDDINGS, lambda g: g.embeddings.with_raw_response.create(input="a")),
}


async def _alist(stream: Awaitable[Any]) -> list[Any]:
    return [event async for event in await stream]


ASYNC: dict[str, Callable[[AsyncFallgate], Awaitable[Any]]] = {
    "chat.create": lambda g: g.chat.completions.create(messages=MSG),
    "chat.stream": lambda g: _alist(g.chat.completions.create(messages=MSG, stream=True)),
    "chat.parse": lambda g: g.chat.completions.parse(messages=MSG, response_format=City),
    "chat.run": lambda g: g.chat.completions.run(messages=MSG),
    "chat.raw": lambda g: g.chat.completions.with_raw_response.create(messages=MSG),
    "chat.raw.parse": lambda g: g.chat.completions.with_raw_response.parse(
        messages=MSG, response_format=City
    ),
    "responses.create": lambda g: g.responses.create(input="hi"),
    "responses.stream": lambda g: _alist(g.responses.create(input="hi", stream=True)),
    "responses.run": lambda g: g.responses.run(input="hi"),
    "responses.raw": lambda g: g.responses.with_raw_response.create(input="hi"),
    "embeddings.create": lambda g: g.embeddings.create(input=["a b", "c"]),
    "embeddings.run": lambda g: g.embeddings.run(input="a b"),
    "embeddings.raw": lambda g: g.embeddings.with_raw_response.create(input="a"),
}


def _fallback_script(status: int) -> dict[str, Any]:
    return {
        "models": {"a": [{"kind": "status", "status": status}]},
        "default": {"kind": "answer", "text": ANSWER},
    }


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("surface", list(SYNC))
def test_every_surface_falls_back_from_a_failing_primary(
    fault_server: FaultServer, surface: str, status: int
) -> None:
    path, call = SYNC[surface]
    fault_server.script(_fallback_script(status))
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        assert answered_by(call(gate)) == "b"
    assert [(r.path, r.model, r.kind) for r in fault_server.requests] == [
        (path, "a", "status"),
        (path, "b", "answer"),
    ]


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("surface", list(ASYNC))
def test_every_async_surface_falls_back_from_a_failing_primary(
    fault_server: FaultServer, surface: str, status: int
) -> None:
    fault_server.script(_fallback_script(status))

    async def main() -> str:
        async with AsyncFallgate(chain("a", "b", server=fault_server)) as gate:
            return answered_by(await ASYNC[surface](gate))

    assert asyncio.run(main()) == "b"
    path = SYNC[surface][0]
    assert [(r.path, r.model) for r in fault_server.requests] == [(path, "a"), (path, "b")]


def test_every_surface_sends_the_targets_model_and_the_callers_arguments(
    fault_server: FaultServer,
) -> None:
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        gate.responses.create(input="hi", instructions="be brief", temperature=0.5)
        gate.embeddings.create(input="x y", dimensions=4, model="a")
    first, second = fault_server.requests
    assert first.body == {"model": "a", "input": "hi", "instructions": "be brief",
                          "temperature": 0.5}  # fmt: skip
    assert (second.body["model"], second.body["dimensions"]) == ("a", 4)


# --------------------------------------------------------------------------- responses streams


def failed_event_stream(model: str) -> dict[str, Any]:
    """A hand-made Responses stream that fails: created, then ``response.failed``."""
    body = fault_responses.response(model, {}, "")
    failed = dict(body, status="failed", error={"code": "server_error", "message": "boom"})
    events = [
        {"type": "response.created", "sequence_number": 0, "response": body},
        {"type": "response.failed", "sequence_number": 1, "response": failed},
    ]
    sse = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    return {"kind": "status", "status": 200, "body": sse, "content_type": "text/event-stream"}


@pytest.mark.parametrize(
    "failure",
    [
        {"kind": "stream", "chunks": 0, "then": "cut"},
        {"kind": "stream", "chunks": 0, "then": "error"},
        {"kind": "stream", "chunks": 0, "then": "hang", "seconds": 1},
        "response.failed",
        {"kind": "status", "status": 503},
    ],
    ids=["cut before a delta", "error event", "stall", "response.failed", "503"],
)
def test_a_responses_stream_failing_before_its_first_delta_falls_back(
    fault_server: FaultServer, failure: Any
) -> None:
    step = failed_event_stream("a") if failure == "response.failed" else failure
    fault_server.script({"models": {"a": [step] * 5, "b": [{"kind": "answer", "text": "from b"}]}})
    policy = chain("a", "b", server=fault_server, attempt_timeout=0.3)
    with Fallgate(policy) as gate:
        with gate.responses.create(input="hi", stream=True) as stream:
            events = list(stream)
    assert stream.text == "from b" and stream.state == "done"
    # the failed attempt's events never reached the caller: one whole stream, from b
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert {e.response.model for e in events if hasattr(e, "response")} == {"b"}
    assert fault_server.count("a") >= 1 and fault_server.count("b") == 1


def test_a_responses_stream_broken_after_its_first_delta_fails_with_the_partial_text(
    fault_server: FaultServer,
) -> None:
    fault_server.script({"models": {"a": [{"kind": "stream", "chunks": 3, "then": "cut"}]}})
    received: list[Any] = []
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        stream = gate.responses.create(input="hi", stream=True)
        with pytest.raises(TurnFailed) as info:
            for event in stream:
                received.append(event)
    deltas = [e.delta for e in received if e.type == "response.output_text.delta"]
    assert info.value.partial == "".join(deltas) == "chunk-1 chunk-2 chunk-3 "
    assert "stream_interrupted" in str(info.value)
    # the held opening events reached the caller with the first delta, in order
    assert [e.type for e in received[:5]] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert fault_server.counts == {"a": 1}  # never replayed on the fallback


def test_a_continued_responses_stream_resends_with_the_delivered_text_as_prefix(
    fault_server: FaultServer,
) -> None:
    fault_server.script({"models": {"a": [{"kind": "stream", "chunks": 2, "then": "cut"}]}})
    policy = chain({"model": "a", "assistant_prefix": True}, server=fault_server)
    with Fallgate(policy) as gate:
        stream = gate.responses.create(input="tell me", stream=True)
        list(stream)
    assert stream.text == "chunk-1 chunk-2 ok" and stream.state == "done"
    assert fault_server.requests[1].body["input"] == [
        {"role": "user", "content": "tell me"},
        {"role": "assistant", "content": "chunk-1 chunk-2 "},
    ]


def test_a_responses_stream_of_tool_calls_commits_at_the_first_arguments_delta(
    fault_server: FaultServer,
) -> None:
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    fault_server.script({"models": {"a": [{"kind": "tool_calls", "tool_calls": [call]}]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        events = list(gate.responses.create(input="weather?", stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-1] == "response.completed" and fault_server.counts == {"a": 1}


def test_an_async_responses_stream_falls_back_before_and_commits_after_its_first_delta(
    fault_server: FaultServer,
) -> None:
    early = {"kind": "stream", "chunks": 0, "then": "error"}
    cut_late = {"kind": "stream", "chunks": 2, "then": "cut"}
    fault_server.script({"models": {"a": [early, cut_late], "b": [{"kind": "answer"}]}})

    async def main() -> tuple[str, str | None]:
        async with AsyncFallgate(chain("a", "b", server=fault_server)) as gate:
            first = await gate.responses.create(input="hi", stream=True)
            async for _ in first:
                pass
            gate.health.clear()
            second = await gate.responses.create(input="hi", stream=True)
            with pytest.raises(TurnFailed) as info:
                async for _ in second:
                    pass
            return first.text, info.value.partial

    assert asyncio.run(main()) == ("ok", "chunk-1 chunk-2 ")
    assert [r.model for r in fault_server.requests] == ["a", "b", "a"]


@pytest.mark.parametrize(
    ("code", "outcome"), [("server_error", "overloaded"), ("rate_limit_exceeded", "rate_limited")]
)
def test_a_failed_response_is_classified_by_its_error_and_falls_back(
    fault_server: FaultServer, code: str, outcome: str
) -> None:
    failed = dict(
        fault_responses.response("a", {}, "partial"),
        status="failed",
        error={"code": code, "message": "the model gave up"},
    )
    fault_server.script({"models": {"a": [{"kind": "status", "status": 200, "body": failed}]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        result = gate.responses.run(input="hi")
    assert result.model == "b" and result.value.status == "completed"
    [failure] = [e for e in result.trace if e.source == "primary"]
    assert failure.event == outcome
    assert "failed reply: the response failed: the model gave up" in failure.detail


# --------------------------------------------------------------------------- raw responses


def test_a_raw_response_is_the_answering_targets_own(fault_server: FaultServer) -> None:
    limited = {"kind": "status", "status": 429, "headers": {"x-request-id": "req-a"}}
    answer = {"kind": "answer", "text": "from b", "headers": {"x-request-id": "req-b"}}
    fault_server.script({"models": {"a": [limited, {"kind": "invalid_json"}], "b": [answer]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        raw = gate.chat.completions.with_raw_response.create(messages=MSG)
        assert raw.headers["x-request-id"] == "req-b"
        assert raw.http_request.url.path == CHAT
        assert raw.parse().choices[0].message.content == "from b"
        # a raw 200 whose body is not a completion is classified and falls back too
        gate.health.clear()
        raw = gate.chat.completions.with_raw_response.create(messages=MSG)
        assert raw.headers.get("x-request-id") is None  # b's default step sends none
        assert raw.parse().model == "b"
    assert [r.model for r in fault_server.requests] == ["a", "b", "a", "b"]


def test_an_async_raw_response_is_the_answering_targets_own(fault_server: FaultServer) -> None:
    limited = {"kind": "status", "status": 503, "headers": {"x-request-id": "req-a"}}
    answer = {"kind": "answer", "headers": {"x-request-id": "req-b"}}
    fault_server.script({"models": {"a": [limited], "b": [answer]}})

    async def main() -> tuple[str, str]:
        async with AsyncFallgate(chain("a", "b", server=fault_server)) as gate:
            raw = await gate.responses.with_raw_response.create(input="hi")
            return raw.headers["x-request-id"], raw.parse().model

    assert asyncio.run(main()) == ("req-b", "b")


def test_a_raw_call_does_not_stream(fault_server: FaultServer) -> None:
    with Fallgate(chain("a", server=fault_server)) as gate:
        with pytest.raises(TypeError, match=r"does not stream .*create\(stream=True\)"):
            gate.chat.completions.with_raw_response.create(messages=MSG, stream=True)
        with pytest.raises(TypeError, match="does not stream"):
            gate.embeddings.create(input="x", stream=True)
    assert fault_server.requests == []


# --------------------------------------------------------------------------- models


def test_models_list_is_the_chain_without_any_request(fault_server: FaultServer) -> None:
    policy = chain("a", "b", "c", server=fault_server, provider="p{i}")
    with Fallgate(policy) as gate:
        page = gate.models.list()
        assert isinstance(page, SyncPage)
        assert [(m.id, m.owned_by) for m in page] == [("a", "p0"), ("b", "p1"), ("c", "p2")]
        assert all(isinstance(m, Model) and m.object == "model" for m in page.data)
        assert gate.models.retrieve("b") == gate.models.retrieve("fallback_1") == page.data[1]
        with pytest.raises(ValueError, match="'zzz' is not in this gate's chain"):
            gate.models.retrieve("zzz")

    async def main() -> tuple[list[str], list[str]]:
        async with AsyncFallgate(policy) as agate:
            page = await agate.models.list()
            assert isinstance(page, AsyncPage)
            listed = [m.id async for m in agate.models.list()]
            assert (await agate.models.retrieve("p2/c")).id == "c"
            return [m.id for m in page.data], listed

    assert asyncio.run(main()) == (["a", "b", "c"], ["a", "b", "c"])
    assert fault_server.requests == []


# --------------------------------------------------------------------------- not wrapped


@pytest.mark.parametrize(
    ("path", "what"),
    [
        ("images", "Fallgate wraps chat.completions.create/parse/stream, responses.create"),
        ("chat.completions.list", "Fallgate.chat.completions wraps create, parse, stream, run"),
        ("chat.completions.with_raw_response.list", "with_raw_response wraps create, parse;"),
        ("responses.retrieve", "Fallgate.responses wraps create, stream, run, with_raw_response;"),
        ("embeddings.list", "Fallgate.embeddings wraps create, run, with_raw_response;"),
        ("models.delete", "Fallgate.models wraps list, retrieve;"),
        ("chat.audio", "Fallgate.chat wraps completions;"),
    ],
)
def test_what_is_not_wrapped_says_what_is(fault_server: FaultServer, path: str, what: str) -> None:
    *parents, name = path.split(".")
    for cls in (Fallgate, AsyncFallgate):
        gate = cls(chain("a", server=fault_server))
        obj: Any = gate
        for p in parents:
            obj = getattr(obj, p)
        with pytest.raises(AttributeError) as info:
            getattr(obj, name)
        message = str(info.value)
        assert what.replace("Fallgate", cls.__name__, 1) in message
        assert f"{name!r} is not supported" in message
        assert "with_options" in message and "embeddings.create" in message
        assert not hasattr(obj, name)
