"""Pacing end to end: the real openai SDK against the fault server's real rate limits
(per key request and token buckets, their headers on every reply, 429 when empty)."""

from __future__ import annotations

import re
import time

import openai
import pytest
from fallgate.fsm import HealthStore, TurnFailed
from fallgate.fsm.catalogue.ratelimit import parse_limits
from fallgate.fsm.health.headroom import UNNAMED_RESET
from fallgate.providers import Fallgate
from fallgate.providers.testing import FaultServer

from helpers import chain

HELLO = [{"role": "user", "content": "hello there"}]


def test_the_fault_server_tells_its_limits_and_answers_429_when_a_bucket_is_empty() -> None:
    with FaultServer(limits={"m": {"requests": 2, "tokens": 1000, "window": 30}}) as srv:
        sdk = openai.OpenAI(base_url=srv.base_url, api_key="sk-a", max_retries=0)
        other = openai.OpenAI(base_url=srv.base_url, api_key="sk-b", max_retries=0)
        with sdk, other:
            _limits_told(srv, sdk, other)


def _limits_told(srv: FaultServer, sdk: openai.OpenAI, other: openai.OpenAI) -> None:
    first = sdk.chat.completions.with_raw_response.create(model="m", messages=HELLO)
    said = parse_limits(first.headers, time.time())
    assert said is not None and said.requests_remaining == 1 and said.requests_limit == 2
    anthropic = parse_limits(first.headers, time.time(), "anthropic")
    assert anthropic is not None and anthropic.requests_remaining == 1
    assert anthropic.requests_reset is not None and 28 < anthropic.requests_reset <= 30
    sdk.chat.completions.create(model="m", messages=HELLO)
    with pytest.raises(openai.RateLimitError) as e:
        sdk.chat.completions.create(model="m", messages=HELLO)
    assert 28 <= int(e.value.response.headers["retry-after"]) <= 30
    # another key has its own buckets
    other.chat.completions.create(model="m", messages=HELLO)
    assert srv.buckets.refused == {"m": 1} and srv.buckets.charged == {"m": 3}


def test_a_paced_turn_never_calls_a_key_its_provider_said_is_empty() -> None:
    """Two keys of 5 requests each per window, then the fallback: every one of 30 turns
    answered, the primary's 10 requests all used, no 429 received."""
    limits = {"m0": {"requests": 5, "window": 30}, "m1": {"requests": 100, "window": 30}}
    with FaultServer(limits=limits) as srv:
        gate = Fallgate(chain("m0", "m1", keys=2, server=srv), health=HealthStore())
        with gate:
            models = [gate.chat.completions.create(messages=HELLO).model for _ in range(30)]
        assert models == ["m0"] * 10 + ["m1"] * 20
        assert srv.buckets.refused == {}
        assert {r.api_key for r in srv.requests if r.model == "m0"} == {
            t.resolve("primary") for t in gate.policy.targets[0].pool()
        }


def test_without_pacing_the_same_turns_hit_the_wall() -> None:
    """The contrast (and what the test above would see if pacing were broken): each 429 is
    a request the provider refused before the key was benched."""
    limits = {"m0": {"requests": 5, "window": 30}, "m1": {"requests": 100, "window": 30}}
    with FaultServer(limits=limits) as srv:
        policy = chain("m0", "m1", keys=2, server=srv, pacing=False)
        with Fallgate(policy, health=HealthStore()) as gate:
            for _ in range(30):
                gate.chat.completions.create(messages=HELLO)
        assert srv.buckets.refused.get("m0", 0) >= 2


def test_a_paced_turn_waits_for_the_reset_when_nothing_else_has_headroom() -> None:
    """One target, one key, 3 requests per 0.6 s window: the 4th turn waits for the reset
    (within retry_after_cap and the deadline) instead of getting a 429."""
    with FaultServer(limits={"m0": {"requests": 3, "window": 0.6}}) as srv:
        start = time.monotonic()
        with Fallgate(chain("m0", server=srv), health=HealthStore()) as gate:
            for _ in range(7):
                gate.chat.completions.create(messages=HELLO)
        took = time.monotonic() - start
        assert srv.buckets.refused == {}
        assert took >= 1.0  # two resets waited for


def test_tokens_count_too_and_the_estimate_includes_max_tokens() -> None:
    """A token bucket of 100 per window: requests asking max_tokens=40 fit two per key."""
    limits = {"m0": {"tokens": 100, "window": 30}, "m1": {"requests": 100, "window": 30}}
    with FaultServer(limits=limits) as srv:
        with Fallgate(chain("m0", "m1", server=srv), health=HealthStore()) as gate:
            ask = gate.chat.completions.create
            models = [ask(messages=HELLO, max_tokens=40).model for _ in range(4)]
        assert models == ["m0", "m0", "m1", "m1"]
        assert srv.buckets.refused == {}


def test_a_turn_with_every_key_out_of_headroom_beyond_the_cap_says_which_limit() -> None:
    """One key of one request per hour: the second turn sends nothing and fails at once,
    saying which limit of which key is used up and when it resets (not "cooling")."""
    with FaultServer(limits={"m0": {"requests": 1, "window": 3600}}) as srv:
        with Fallgate(chain("m0", server=srv), health=HealthStore()) as gate:
            gate.chat.completions.create(messages=HELLO)
            start = time.monotonic()
            with pytest.raises(TurnFailed) as e:
                gate.chat.completions.create(messages=HELLO)
        assert time.monotonic() - start < 1.0  # not waited: the reset is beyond the cap
        text = str(e.value)
        assert "out of headroom" in text and "the first free is primary" in text, text
        assert re.search(r"key#1: requests 0 of 1 left, resets in 3(599|600)\.\d\ds", text), text
        assert srv.buckets.refused == {} and srv.buckets.charged == {"m0": 1}


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "asyncio"])
def test_a_callers_own_client_factory_is_paced_too(asynchronous: bool) -> None:
    """The replies of clients a caller's ``client_factory`` builds are read as well (the
    pool hooks every client it builds): the primary's 4 requests used, then the fallback,
    no 429."""
    import asyncio

    limits = {"m0": {"requests": 4, "window": 30}, "m1": {"requests": 100, "window": 30}}
    with FaultServer(limits=limits) as srv:
        policy = chain("m0", "m1", server=srv)
        if asynchronous:
            from fallgate.providers import AsyncFallgate

            def afactory(target, api_key):
                return openai.AsyncOpenAI(base_url=target.base_url, api_key=api_key)

            async def turns() -> list[str]:
                async with AsyncFallgate(
                    policy, health=HealthStore(), client_factory=afactory
                ) as gate:
                    return [
                        (await gate.chat.completions.create(messages=HELLO)).model for _ in range(8)
                    ]

            models = asyncio.run(turns())
        else:

            def factory(target, api_key):
                return openai.OpenAI(base_url=target.base_url, api_key=api_key)

            with Fallgate(policy, health=HealthStore(), client_factory=factory) as gate:
                models = [gate.chat.completions.create(messages=HELLO).model for _ in range(8)]
        assert models == ["m0"] * 4 + ["m1"] * 4
        assert srv.buckets.refused == {}


@pytest.mark.parametrize("reset", ["soon", None], ids=["unreadable reset", "no reset"])
def test_a_key_said_empty_without_a_readable_reset_is_held_a_moment_not_for_good(reset) -> None:
    """A reply says "no requests left" and names no reset it can be read by: the key is
    held for `UNNAMED_RESET` (the next turn goes to the fallback), then called again; a
    key is never lost for good to a reply that did not say until when."""
    headers = {"x-ratelimit-remaining-requests": "0"}
    if reset is not None:
        headers["x-ratelimit-reset-requests"] = reset
    with FaultServer() as srv:
        srv.script(
            {
                "models": {"m0": [{"kind": "answer", "text": "said", "headers": headers}]},
                "default": {"kind": "answer", "text": "ok"},
            }
        )
        policy = chain("m0", "m1", server=srv, provider="openai")
        with Fallgate(policy, health=HealthStore()) as gate:
            ask = gate.chat.completions.create
            assert ask(messages=HELLO).model == "m0"
            assert ask(messages=HELLO).model == "m1"  # held: the provider said it is empty
            time.sleep(UNNAMED_RESET + 0.1)
            assert [ask(messages=HELLO).model for _ in range(2)] == ["m0", "m0"]
        assert srv.count("m0") == 3
