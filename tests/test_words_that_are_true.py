"""The words of a failure say what is true: what cut an attempt, what keeps a target
from being called, what a reply lacks, which targets were really asked.

Five stories: a turn refused while
another turn probes a half-open breaker is told so, not that the target is "cooling
for -0.1s"; an attempt cut by the turn's deadline says so (not a made-up "0.454679 s
total time bound"); a hung connect names ``connect_timeout``; an embeddings reply with
fewer vectors than inputs is malformed (the fallback answers); a broken stream no text
prefix can carry fails at its break, with no phantom attempts on targets never asked.
The engine's words in pure-core tests; the rest with the real SDK over loopback.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from fallgate.fsm import TurnFailed, instant_waits
from fallgate.fsm.clock import VirtualClock
from fallgate.fsm.core.actions import Attempt
from fallgate.fsm.core.turn import Turn
from fallgate.fsm.health.store import HealthStore
from fallgate.fsm.kinds import OutcomeKind
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.openai.http.bounds import AttemptBound
from fallgate.providers.testing.fault_server import FaultServer

import fallgate
from fallgate import Policy

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]


# -- refused while another turn probes the half-open breaker -----------------------------


def test_a_turn_refused_while_another_probes_the_half_open_breaker_is_told_so_not_cooling():
    """The primary's breaker opened for 0.3 s; 0.4 s later turn A takes the probe lease
    (it ends at most attempt_timeout + 1 = 2 s on), turn B finds nothing to call and may
    not wait 2 s of a 1.5 s deadline: it fails at once, saying another turn is probing
    the primary, never a negative cooldown, never "clear the cooldowns"."""
    policy = chain("m0", max_attempts=1, deadline=1.5, attempt_timeout=1)
    health, clock = HealthStore(), VirtualClock()
    health.open_target(policy.targets[0].key, clock.now() + 0.3, clock.now())
    clock.advance(0.4)
    prober = Turn(policy, health=health, clock=clock.now)
    probe = prober.start()
    assert isinstance(probe, Attempt) and probe.probe
    assert health.grant(prober.s, probe) is None  # A holds the lease
    with pytest.raises(TurnFailed) as failed:
        fallgate.run(policy, lambda t, c: "never called", health=health, clock=clock)
    text = str(failed.value)
    assert "another turn is probing primary's half-open breaker" in text
    assert "at most 2 s away, past what the 1.5 s deadline leaves" in text
    assert "health.clear()" not in text and "--reset" not in text
    assert "cooling" not in text and not re.search(r"-\d", text)
    assert failed.value.reasons["primary"] == (
        "skipped at turn start: half-open, another turn is probing it "
        "(free when its probe ends, at most 2.0s away)"
    )


def test_a_fallback_skipped_for_another_turns_probe_names_the_probe():
    """A fallback refused for the same reason, while the primary answers: its reason
    (seen when the turn fails) names the probe, with a time that is not negative."""
    policy = chain("m0", "m1", max_attempts=1, deadline=1.5, attempt_timeout=1)
    health, clock = HealthStore(), VirtualClock()
    health.open_target(policy.targets[1].key, clock.now() + 0.3, clock.now())
    clock.advance(0.4)
    prober = Turn(policy, health=health, clock=clock.now, first=1)
    probe = prober.start()
    assert isinstance(probe, Attempt) and probe.probe and probe.target.name == "fallback_1"
    assert health.grant(prober.s, probe) is None

    def down(t: Any, c: Any) -> Any:
        raise openai.APIConnectionError(request=_request())

    with pytest.raises(TurnFailed) as failed:
        fallgate.run(policy, down, health=health, clock=clock)
    why = failed.value.reasons["fallback_1"]
    assert "another turn is probing it" in why and "cooling" not in why
    assert not re.search(r"-\d", why)


def _request() -> Any:
    from fallgate.providers.openai.http import transport  # the HTTP library openai uses

    return transport.http.Request("POST", "https://p0.test/v1/chat/completions")


# -- an attempt cut by the turn's deadline ----------------------------------------------------


def test_the_total_bound_says_which_setting_cut_the_attempt():
    """The words of the total bound: ``attempt_timeout`` when it was the whole of it;
    the turn's deadline (its value, the time that was left, rounded) when that was less."""
    whole = AttemptBound(1.0, 1024, attempt_timeout=1.0, deadline=2.5)
    whole.tripped = "time"
    assert str(whole.error()) == "attempt exceeded its 1 s total time bound"
    for left, shown in ((0.454679, "0.45"), (0.0102295, "0.01"), (0.00539019, "0.0054")):
        cut = AttemptBound(left, 1024, attempt_timeout=1.0, deadline=2.5)
        cut.tripped = "time"
        assert str(cut.error()) == (
            f"cut at the turn's 2.5 s deadline ({shown} s were left; attempt_timeout 1 s)"
        )


def test_a_silent_target_cut_at_the_deadline_is_reported_as_the_deadlines_cut(fault_server):
    """One silent target, attempt_timeout 1 s, deadline 1.5 s: the first attempt runs out
    of its attempt_timeout, the retry of what the deadline leaves (about 0.5 s). Each
    says what cut it; neither invents a "0.49... s total time bound"."""
    silent = {"kind": "timeout", "seconds": 5}
    fault_server.script({"models": {"m0": [silent, silent]}})
    policy = chain(
        "m0",
        server=fault_server,
        max_attempts=2,
        recover_transport=False,
        deadline=1.5,
        attempt_timeout=1,
        backoff={"initial": 0.01, "cap": 0.01},
    )
    with Fallgate(policy) as gate, pytest.raises(TurnFailed) as failed:
        gate.chat.completions.create(messages=MSG)
    details = [str(e.detail) for e in failed.value.trace if e.source == "primary"]
    assert any("attempt exceeded its 1 s total time bound" in d for d in details)
    last = failed.value.reasons["primary"]
    assert re.search(
        r"cut at the turn's 1\.5 s deadline \(0\.\d\d? s were left; attempt_timeout 1 s\)", last
    ), last
    assert "total time bound" not in last


# -- a hung connect names connect_timeout -----------------------------------------------------


@pytest.fixture
def hung_connect() -> Iterator[str]:
    """A base_url whose connects hang: a listener that never accepts, its accept queue
    full (later SYNs are dropped, as for an unroutable host)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.socket()
    filler.connect(("127.0.0.1", port))
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        filler.close()
        listener.close()


def _connect_policy(base_url: str) -> Policy:
    return Policy.from_dict(
        {
            "primary": {
                "provider": "fault",
                "model": "p",
                "base_url": base_url,
                "api_key": "sk-test-000000000000",
            },
            "deadline": 1.2,
            "attempt_timeout": 1,
            "connect_timeout": 0.3,
            "max_attempts": 1,
            "recover_transport": False,
        }
    )


def _sync(policy: Policy) -> None:
    with Fallgate(policy) as gate:
        gate.chat.completions.create(messages=MSG)


def _sync_stream(policy: Policy) -> None:
    with Fallgate(policy) as gate:
        list(gate.chat.completions.create(messages=MSG, stream=True))


def _async(policy: Policy) -> None:
    async def main() -> None:
        async with AsyncFallgate(policy) as gate:
            await gate.chat.completions.create(messages=MSG)

    asyncio.run(main())


def _http_client(policy: Policy) -> None:
    with fallgate.http_client(policy) as http:
        sdk = openai.OpenAI(api_key="unused", http_client=http, max_retries=0)
        sdk.chat.completions.create(model="p", messages=MSG)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "call",
    [_sync, _sync_stream, _async, _http_client],
    ids=["sync", "sync-stream", "async", "http_client"],
)
def test_a_hung_connect_is_named_as_the_connect_timeout(
    hung_connect: str, call: Callable[[Policy], None]
) -> None:
    """The SDK's own connect timer is given the same 0.3 s as fallgate's connect bound and
    fires on it: the fault is still the bound's, named (phase and field), on every surface."""
    t0 = time.monotonic()
    with pytest.raises((TurnFailed, openai.APIStatusError)) as failed:
        call(_connect_policy(hung_connect))
    assert "connecting took over 0.3 s (connect_timeout)" in str(failed.value)
    assert "(ConnectTimeout" not in str(failed.value)
    assert time.monotonic() - t0 < 1.2 + 0.6


# -- an embeddings reply with fewer vectors than inputs ---------------------------------------

INPUTS = [f"doc {i}" for i in range(5)]
ONE_VECTOR = {
    "object": "list",
    "model": "a",
    "usage": {"prompt_tokens": 5, "total_tokens": 5},
    "data": [{"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}],
}


def _embeddings_policy(srv: FaultServer) -> Policy:
    return chain("a", "b", server=srv)


def _embed_wrapper(policy: Policy, inputs: Any) -> Any:
    with Fallgate(policy) as gate:
        return gate.embeddings.create(input=inputs, encoding_format="float")


def _embed_async(policy: Policy, inputs: Any) -> Any:
    async def main() -> Any:
        async with AsyncFallgate(policy) as gate:
            return await gate.embeddings.create(input=inputs, encoding_format="float")

    return asyncio.run(main())


def _embed_http_client(policy: Policy, inputs: Any) -> Any:
    with fallgate.http_client(policy) as http:
        sdk = openai.OpenAI(api_key="unused", http_client=http, max_retries=0)
        return sdk.embeddings.create(model="a", input=inputs, encoding_format="float")


EMBEDDERS = pytest.mark.parametrize(
    "embed",
    [_embed_wrapper, _embed_async, _embed_http_client],
    ids=["wrapper", "async", "http_client"],
)


@EMBEDDERS
def test_one_vector_for_five_inputs_is_a_malformed_reply_and_the_fallback_answers(
    fault_server: FaultServer, embed: Callable[[Policy, Any], Any]
) -> None:
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "status", "status": 200, "body": ONE_VECTOR}],
                "b": [{"kind": "answer"}],
            }
        }
    )
    with instant_waits():
        reply = embed(_embeddings_policy(fault_server), INPUTS)
    assert [r.model for r in fault_server.requests] == ["a", "b"]
    assert reply.model == "b" and len(reply.data) == len(INPUTS)


@EMBEDDERS
def test_one_vector_for_one_input_is_the_answer(
    fault_server: FaultServer, embed: Callable[[Policy, Any], Any]
) -> None:
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "status", "status": 200, "body": ONE_VECTOR}],
                "b": [{"kind": "answer"}],
            }
        }
    )
    with instant_waits():
        reply = embed(_embeddings_policy(fault_server), "one doc")
    assert [r.model for r in fault_server.requests] == ["a"]
    assert reply.model == "a" and len(reply.data) == 1


def test_the_short_batch_is_named_in_the_fallback_reason(fault_server: FaultServer) -> None:
    fault_server.script(
        {"models": {"a": [{"kind": "status", "status": 200, "body": ONE_VECTOR}] * 2}}
    )
    policy = chain("a", server=fault_server, max_attempts=1)
    with instant_waits(), Fallgate(policy) as gate, pytest.raises(TurnFailed) as failed:
        gate.embeddings.create(input=INPUTS, encoding_format="float")
    why = failed.value.reasons["primary"]
    assert "overloaded" in why and "1 vector(s) for 5 inputs" in why


# -- a broken stream no text prefix can carry -------------------------------------------------


def _chunk(delta: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-a",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "a",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }


TOOL_CUT = [
    _chunk({"role": "assistant", "content": None}),
    _chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_A",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        }
    ),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}),
]
WEATHER = {"name": "get_weather", "parameters": {"type": "object"}}
TOOLS = [{"type": "function", "function": WEATHER}]


def _stream_tools(policy: Policy, flavour: str, health: HealthStore | None = None) -> TurnFailed:
    kw: dict[str, Any] = {"messages": MSG, "tools": TOOLS, "stream": True}
    if flavour == "sync":
        with Fallgate(policy, health=health) as gate:
            try:
                for _ in gate.chat.completions.create(**kw):
                    pass
            except TurnFailed as e:
                return e
        raise AssertionError("the stream did not fail")

    async def main() -> TurnFailed:
        async with AsyncFallgate(policy, health=health) as gate:
            try:
                async for _ in await gate.chat.completions.create(**kw):
                    pass
            except TurnFailed as e:
                return e
        raise AssertionError("the stream did not fail")

    return asyncio.run(main())


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_tool_call_stream_cut_mid_arguments_fails_at_its_break_with_true_reasons(
    fault_server: FaultServer, flavour: str
) -> None:
    """Both targets take an assistant prefix, but a text prefix cannot carry a tool call:
    the turn fails at the break with the cut as its error; the primary was asked once, the
    fallback never, and the reasons say exactly that (no "bad_request" attempts). No
    continuation is asked for: the trace goes from the break straight to `failed`, and no
    retry token is taken for it."""
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "sse", "events": TOOL_CUT, "done": False}],
                "b": [{"kind": "answer"}],
            }
        }
    )
    policy = chain(
        {"model": "a", "assistant_prefix": True},
        {"model": "b", "assistant_prefix": True},
        server=fault_server,
    )
    health = HealthStore()
    with instant_waits():
        failed = _stream_tools(policy, flavour, health)
    assert [r.model for r in fault_server.requests] == ["a"]
    edges = [(e.source, e.event, e.dest) for e in failed.trace]
    assert edges[-1] == ("primary", "stream_interrupted", "failed"), edges
    assert not any("continuing" in e.dest for e in failed.trace), edges
    primary = policy.targets[0].key
    assert health.retry_tokens(primary, policy) == policy.retry_budget.size
    assert failed.last_outcome is not None
    assert failed.last_outcome.kind is OutcomeKind.STREAM_INTERRUPTED
    assert failed.reasons["primary"].startswith("attempted 1x, last: stream_interrupted")
    assert failed.reasons["fallback_1"].startswith("not tried: ")
    assert "a text prefix cannot continue it" in failed.reasons["fallback_1"]
    assert "bad_request" not in str(failed) and "bad_request" not in str(failed.reasons)
    assert "cannot be continued" in str(failed)
    visited = [e.dest for e in failed.trace]
    assert "fallback_1_continuing" not in visited and visited[-1] == "failed"


@EMBEDDERS
def test_two_vectors_for_one_input_twice_are_no_answer_for_two_inputs(
    fault_server: FaultServer, embed: Callable[[Policy, Any], Any]
) -> None:
    """Two vectors for two inputs, but both say they are input 0: input 1 has none."""
    twice = {**ONE_VECTOR, "data": ONE_VECTOR["data"] * 2}
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "status", "status": 200, "body": twice}],
                "b": [{"kind": "answer"}],
            }
        }
    )
    with instant_waits():
        reply = embed(_embeddings_policy(fault_server), ["x", "y"])
    assert [r.model for r in fault_server.requests] == ["a", "b"]
    assert sorted(d.index for d in reply.data) == [0, 1]
