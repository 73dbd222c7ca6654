"""providers.Fallgate / AsyncFallgate: the openai-compatible wrapper, over real HTTP.

The wrapper returns the SDK's own types, replaces the model per target, never
lets the SDK retry on its own, bounds each attempt's timeout, and owns one
client per (target, credential) that it rebuilds and closes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fallgate.fsm import Target, TurnFailed, VirtualClock, instant_waits
from fallgate.fsm.policy.backoff import wake_spread
from fallgate.fsm.policy.model import Backoff
from fallgate.fsm.trace import TraceEvent
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.openai.http import transport
from fallgate.providers.testing.fault_server import FaultServer
from openai.types.chat import ChatCompletion

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


def test_create_returns_the_sdks_chat_completion_from_the_target_model(
    fault_server: FaultServer,
) -> None:
    fault_server.script({"models": {"glm-5.1": [{"kind": "answer", "text": "hello there"}]}})
    with Fallgate(chain("glm-5.1", "glm-4.7", server=fault_server)) as gate:
        reply = gate.chat.completions.create(
            model="glm-5.1", messages=MSG, temperature=0.25, max_tokens=7
        )
    assert isinstance(reply, ChatCompletion)
    assert reply.choices[0].message.content == "hello there"
    [req] = fault_server.requests
    assert req.model == "glm-5.1"
    assert req.body["temperature"] == 0.25 and req.body["max_tokens"] == 7
    assert req.body["messages"] == MSG


def test_run_returns_the_turn_result_with_value_and_trace(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": 503}]}})
    seen: list[TraceEvent] = []
    policy = chain("a", "b", server=fault_server, max_attempts=1)
    with Fallgate(policy, on_transition=seen.append) as g:
        result = g.run(messages=MSG)
    assert isinstance(result.value, ChatCompletion)
    assert (result.state, result.target, result.model, result.attempts) == (
        "done",
        "fallback_1",
        "b",
        2,
    )
    assert [(e.source, e.event, e.dest) for e in result.trace] == [
        ("idle", "start", "primary"),
        ("primary", "overloaded", "fallback_1"),
        ("fallback_1", "success", "done"),
    ]
    assert list(result.trace) == seen


def test_the_sdk_never_retries_on_its_own(fault_server: FaultServer) -> None:
    # The SDK's default is 2 retries on a 503; the engine allows one attempt here.
    fault_server.script({"default": {"kind": "status", "status": 503}})
    with Fallgate(chain("a", server=fault_server, max_attempts=1)) as gate:
        with pytest.raises(TurnFailed):
            gate.run(messages=MSG)
    assert fault_server.count("a") == 1


def test_a_factory_client_with_retries_on_is_switched_to_zero(fault_server: FaultServer) -> None:
    fault_server.script({"default": {"kind": "status", "status": 503}})
    built: list[openai.OpenAI] = []

    def factory(target: Target, key: str) -> openai.OpenAI:
        c = openai.OpenAI(base_url=target.base_url, api_key=key, max_retries=5)
        built.append(c)
        return c

    with Fallgate(chain("a", server=fault_server, max_attempts=1), client_factory=factory) as gate:
        with pytest.raises(TurnFailed):
            gate.run(messages=MSG)
    assert fault_server.count("a") == 1
    assert len(built) == 1


def test_each_attempt_is_bounded_by_the_timeout(fault_server: FaultServer) -> None:
    fault_server.script({"default": {"kind": "timeout", "seconds": 5}})
    policy = chain("a", server=fault_server, max_attempts=1, recover_transport=False)
    with Fallgate(policy, timeout=0.2) as gate:
        t0 = time.monotonic()
        with pytest.raises(TurnFailed) as info:
            gate.run(messages=MSG)
        assert time.monotonic() - t0 < 2.0
    assert "timeout" in str(info.value)
    # the caller's own timeout= is a bound too
    with Fallgate(policy) as gate:
        t0 = time.monotonic()
        with pytest.raises(TurnFailed):
            gate.chat.completions.create(messages=MSG, timeout=0.2)
        assert time.monotonic() - t0 < 2.0


def test_one_client_per_target_and_credential_is_reused(fault_server: FaultServer) -> None:
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        for _ in range(3):
            gate.chat.completions.create(messages=MSG)
        assert gate.clients.built == 1
        assert gate.clients.stats()["live"] == ["primary/key#1"]


def test_transport_recovery_closes_and_recreates_the_client(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "drop"}, {"kind": "drop"}]}})
    clients: list[openai.OpenAI] = []

    def factory(target: Target, key: str) -> openai.OpenAI:
        clients.append(openai.OpenAI(base_url=target.base_url, api_key=key, max_retries=0))
        return clients[-1]

    policy = chain("a", server=fault_server, max_attempts=3, transport_faults_before_recovery=2)
    with Fallgate(policy, client_factory=factory) as gate:
        result = gate.run(messages=MSG)
        assert [e.dest for e in result.trace] == [
            "primary",
            "primary_transport_backoff",
            "primary",
            "primary_recovering",
            "primary",
            "done",
        ]
        assert len(clients) == 2
        assert clients[0].is_closed() and not clients[1].is_closed()
    assert clients[1].is_closed()
    assert fault_server.count("a") == 3


def test_a_failing_rebuild_falls_back(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "drop"}, {"kind": "drop"}]}})
    calls = {"n": 0}

    def factory(target: Target, key: str) -> openai.OpenAI:
        calls["n"] += 1
        if target.model == "a" and calls["n"] > 1:
            raise OSError("too many open files")
        return openai.OpenAI(base_url=target.base_url, api_key=key, max_retries=0)

    with Fallgate(chain("a", "b", server=fault_server), client_factory=factory) as gate:
        result = gate.run(messages=MSG)
    assert [e.event for e in result.trace][-3:] == ["transport", "rebuild_failed", "success"]
    assert result.model == "b"


def test_close_closes_every_client_and_refuses_new_turns(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": 503}]}})
    gate = Fallgate(chain("a", "b", server=fault_server, max_attempts=1))
    gate.run(messages=MSG)
    assert gate.clients.open_clients == 2
    gate.close()
    assert gate.clients.open_clients == 0
    with pytest.raises(RuntimeError, match="closed"):
        gate.run(messages=MSG)
    with pytest.raises(RuntimeError, match="closed"):
        gate.chat.completions.create(messages=MSG, stream=True)


def test_a_content_filtered_reply_is_content_filtered(fault_server: FaultServer) -> None:
    step = {"kind": "answer", "text": "", "finish_reason": "content_filter"}
    fault_server.script({"models": {"a": [step, step]}})
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        with pytest.raises(TurnFailed) as info:
            gate.run(messages=MSG)
        assert "content_filtered" in str(info.value)
        assert isinstance(info.value.last_error, openai.ContentFilterFinishReasonError)
        assert isinstance(info.value.last_error.completion, ChatCompletion)
        assert fault_server.count("b") == 0  # default policy: content filtering does not fall back
    policy = chain("a", "b", server=fault_server, rules={"content_filtered": {"fall_back": True}})
    with Fallgate(policy) as gate:
        assert gate.run(messages=MSG).model == "b"


def test_a_200_that_is_not_a_chat_completion_is_a_malformed_reply(
    fault_server: FaultServer,
) -> None:
    odd = {"kind": "status", "status": 200, "body": {"hello": "world"}}
    text = {"kind": "status", "status": 200, "body": "<html>maintenance</html>"}
    fault_server.script({"models": {"a": [odd, text]}})
    with Fallgate(chain("a", server=fault_server, max_attempts=2)) as gate:
        with pytest.raises(TurnFailed) as info:
            gate.run(messages=MSG)
    assert [e.event for e in info.value.trace][1:] == ["overloaded", "waited", "overloaded"]
    assert "malformed reply: expected a chat completion, got str" in str(info.value)


def test_bad_arguments_are_clear_errors_before_any_request(fault_server: FaultServer) -> None:
    with Fallgate(chain("a", server=fault_server)) as gate:
        with pytest.raises(TypeError, match="messages"):
            gate.chat.completions.create(model="a")
        with pytest.raises(TypeError, match="timeout"):
            gate.chat.completions.create(messages=MSG, timeout=-1)
        with pytest.raises(TypeError, match="stream"):
            gate.run(messages=MSG, stream=True)
        with pytest.raises(KeyError, match="no target named 'zzz'"):
            gate.rebuild("zzz")
    with pytest.raises(TypeError, match=r"fsm\.Policy"):
        Fallgate({"primary": {}})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        Fallgate(chain("a", server=fault_server), timeout=0)
    assert fault_server.counts == {}


def test_an_unknown_create_argument_fails_fast_naming_it(fault_server: FaultServer) -> None:
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        with pytest.raises(TypeError, match="unexpected keyword argument 'tempreture'") as info:
            gate.run(messages=MSG, tempreture=1)
        assert not isinstance(info.value, TurnFailed)  # the caller's mistake, no turn
    assert fault_server.counts == {}


def test_keyboard_interrupt_aborts_the_turn_and_propagates(fault_server: FaultServer) -> None:
    def interrupt(request: Any) -> None:
        raise KeyboardInterrupt

    def factory(target: Target, key: str) -> openai.OpenAI:
        http = transport.http.Client(event_hooks={"request": [interrupt]})
        return openai.OpenAI(base_url=target.base_url, api_key=key, max_retries=0, http_client=http)

    seen: list[TraceEvent] = []
    gate = Fallgate(
        chain("a", "b", server=fault_server), on_transition=seen.append, client_factory=factory
    )
    with pytest.raises(KeyboardInterrupt):
        gate.run(messages=MSG)
    assert seen[-1].dest == "aborted"
    assert gate.clients.stats()["retired_in_use"] == 0
    gate.close()
    assert gate.clients.open_clients == 0


def test_async_create_and_arun(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"a": [{"kind": "status", "status": 429}]}})

    async def main() -> tuple[ChatCompletion, Any]:
        async with AsyncFallgate(chain("a", "b", server=fault_server)) as gate:
            reply = await gate.chat.completions.create(messages=MSG)
            result = await gate.arun(messages=MSG)
            return reply, result

    reply, result = asyncio.run(main())
    assert isinstance(reply, ChatCompletion) and reply.model == "b"
    # the 429 benched primary's key across turns: the next turn starts on the fallback
    assert result.model == "b" and result.trace[0].dest == "fallback_1"
    assert fault_server.counts == {"a": 1, "b": 2}


def test_async_cancellation_aborts_the_turn_and_releases_the_client(
    fault_server: FaultServer,
) -> None:
    fault_server.script({"default": {"kind": "timeout", "seconds": 5}})
    seen: list[TraceEvent] = []

    async def main() -> None:
        gate = AsyncFallgate(chain("a", "b", server=fault_server), on_transition=seen.append)
        task = asyncio.create_task(gate.arun(messages=MSG))
        while fault_server.count("a") == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert gate.clients.stats()["retired_in_use"] == 0
        await gate.aclose()
        assert gate.clients.open_clients == 0

    t0 = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - t0 < 2.0
    assert seen[-1].dest == "aborted"
    assert fault_server.count("b") == 0


def test_a_rebuild_never_breaks_another_turns_request_in_flight(
    fault_server: FaultServer,
) -> None:
    # Turn X is waiting for a slow answer on `a` when turn Y's transport recovery
    # rebuilds `a`'s client: X still gets its answer; the old client is closed after.
    fault_server.script(
        {
            "models": {
                "a": [
                    {"kind": "answer", "text": "slow", "delay": 0.4},
                    {"kind": "drop"},
                    {"kind": "drop"},
                    {"kind": "answer", "text": "after rebuild"},
                ]
            }
        }
    )

    async def main() -> tuple[str, str]:
        async with AsyncFallgate(chain("a", server=fault_server, max_attempts=3)) as gate:
            x = asyncio.create_task(gate.arun(messages=MSG))
            while fault_server.count("a") == 0:
                await asyncio.sleep(0.005)
            y = await gate.arun(messages=MSG)
            assert "primary_recovering" in [e.dest for e in y.trace]
            assert gate.clients.stats()["retired_in_use"] == 1  # x still holds the old one
            rx = await x
            assert gate.clients.stats()["retired_in_use"] == 0
            assert (gate.clients.built, gate.clients.open_clients) == (2, 1)
            return rx.value.choices[0].message.content, y.value.choices[0].message.content

    assert asyncio.run(main()) == ("slow", "after rebuild")


def test_one_sync_client_serves_many_threads(fault_server: FaultServer) -> None:
    from concurrent.futures import ThreadPoolExecutor

    fault_server.script({"models": {"a": [{"kind": "status", "status": 503}] * 10}})
    with Fallgate(chain("a", "b", server=fault_server, max_attempts=1)) as gate:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda _: gate.run(messages=MSG), range(40)))
        assert gate.clients.built == 2
    # every `a` attempt fails with a 503 (which also benches `a` for later turns)
    assert all(r.state == "done" and r.model == "b" for r in results)
    started_on_a = sum(r.trace[0].dest == "primary" for r in results)
    assert fault_server.counts == {"a": started_on_a, "b": 40}
    assert started_on_a >= 1


RATE_LIMITED_30 = {"kind": "status", "status": 429, "headers": {"retry-after": "30"}}
#: A wait for a 30 s Retry-After: never shorter, and at most its wake spread longer.
WAIT_30 = (30.0, 30.0 + wake_spread(Backoff(), 30.0))


def waited_30(seconds: float) -> bool:
    return WAIT_30[0] <= seconds <= WAIT_30[1]


def test_a_client_given_a_virtual_clock_waits_and_lets_cooldowns_pass_on_it(
    fault_server: FaultServer,
) -> None:
    clock = VirtualClock(start=0.0)
    stream_step = {"kind": "stream", "chunks": 2, "then": "done"}
    fault_server.script({"models": {"a": [RATE_LIMITED_30, {"kind": "answer"}]}})
    t0 = time.monotonic()
    with Fallgate(chain("a", server=fault_server, retry_after_cap=60), clock=clock) as gate:
        # one target: the turn sleeps the Retry-After on the client's clock
        assert waited_30(gate.run(messages=MSG).trace[-1].time)
        first = clock.now()
        assert waited_30(first)
        fault_server.script({"models": {"a": [RATE_LIMITED_30, stream_step]}})
        stream = gate.chat.completions.create(messages=MSG, stream=True)
        assert len(list(stream)) >= 2 and stream.state == "done"
        assert waited_30(clock.now() - first)
    assert time.monotonic() - t0 < 5.0

    fault_server.script({"models": {"a": [RATE_LIMITED_30]}})
    with Fallgate(chain("a", "b", server=fault_server), clock=clock) as gate:
        assert gate.run(messages=MSG).model == "b"  # a's key now cools for 30 s
        assert gate.run(messages=MSG).model == "b"
        clock.advance(31)
        assert gate.run(messages=MSG).model == "a"
    assert fault_server.counts == {"a": 2, "b": 2}


def test_an_async_client_given_a_virtual_clock_waits_on_it(fault_server: FaultServer) -> None:
    clock = VirtualClock(start=0.0)
    stream_step = {"kind": "stream", "chunks": 2, "then": "done"}
    fault_server.script(
        {"models": {"a": [RATE_LIMITED_30, {"kind": "answer"}, RATE_LIMITED_30, stream_step]}}
    )

    async def main() -> tuple[float, float, str]:
        policy = chain("a", server=fault_server, retry_after_cap=60)
        async with AsyncFallgate(policy, clock=clock) as gate:
            await gate.chat.completions.create(messages=MSG)
            after_one = clock.now()
            stream = await gate.chat.completions.create(messages=MSG, stream=True)
            chunks = [c async for c in stream]
            return after_one, clock.now(), f"{len(chunks) >= 2} {stream.state}"

    after_one, after_two, streamed = asyncio.run(main())
    assert waited_30(after_one) and waited_30(after_two - after_one)
    assert streamed == "True done"


def test_a_health_store_url_given_as_health_is_refused_by_name(
    fault_server: FaultServer,
) -> None:
    for gate in (Fallgate, AsyncFallgate):
        with pytest.raises(TypeError, match=r"health must be a fallgate\.HealthStore"):
            gate(chain("a", server=fault_server), health="sqlite:///h.db")  # type: ignore[arg-type]


def test_a_clock_that_is_not_a_clock_is_refused_by_name(fault_server: FaultServer) -> None:
    with pytest.raises(TypeError, match=r"clock must be an fsm\.Clock .* got function"):
        Fallgate(chain("a", server=fault_server), clock=lambda: 0.0)  # type: ignore[arg-type]
