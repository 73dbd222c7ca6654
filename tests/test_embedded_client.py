"""`fallgate.http_client(policy)` under a real `openai.OpenAI`: each request one turn.

The real SDK over real HTTP against the fault server; the SDK client is built with a
placeholder key and base_url (the policy's targets are where requests go)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fallgate.fsm import Policy, instant_waits
from fallgate.fsm.trace import TraceEvent
from fallgate.providers.testing.fault_server import FaultServer
from test_e2e_scenarios import SCENARIO_1, scenario_1_policy

import fallgate

from fault_steps import CONTEXT_TOO_LONG_8K
from helpers import chain, key

MSG = [{"role": "user", "content": "hi"}]
PLACEHOLDER = "http://placeholder.invalid/v1"


@pytest.fixture
def instant() -> Iterator[None]:
    with instant_waits():
        yield


_OPEN: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _closed() -> Iterator[None]:
    """Every SDK client a test made is closed (with it, its transports' connections)."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def sdk(policy: Policy, events: list[TraceEvent] | None = None, **kw: Any) -> openai.OpenAI:
    hook = events.append if events is not None else None
    client = fallgate.http_client(policy, on_transition=hook)
    made = openai.OpenAI(api_key="sk-placeholder", base_url=PLACEHOLDER, http_client=client, **kw)
    _OPEN.append(made)
    return made


def dests(events: list[TraceEvent]) -> list[str]:
    return [e.dest for e in events]


def test_a_429_falls_back_and_each_attempt_is_rewritten_for_its_target(
    fault_server: FaultServer,
) -> None:
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "status", "status": 429}],
                "b": [{"kind": "answer", "text": "from b"}],
            }
        }
    )
    policy = chain("a", "b", server=fault_server)
    reply = sdk(policy, max_retries=5).chat.completions.create(model="a", messages=MSG)
    assert reply.choices[0].message.content == "from b"
    assert fault_server.counts == {"a": 1, "b": 1}  # the SDK's max_retries=5 never fired
    first, second = fault_server.requests
    assert (first.path, second.path) == ("/v1/chat/completions", "/v1/chat/completions")
    assert (first.api_key, second.api_key) == (key(0, 0), key(1, 0))
    assert (first.body["model"], second.body["model"]) == ("a", "b")
    assert second.body["messages"] == MSG


def test_model_names_where_the_chain_starts_and_an_unknown_one_is_refused_without_a_request(
    fault_server: FaultServer,
) -> None:
    policy = chain("a", "b", server=fault_server)
    client = sdk(policy)
    assert client.chat.completions.create(model="b", messages=MSG).model == "b"
    with pytest.raises(openai.BadRequestError, match="'gpt-typo' is not in this gate's chain"):
        client.chat.completions.create(model="gpt-typo", messages=MSG)
    assert fault_server.counts == {"b": 1}
    assert [m.id for m in client.models.list()] == ["a", "b"]  # from the chain, no I/O
    assert fault_server.counts == {"b": 1}


def test_a_failed_turn_answers_with_the_last_error_a_target_sent(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script({"default": {"kind": "status", "status": 401}})
    with pytest.raises(openai.AuthenticationError) as info:
        sdk(chain("a", "b", server=fault_server, max_attempts=5)).chat.completions.create(
            model="a", messages=MSG
        )
    assert info.value.response.headers["x-should-retry"] == "false"
    assert info.value.response.headers["x-fallgate-target"] == "fallback_1"
    assert fault_server.counts == {"a": 1, "b": 1}  # scenario 5: bounded, no tight loop


def test_a_turn_that_ran_out_of_targets_on_transport_faults_is_a_502_saying_why(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script({"default": {"kind": "drop"}})
    with pytest.raises(openai.APIStatusError) as info:
        sdk(chain("a", server=fault_server, max_attempts=2)).chat.completions.create(
            model="a", messages=MSG
        )
    assert info.value.status_code == 502
    assert "turn failed" in info.value.message and "primary" in info.value.message


# -- streams --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "step",
    [
        {"kind": "stream", "chunks": 0, "then": "error"},  # an error event before any content
        {"kind": "stream", "chunks": 0, "then": "cut"},  # a cut before any content
        {"kind": "status", "status": 429},
    ],
    ids=["error-event", "cut", "429"],
)
def test_a_stream_that_fails_before_its_first_content_falls_back(
    fault_server: FaultServer, instant: None, step: dict[str, Any]
) -> None:
    fault_server.script({"models": {"a": [step] * 4, "b": [{"kind": "answer", "text": "from b"}]}})
    events: list[TraceEvent] = []
    policy = chain("a", "b", server=fault_server, max_attempts=1)
    stream = sdk(policy, events).chat.completions.create(model="a", messages=MSG, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "from b"
    assert fault_server.counts["b"] == 1
    assert dests(events)[-2:] == ["fallback_1", "done"]


def _cut_after_three(client: openai.OpenAI, delivered: list[str]) -> type[BaseException]:
    """What iterating a stream the server cuts after three chunks raises."""
    try:
        for chunk in client.chat.completions.create(model="a", messages=MSG, stream=True):
            delivered.append(chunk.choices[0].delta.content or "")
    except Exception as e:
        return type(e)
    raise AssertionError("the cut stream ended without an error")


def test_scenario_7_a_stream_cut_after_three_chunks_reaches_the_sdk_as_its_own_error(
    fault_server: FaultServer, instant: None
) -> None:
    cut = {"models": {"a": [{"kind": "stream", "chunks": 3, "then": "cut"}]}}
    fault_server.script(cut)
    bare = openai.OpenAI(api_key="sk-bare", base_url=fault_server.base_url, max_retries=0)
    _OPEN.append(bare)
    expected = _cut_after_three(bare, [])  # the installed SDK's own error for a cut
    fault_server.script(cut)
    delivered: list[str] = []
    assert _cut_after_three(sdk(chain("a", "b", server=fault_server)), delivered) is expected
    assert delivered == ["chunk-1 ", "chunk-2 ", "chunk-3 "]  # each once: no duplicate output
    assert fault_server.counts == {"a": 1}  # committed: never sent again


def test_responses_streams_fall_back_before_content_too(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "stream", "chunks": 0, "then": "error"}],
                "b": [{"kind": "answer", "text": "from b"}],
            }
        }
    )
    client = sdk(chain("a", "b", server=fault_server))
    with client.responses.stream(model="a", input="hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == "from b"
    assert fault_server.counts == {"a": 1, "b": 1}


# -- async ----------------------------------------------------------------------------------------


def test_the_async_client_falls_back_plain_and_streamed(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "status", "status": 429}] * 2,
                "b": [{"kind": "answer", "text": "from b"}] * 2,
            }
        }
    )
    policy = chain("a", "b", server=fault_server)

    async def main() -> tuple[str, str]:
        client = openai.AsyncOpenAI(
            api_key="sk-placeholder",
            base_url=PLACEHOLDER,
            http_client=fallgate.async_http_client(policy),
        )
        plain = await client.chat.completions.create(model="a", messages=MSG)
        stream = await client.chat.completions.create(model="a", messages=MSG, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await client.close()
        return plain.choices[0].message.content or "", text

    assert asyncio.run(main()) == ("from b", "from b")
    assert fault_server.counts == {"a": 1, "b": 2}  # the 429 cooled "a" for the next turn


# -- the regression scenarios 1-7 (docs/design.md), through the real SDK client -------------------


def test_scenario_1_timeouts_recovery_then_429_falls_back(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch, instant: None
) -> None:
    monkeypatch.setenv("FG_GLM47_KEY", "sk-test-glm47-key")
    fault_server.script(SCENARIO_1)
    policy = scenario_1_policy(fault_server)
    events: list[TraceEvent] = []
    reply = sdk(policy, events).chat.completions.create(model="glm-5.1", messages=MSG)
    assert reply.choices[0].message.content == "answered by glm-4.7"
    assert [e.event for e in events][1:] == [
        "transport",
        "waited",
        "transport",
        "rebuilt",
        "rate_limited",
        "success",
    ]
    assert fault_server.counts == {"glm-5.1": 3, "glm-4.7": 1}


def test_scenario_2_retry_after_171_is_not_slept(fault_server: FaultServer) -> None:
    fault_server.script(
        {
            "models": {
                "glm-5.1": [{"kind": "status", "status": 429, "headers": {"retry-after": "171"}}],
                "glm-4.7": [{"kind": "answer", "text": "fast"}],
            }
        }
    )
    t0 = time.monotonic()
    policy = chain("glm-5.1", "glm-4.7", server=fault_server, provider="zai")
    reply = sdk(policy, max_retries=2).chat.completions.create(model="glm-5.1", messages=MSG)
    assert time.monotonic() - t0 < 3.0
    assert reply.model == "glm-4.7"
    assert fault_server.counts == {"glm-5.1": 1, "glm-4.7": 1}  # no SDK retry


def test_scenario_3_a_403_on_fallback_1_goes_on_to_fallback_2(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "status", "status": 503}],
                "b": [{"kind": "status", "status": 403}],
                "c": [{"kind": "answer", "text": "from c"}],
            }
        }
    )
    events: list[TraceEvent] = []
    reply = sdk(chain("a", "b", "c", server=fault_server), events).chat.completions.create(
        model="a", messages=MSG
    )
    assert reply.model == "c"
    assert dests(events)[-3:] == ["fallback_1", "fallback_2", "done"]
    assert fault_server.counts == {"a": 1, "b": 1, "c": 1}


def test_scenario_4_three_503s_with_prefer_waiting_then_fall_back(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": 503}] * 3}})
    policy = chain("a", "b", server=fault_server, max_attempts=3, prefer_waiting=True)
    events: list[TraceEvent] = []
    reply = sdk(policy, events).chat.completions.create(model="a", messages=MSG)
    assert reply.model == "b"
    assert [e.event for e in events].count("overloaded") == 3
    assert fault_server.counts == {"a": 3, "b": 1}


def test_scenario_5_a_persistent_401_with_a_healthy_fallback_answers(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": 401}] * 9}})
    reply = sdk(chain("a", "b", server=fault_server)).chat.completions.create(
        model="a", messages=MSG
    )
    assert reply.model == "b"
    assert fault_server.counts == {"a": 1, "b": 1}


def test_scenario_6_context_too_long_skips_the_smaller_fallback(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script({"models": {"big-8k": [CONTEXT_TOO_LONG_8K]}})
    policy = chain("big-8k@8192", "small-4k@4096", "huge-128k@131072", server=fault_server)
    events: list[TraceEvent] = []
    reply = sdk(policy, events).chat.completions.create(model="big-8k", messages=MSG)
    assert reply.model == "huge-128k"
    assert dests(events) == ["primary", "fallback_2", "done"]
    assert fault_server.counts == {"big-8k": 1, "huge-128k": 1}


def test_a_request_the_sdk_sent_again_says_where_retries_belong(
    fault_server: FaultServer, caplog: pytest.LogCaptureFixture
) -> None:
    from fallgate.providers.openai.http import embedded

    embedded._warned.clear()
    client = sdk(chain("a", server=fault_server))
    with caplog.at_level(logging.WARNING, logger="fallgate"):
        client.chat.completions.create(model="a", messages=MSG)
        assert caplog.records == []  # a first attempt says nothing
        retried = {"x-stainless-retry-count": "1"}  # what the SDK sends on its retry
        client.chat.completions.create(model="a", messages=MSG, extra_headers=retried)
        client.chat.completions.create(model="a", messages=MSG, extra_headers=retried)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "build the SDK client with max_retries=0" in said[0]


# -- redirects ------------------------------------------------------------------------------------


def test_a_redirect_is_not_followed_by_the_sdk_client_either(
    fault_server: FaultServer, instant: None
) -> None:
    """A turn that failed on a target's 307 answers with it; the SDK's HTTP client must
    not follow it (that would run the turn again through the transport, and again)."""
    with FaultServer() as elsewhere:
        to = f"{elsewhere.base_url}/chat/completions"
        fault_server.script(
            {"default": {"kind": "status", "status": 307, "headers": {"Location": to}}}
        )
        policy = chain("a", server=fault_server, max_attempts=2)
        with pytest.raises(openai.APIStatusError) as err:
            sdk(policy).chat.completions.create(model="a", messages=MSG)
        assert err.value.status_code == 307

        async def main() -> int:
            client = openai.AsyncOpenAI(
                api_key="sk-placeholder",
                base_url=PLACEHOLDER,
                http_client=fallgate.async_http_client(policy),
            )
            try:
                await client.chat.completions.create(model="a", messages=MSG)
            except openai.APIStatusError as e:
                return e.status_code
            finally:
                await client.close()
            raise AssertionError("the redirect was taken for an answer")

        assert asyncio.run(main()) == 307
        assert elsewhere.requests == []
    assert fault_server.count("a") == 2  # one request a turn: no redirect, no retry of one
