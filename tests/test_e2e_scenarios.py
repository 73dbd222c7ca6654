"""The regression scenarios of docs/design.md, end to end: the real openai SDK over
real HTTP against the fault server, through `providers.Fallgate`. Each test asserts
the path the turn took and how many requests every model received."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fallgate.fsm import Policy, Target, TurnFailed, instant_waits
from fallgate.providers import Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from fault_steps import CONTEXT_TOO_LONG_8K
from helpers import chain

MSG = [{"role": "user", "content": "hi"}]


def path(trace: Any) -> list[str]:
    return [e.dest for e in trace]


@pytest.fixture
def instant() -> Iterator[None]:
    with instant_waits():
        yield


# -- scenario 1 -----------------------------------------------------------------------------------

SCENARIO_1 = {
    "models": {
        "glm-5.1": [
            {"kind": "timeout", "seconds": 3},
            {"kind": "timeout", "seconds": 3},
            {"kind": "status", "status": 429, "headers": {"retry-after": "171"}},
        ],
        "glm-4.7": [{"kind": "answer", "text": "answered by glm-4.7"}],
    }
}


def scenario_1_policy(srv: FaultServer) -> Policy:
    return chain(
        "glm-5.1",
        {"model": "glm-4.7", "key_env": "FG_GLM47_KEY"},
        server=srv,
        provider="zai",
        max_attempts=2,
        attempt_timeout=0.3,
    )


def _scenario_1_turn(gate: Fallgate, srv: FaultServer) -> None:
    srv.script(SCENARIO_1)
    result = gate.run(messages=MSG)
    assert result.value.choices[0].message.content == "answered by glm-4.7"
    assert path(result.trace) == [
        "primary",
        "primary_transport_backoff",
        "primary",
        "primary_recovering",
        "primary",
        "fallback_1",
        "done",
    ]
    assert [e.event for e in result.trace][1:] == [
        "transport",
        "waited",
        "transport",
        "rebuilt",
        "rate_limited",
        "success",
    ]
    assert srv.counts == {"glm-5.1": 3, "glm-4.7": 1}


def test_scenario_1_fallback_whose_env_var_was_missing_earlier_still_answers(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch, instant: None
) -> None:
    monkeypatch.delenv("FG_GLM47_KEY", raising=False)
    with Fallgate(scenario_1_policy(fault_server)) as gate:
        # The earlier turn: the primary drops, the eager fallback cannot activate.
        fault_server.script({"models": {"glm-5.1": [{"kind": "drop"}] * 3}})
        with pytest.raises(TurnFailed) as info:
            gate.run(messages=MSG)
        assert "FG_GLM47_KEY" in info.value.reasons["fallback_1"]
        assert fault_server.counts == {"glm-5.1": 3}
        # The variable is there now; the scenario turn.
        monkeypatch.setenv("FG_GLM47_KEY", "sk-test-glm47-now-set")
        _scenario_1_turn(gate, fault_server)


def test_scenario_1_fallback_whose_client_failed_to_build_earlier_still_answers(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch, instant: None
) -> None:
    monkeypatch.setenv("FG_GLM47_KEY", "sk-test-glm47-key")
    broken = {"glm-4.7": True}

    def factory(t: Target, key: str) -> openai.OpenAI:
        if broken.get(t.model):
            raise OSError("could not create the HTTP client (file descriptors exhausted)")
        return openai.OpenAI(base_url=t.base_url, api_key=key, max_retries=0)

    with Fallgate(scenario_1_policy(fault_server), client_factory=factory) as gate:
        fault_server.script({"models": {"glm-5.1": [{"kind": "drop"}] * 3}})
        with pytest.raises(TurnFailed) as info:
            gate.run(messages=MSG)
        assert "could not be built" in info.value.reasons["fallback_1"]
        assert fault_server.counts == {"glm-5.1": 3}
        broken.clear()
        _scenario_1_turn(gate, fault_server)


# -- scenario 2 -----------------------------------------------------------------------------------


def test_scenario_2_retry_after_171_is_not_slept_when_a_fallback_is_healthy(
    fault_server: FaultServer,
) -> None:
    # Real waits here (no instant_waits): sleeping would take 171 s.
    fault_server.script(
        {
            "models": {
                "glm-5.1": [{"kind": "status", "status": 429, "headers": {"retry-after": "171"}}],
                "glm-4.7": [{"kind": "answer", "text": "fast"}],
            }
        }
    )
    policy = chain("glm-5.1", "glm-4.7", server=fault_server, provider="zai")
    t0 = time.monotonic()
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
    assert time.monotonic() - t0 < 3.0
    assert result.model == "glm-4.7"
    assert all(e.wait is None for e in result.trace)
    assert fault_server.counts == {"glm-5.1": 1, "glm-4.7": 1}  # no SDK retry behind our back


# -- scenario 3 -----------------------------------------------------------------------------------


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
    policy = chain("a", "b", "c", server=fault_server)
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
    assert result.model == "c"
    assert path(result.trace)[-3:] == ["fallback_1", "fallback_2", "done"]
    assert fault_server.counts == {"a": 1, "b": 1, "c": 1}


# -- scenario 4 -----------------------------------------------------------------------------------


def test_scenario_4_a_503_falls_back_at_once_when_the_fallback_is_free(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": 503}] * 3}})
    policy = chain("a", "b", server=fault_server, max_attempts=3)
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
    assert result.model == "b"
    assert [e.event for e in result.trace] == ["start", "overloaded", "success"]
    assert fault_server.counts == {"a": 1, "b": 1}


def test_scenario_4_three_503s_with_prefer_waiting_use_every_attempt_then_fall_back(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": 503}] * 3}})
    policy = chain("a", "b", server=fault_server, max_attempts=3, prefer_waiting=True)
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
    assert result.model == "b"
    assert [e.event for e in result.trace] == [
        "start",
        "overloaded",
        "waited",
        "overloaded",
        "waited",
        "overloaded",
        "success",
    ]
    assert fault_server.counts == {"a": 3, "b": 1}


# -- scenario 5 -----------------------------------------------------------------------------------


def test_scenario_5_persistent_401_on_a_one_key_pool_is_bounded_then_falls_back(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script({"default": {"kind": "status", "status": 401}})
    policy = chain("a", "b", server=fault_server, max_attempts=5)
    with Fallgate(policy) as gate:
        t0 = time.monotonic()
        with pytest.raises(TurnFailed) as info:
            gate.run(messages=MSG)
        assert time.monotonic() - t0 < 3.0
    assert fault_server.counts == {"a": 1, "b": 1}  # never a tight loop
    assert "auth (HTTP 401)" in info.value.reasons["primary"]
    assert "auth (HTTP 401)" in info.value.reasons["fallback_1"]


def test_scenario_5_with_a_healthy_fallback_answers(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": 401}] * 9}})
    policy = chain("a", "b", server=fault_server)
    with Fallgate(policy) as gate:
        assert gate.run(messages=MSG).model == "b"
    assert fault_server.counts == {"a": 1, "b": 1}


# -- scenario 6 -----------------------------------------------------------------------------------


def test_scenario_6_context_too_long_skips_the_smaller_fallback(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script({"models": {"big-8k": [CONTEXT_TOO_LONG_8K]}})
    policy = chain("big-8k@8192", "small-4k@4096", "huge-128k@131072", server=fault_server)
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
    assert result.model == "huge-128k"
    assert path(result.trace) == ["primary", "fallback_2", "done"]
    assert fault_server.counts == {"big-8k": 1, "huge-128k": 1}


# -- scenario 7 -----------------------------------------------------------------------------------


def test_scenario_7_a_stream_broken_after_three_chunks_fails_with_the_partial_text(
    fault_server: FaultServer, instant: None
) -> None:
    fault_server.script({"models": {"a": [{"kind": "stream", "chunks": 3, "then": "error"}]}})
    policy = chain("a", "b", server=fault_server)
    delivered: list[str] = []
    with Fallgate(policy) as gate:
        with pytest.raises(TurnFailed) as info:
            for chunk in gate.chat.completions.create(messages=MSG, stream=True):
                delivered.append(chunk.choices[0].delta.content or "")
    assert delivered == ["chunk-1 ", "chunk-2 ", "chunk-3 "]  # each once
    assert info.value.partial == "chunk-1 chunk-2 chunk-3 "
    assert "partial output: 24 characters delivered" in str(info.value)
    assert fault_server.counts == {"a": 1}
