"""A one-second blip must not become an outage: the breaker waits for its probe.

One target, a server that drops every connection for a second, many concurrent async
turns through `AsyncFallgate` (the real openai SDK over loopback), and at the same
moment the same number of turns through the bare SDK (``max_retries=2``) against a
server of its own with the same blip. On the code before the breaker's wait, every
fallgate turn ended within ~2.5 s with "primary not attempted: primary's breaker opened
(...s left)" while most of its deadline was left (0 of 1,000 answered, and 0 of 200
here), where the SDK answered them all (200 of 200 here): a retry refused by the
breaker ended the turn instead of waiting for the probe's verdict. With that wait, 197
of 200: the three turns whose retries the emptied retry budget refused while the breaker
was still closed failed with their deadline left ("the retry budget of primary is
empty"), and their failures were what opened it. Now such a refusal trips the breaker
and waits for the same verdict: fallgate answers at least as many turns as the bare SDK
(200 of 200 in 6 of 6 runs at a load of 5-8 on 2 cores; the SDK 200).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import openai
import pytest

from fallgate import AsyncFallgate, HealthStore, TurnFailed, TurnResult
from fallgate.testing import FaultServer

from helpers import chain

pytestmark = pytest.mark.slow  # 200 concurrent turns through a blip, beside the bare SDK's

TURNS = 200
BLIP = 1.0  # seconds during which every connection is dropped
MSG = [{"role": "user", "content": "hi"}]
DOWN: dict[str, Any] = {"default": {"kind": "drop"}}
UP: dict[str, Any] = {"default": {"kind": "answer", "text": "ok"}}


async def _fallgate(gate: AsyncFallgate) -> list[TurnResult | BaseException]:
    return await asyncio.gather(
        *(gate.arun(messages=MSG) for _ in range(TURNS)), return_exceptions=True
    )


async def _bare(client: openai.AsyncOpenAI) -> list[Any]:
    return await asyncio.gather(
        *(client.chat.completions.create(model="m", messages=MSG) for _ in range(TURNS)),  # type: ignore[arg-type]
        return_exceptions=True,
    )


@pytest.mark.timeout(180)
def test_a_one_second_blip_answers_at_least_as_many_turns_as_the_bare_sdk() -> None:
    with FaultServer(DOWN) as ours, FaultServer(DOWN) as theirs:
        # the 10 s attempt timeout and 30 s deadline; its 5 s breaker span scaled
        # down to 1 s (a waiter for another turn's probe wakes at the end of its lease,
        # attempt_timeout + 1 s: with 3 s / 10 s, a loaded machine whose server took 2.6 s
        # to drop a connection left the last waiters too little deadline)
        policy = chain("m", server=ours, attempt_timeout=10, deadline=30, cooldown={"initial": 1.0})

        async def main() -> tuple[list[Any], list[Any]]:
            async with AsyncFallgate(policy, health=HealthStore()) as gate:
                async with openai.AsyncOpenAI(
                    base_url=theirs.base_url, api_key="sk-test", max_retries=2
                ) as client:
                    return await asyncio.gather(_fallgate(gate), _bare(client))

        stop = threading.Event()

        def blip(srv: FaultServer) -> None:
            """Heal `srv` BLIP seconds after its first request (the blip is the server's)."""
            while srv.count("m") == 0 and not stop.wait(0.005):
                pass
            if not stop.wait(BLIP):
                srv.script(UP)

        healers = [threading.Thread(target=blip, args=(s,), daemon=True) for s in (ours, theirs)]
        for h in healers:
            h.start()
        try:
            ours_res, theirs_res = asyncio.run(main())
        finally:
            stop.set()
            for h in healers:
                h.join()
    answered = [r for r in ours_res if isinstance(r, TurnResult)]
    failed = [r for r in ours_res if isinstance(r, TurnFailed)]
    assert len(answered) + len(failed) == TURNS, [
        r for r in ours_res if not isinstance(r, TurnResult | TurnFailed)
    ]
    bare = sum(1 for r in theirs_res if not isinstance(r, BaseException))
    why = failed[0].args[0] if failed else ""
    assert bare > 0, "the blip outlasted the bare SDK's retries: nothing to compare"
    # Every turn the breaker or the retry budget held back waited for the probe's verdict
    # and was answered: the breaker sheds load, it never fails a turn that has time.
    assert len(answered) >= bare, (len(answered), bare, why)
    assert all("breaker opened" not in str(f) and "probing" not in str(f) for f in failed), why
    assert all("retry budget" not in str(f) for f in failed), why
    assert all(r.value.choices[0].message.content == "ok" for r in answered)
