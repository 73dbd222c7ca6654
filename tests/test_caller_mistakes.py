"""A mistake in the caller's code is the caller's: Python's or the SDK's own exception
at once, never `TurnFailed(bad_request)` and never a request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fallgate.fsm import PolicyError, TurnFailed
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]


def test_an_unknown_keyword_to_create_is_a_type_error_before_any_request(
    fault_server: FaultServer,
) -> None:
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
            gate.chat.completions.create(messages=MSG, temprature=0.2)
        with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
            gate.responses.create(input="hi", bogus=1)
    assert fault_server.requests == []


def test_a_message_the_sdk_cannot_serialise_raises_its_type_error(
    fault_server: FaultServer,
) -> None:
    bad = [{"role": "user", "content": object()}]
    with Fallgate(chain("a", "b", server=fault_server)) as gate:
        with pytest.raises(TypeError, match="not JSON serializable") as info:
            gate.chat.completions.create(messages=bad)
        assert not isinstance(info.value, TurnFailed)
        with pytest.raises(TypeError, match="not JSON serializable"):
            for _ in gate.chat.completions.create(messages=bad, stream=True):
                pass
    assert fault_server.requests == []


def test_a_policy_file_path_is_accepted_and_a_missing_one_named(
    fault_server: FaultServer, tmp_path: Path
) -> None:
    path = tmp_path / "fallgate.toml"
    path.write_text(
        f'[primary]\nprovider = "fault"\nmodel = "a"\nbase_url = "{fault_server.base_url}"\n'
        'api_key = "sk-test-file-key"\n'
    )
    with Fallgate(str(path)) as gate:
        assert gate.chat.completions.create(messages=MSG).model == "a"
    with Fallgate(path) as gate:
        assert gate.policy.targets[0].model == "a"
    with pytest.raises(PolicyError, match=r"nowhere\.toml: cannot read policy file"):
        Fallgate(str(tmp_path / "nowhere.toml"))
    with pytest.raises(TypeError, match="Policy or the path of a policy file"):
        Fallgate(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("max_retries", "set max_attempts in the policy"),
        ("api_key", "keys come from the policy"),
        ("base_url", "endpoint comes from the policy"),
        ("http_client", "client_factory="),
    ],
)
def test_an_sdk_client_option_says_what_to_set_instead(
    fault_server: FaultServer, option: str, says: str
) -> None:
    policy = chain("a", server=fault_server)
    for gate in (Fallgate, AsyncFallgate):
        with pytest.raises(TypeError, match=f"{gate.__name__}\\({option}=...\\).*{says}"):
            gate(policy, **{option: 3})
    with pytest.raises(TypeError, match="unexpected keyword argument 'retries'"):
        Fallgate(policy, retries=3)  # type: ignore[call-arg]


def test_the_drivers_name_their_twin(fault_server: FaultServer) -> None:
    policy = chain("a", server=fault_server)
    with pytest.raises(AttributeError, match=r"AsyncFallgate has no run\(\): use `await gate.arun"):
        _ = AsyncFallgate(policy).run
    with Fallgate(policy) as gate, pytest.raises(AttributeError, match=r"use `gate.run\(...\)`"):
        _ = gate.arun


def test_one_async_gate_on_a_second_event_loop_says_so(fault_server: FaultServer) -> None:
    gate = AsyncFallgate(chain("a", server=fault_server))

    async def ask(close: bool) -> str:
        reply = await gate.chat.completions.create(messages=MSG)
        if close:
            await gate.aclose()
        return reply.choices[0].message.content or ""

    assert asyncio.run(ask(close=True)) == "ok"
    with pytest.raises(RuntimeError, match="first used on another event loop"):
        asyncio.run(ask(close=False))
    assert len(fault_server.requests) == 1


@pytest.mark.parametrize(
    "flavour, built, says",
    [
        ("sync", lambda t, k: "not a client", "got builtins.str"),
        ("sync", "async_sdk", "got openai.AsyncOpenAI"),
        ("asyncio", "sync_sdk", "got openai.OpenAI"),
    ],
)
def test_a_client_factory_that_returns_no_client_of_the_flavour_is_a_type_error_at_once(
    fault_server: FaultServer, flavour: str, built, says: str
) -> None:
    """A factory returning the wrong thing is the caller's mistake: a TypeError naming
    client_factory at the first attempt, no retries, no request, no fault charged to
    the target, and closing the wrapper afterwards raises nothing."""
    import openai

    made: list[object] = []

    def factory(target, key):
        if built == "async_sdk":
            c: object = openai.AsyncOpenAI(base_url=target.base_url, api_key=key)
        elif built == "sync_sdk":
            c = openai.OpenAI(base_url=target.base_url, api_key=key)
        else:
            c = built(target, key)
        made.append(c)
        return c

    policy = chain("a", "b", server=fault_server)
    if flavour == "sync":
        gate = Fallgate(policy, client_factory=factory)
        with pytest.raises(TypeError, match=r"client_factory must return an openai\.OpenAI") as e:
            gate.chat.completions.create(messages=MSG)
        gate.close()
        health = gate.health
    else:

        async def go() -> tuple[BaseException, object]:
            agate = AsyncFallgate(policy, client_factory=factory)
            with pytest.raises(TypeError, match=r"must return an openai\.AsyncOpenAI") as e:
                await agate.chat.completions.create(messages=MSG)
            await agate.aclose()
            return e.value, agate.health

        value, health = asyncio.run(go())
    text = str(e.value if flavour == "sync" else value)
    assert says in text and "for target primary" in text, text
    assert len(made) == 1  # one build, no retry, no fallback
    assert fault_server.requests == []
    assert health.target_until(policy.targets[0].key) == 0.0  # not benched
