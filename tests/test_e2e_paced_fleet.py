"""Pacing and routing under load tell the truth: the real openai SDK against the fault
server's rate limits, many turns at once.

- A reply's rate-limit headers are dated when its request was sent (the provider counts
  a request as it arrives): a slow reply does not hand out again what the requests sent
  since have taken.
- An attempt the turn's own deadline cut short of its attempt_timeout is no evidence
  against the target: it benches nothing.
- A target no request was sent to is never said to have been attempted.
- The router of a deployment group ranks a member out of headroom after one with room,
  so turns are counted on the member they run on.
"""

from __future__ import annotations

import asyncio
import collections
import re
from typing import Any

import pytest
from fallgate.fsm import HealthStore, Policy, TurnFailed
from fallgate.fsm.health.routes import routes_of
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.testing import FaultServer

from helpers import chain, key

HELLO = [{"role": "user", "content": "hello there"}]


async def _slow_replies_then_a_burst(srv: FaultServer, delay: float) -> None:
    policy = chain("m0", "m1", server=srv, deadline=5, attempt_timeout=3)
    async with AsyncFallgate(policy, health=HealthStore()) as gate:
        await gate.chat.completions.create(messages=HELLO)  # its headers: 9 of 10 left
        answer = {"kind": "answer", "text": "ok", "delay": delay}
        srv.script({"models": {"m0": [answer] * 50}, "default": {"kind": "answer"}})

        async def one(at: float) -> str:
            await asyncio.sleep(at)
            return (await gate.chat.completions.create(messages=HELLO)).model

        # 9 turns take the 9 requests left, spread out; once the first has answered, 20
        # more start together
        await asyncio.gather(
            *[one(0.08 * delay * i) for i in range(9)],
            *[one(delay + 0.05) for _ in range(20)],
        )


@pytest.mark.parametrize("delay", [0.2, 1.0], ids=["fast-replies", "slow-replies"])
def test_a_paced_key_sends_nothing_beyond_what_its_headers_allowed(delay: float) -> None:
    """Every request the headers allowed is used, none beyond: the first slow reply says
    what was left when its request arrived, and the 8 sent since are still taken off it."""
    limits = {"m0": {"requests": 10, "window": 30}, "m1": {"requests": 1000, "window": 30}}
    with FaultServer(limits=limits) as srv:
        asyncio.run(_slow_replies_then_a_burst(srv, delay))
        assert srv.buckets.charged["m0"] == 10
        assert srv.buckets.refused.get("m0", 0) == 0, srv.buckets.refused


RATE = {
    "kind": "status",
    "status": 429,
    "headers": {"retry-after-ms": "800"},
    "body": {"error": {"message": "rate limited", "type": "rate_limit_exceeded"}},
}


def test_attempts_the_deadline_cut_short_do_not_open_a_healthy_targets_breaker() -> None:
    """Three turns honour a Retry-After and are left 0.2 s for an answer that takes 0.5 s:
    each fails at its deadline, and the target, which answers in 50 ms, is still called."""
    with FaultServer() as srv:
        slowish = {"kind": "answer", "text": "ok", "delay": 0.5}
        fast = {"kind": "answer", "text": "ok", "delay": 0.05}
        srv.script({"models": {"m0": [RATE, slowish] * 3 + [fast] * 5}})
        policy = chain(
            "m0", keys=1, server=srv, deadline=1.0, attempt_timeout=1.0, backoff={"jitter": False}
        )
        health = HealthStore()
        with Fallgate(policy, health=health) as gate:
            for _ in range(3):
                with pytest.raises(TurnFailed) as e:
                    gate.chat.completions.create(messages=HELLO)
                assert "cut at the turn's 1 s deadline" in str(e.value), str(e.value)
            assert health.target_until(policy.targets[0].key) == 0.0  # not benched
            reply = gate.chat.completions.create(messages=HELLO)
            assert reply.choices[0].message.content == "ok"


#: Events that say an attempt was sent (anything the target answered, or a cancel).
_SENT = {
    "success",
    "transport",
    "rate_limited",
    "quota",
    "overloaded",
    "auth",
    "not_found",
    "context_too_long",
    "content_filtered",
    "bad_request",
    "stream_interrupted",
    "cancelled",
}


async def _crowd(srv: FaultServer) -> list[TurnFailed]:
    policy = chain("m0", server=srv, deadline=3, attempt_timeout=1)
    async with AsyncFallgate(policy, health=HealthStore()) as gate:
        await gate.chat.completions.create(messages=HELLO)

        async def one() -> TurnFailed | None:
            try:
                await gate.chat.completions.create(messages=HELLO)
            except TurnFailed as e:
                return e
            return None

        got = await asyncio.gather(*[one() for _ in range(60)])
    return [e for e in got if e is not None]


def test_a_target_no_request_was_sent_to_is_not_said_to_be_attempted() -> None:
    """60 turns on one key of 10 requests a second and a 3 s deadline: some run out of
    time waiting for headroom; each failure counts as attempts only what was sent (the
    store's refusals are not), and says which limit held it back."""
    failures: list[TurnFailed] = []
    for _ in range(3):
        with FaultServer(limits={"m0": {"requests": 10, "window": 1.0}}) as srv:
            failures = asyncio.run(_crowd(srv))
        if failures:
            break
    assert failures, "no turn failed: the crowd did not run out of headroom"
    for e in failures:
        sent = sum(1 for ev in e.trace if ev.source == "primary" and ev.event in _SENT)
        said = re.search(r"attempted (\d+)x", e.reasons.get("primary", ""))
        if said is not None:
            assert int(said.group(1)) == sent, str(e)
        else:
            assert sent == 0 and "headroom" in e.reasons["primary"], str(e)


EMPTY = {
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-limit-requests": "10",
    "x-ratelimit-reset-requests": "1s",
}


async def _group_play(a: FaultServer, b: FaultServer) -> tuple[Any, Any, Any]:
    members = [{"base_url": s.base_url, "api_key": key(i)} for i, s in enumerate((a, b))]
    policy = Policy.from_dict(
        {
            "primary": {"provider": "openai", "model": "m", "members": members},
            "deadline": 5,
            "attempt_timeout": 3,
        }
    )
    a.script(
        {
            "models": {"m": [{"kind": "answer", "text": "ok", "headers": EMPTY}]},
            "default": {"kind": "answer", "text": "ok"},
        }
    )
    b.script({"default": {"kind": "answer", "text": "ok", "delay": 1.5}})
    async with AsyncFallgate(policy, health=HealthStore()) as gate:
        first = await gate.arun(messages=HELLO)  # m1 answers: no requests left for 1 s
        assert first.target == "primary_m1"
        routes = routes_of(gate.health)
        long = [asyncio.create_task(gate.arun(messages=HELLO)) for _ in range(10)]
        await asyncio.sleep(0.2)
        busy = {t.name: routes.busy(t.key, 0) for t in policy.targets}
        await asyncio.sleep(1.0)  # m1's reset has passed: it is free and idle
        later = await asyncio.gather(*[gate.arun(messages=HELLO) for _ in range(4)])
        ran = collections.Counter(r.target for r in await asyncio.gather(*long))
    return busy, ran, collections.Counter(r.target for r in later)


def test_a_group_member_out_of_headroom_ranks_after_one_with_room() -> None:
    """m1 said it has no requests left for a second: the 10 turns then run on m2 and are
    counted there; once m1's reset has passed, the idle m1 takes the next turns."""
    with FaultServer() as a, FaultServer() as b:
        busy, ran, later = asyncio.run(_group_play(a, b))
    assert ran == {"primary_m2": 10}
    assert busy == {"primary_m1": 0, "primary_m2": 10}, busy
    assert later == {"primary_m1": 4}, later
