"""Hostile servers drawn at random, end to end: whatever the targets of a chain do, a
turn ends in time, as a complete answer or as a `TurnFailed` that gives every target a
reason; and failures that come back at once never keep a healthy target from answering.

The real SDK over real HTTP to one fault server on loopback, re-scripted for each
example; bounds of tenths of a second. Hypothesis draws each target's script from the
fault server's shapes (statuses, drops, malformed bodies, silence, trickles, keep-alives,
endless bodies, streams that cut, stall or send an error event) and shrinks a failure to
the shortest scripts that show it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fallgate.fsm import HealthStore
from fallgate.providers.testing.fault_server import FaultServer
from hypothesis import given, settings
from hypothesis import strategies as st

from fallgate import AsyncFallgate, Fallgate, TurnFailed

from helpers import achat_text, chain, chat_text, no_collector_pauses

MESSAGES = [{"role": "user", "content": "hi"}]
MODELS = ("m0", "m1", "m2")
NAMES = ("primary", "fallback_1", "fallback_2")
#: What the targets answer once their scripts run out, and the slow answer's text.
ANSWERS = ("ok", "slow")
#: Past the deadline a turn may end (the hard deadline: on a loaded 2-core machine the
#: worst of 300 random examples here ended 2 ms past it; the rest is for a scheduling
#: pause). Less than one attempt's bound, so an attempt let run past it is caught.
SLACK = 0.25

#: Failures that come back at once: each rotates, retries or falls back (none ends a turn).
FAST = [
    {"kind": "status", "status": 429},
    {"kind": "status", "status": 429, "headers": {"retry-after": "0"}},
    {"kind": "status", "status": 429, "headers": {"retry-after": "3"}},
    {"kind": "status", "status": 503},
    {"kind": "status", "status": 500},
    {"kind": "status", "status": 401},
    {"kind": "status", "status": 404},
    {"kind": "drop"},
    {"kind": "empty"},
    {"kind": "invalid_json"},
]
#: Servers that take their time, or never finish (seconds beyond any deadline here).
SLOW = [
    {"kind": "timeout", "seconds": 5},
    {"kind": "trickle_headers", "interval": 0.1, "seconds": 3},
    {"kind": "trickle_body", "interval": 0.1, "seconds": 3},
    {"kind": "keepalive", "interval": 0.1, "seconds": 3},
    {"kind": "endless", "bytes": 4096, "interval": 0.05, "seconds": 3},
    {"kind": "answer", "text": "slow", "delay": 0.1},
    {"kind": "answer", "text": "slow", "delay": 0.6},
]
#: Failures that end a turn by design (the caller's request), and broken bodies.
ENDING = [
    {"kind": "status", "status": 400},
    {
        "kind": "status",
        "status": 413,
        "body": {"error": {"message": "maximum context length exceeded"}},
    },
    {"kind": "drop_mid_body"},
]
#: Streams that break: before their first content (the turn's to retry) or after it
#: (committed: continued where a target takes a prefix, else a clear error).
BROKEN_STREAMS = [
    {"kind": "stream", "chunks": 3, "then": "cut"},
    {"kind": "stream", "chunks": 2, "then": "hang", "seconds": 3},
    {"kind": "stream", "chunks": 2, "then": "error"},
    {"kind": "stream", "chunks": 0, "then": "error"},
]


@pytest.fixture(scope="module")
def server() -> Iterator[FaultServer]:
    with FaultServer({"default": {"kind": "answer", "text": "ok"}}) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _scaled_bounds() -> Iterator[None]:
    with no_collector_pauses():
        yield


def _policy(server: FaultServer, keys: list[int], deadline: float) -> Any:
    return chain(
        *MODELS,
        keys=keys,
        server=server,
        attempt_timeout=0.3,
        connect_timeout=0.2,
        first_byte_timeout=0.3,
        first_event_timeout=0.3,
        stream_idle_timeout=0.3,
        deadline=deadline,
        max_attempts=2,
        backoff={"initial": 0.05, "cap": 0.2},
    )


def _turns(policy: Any, n: int, *, use_async: bool, stream: bool) -> list[tuple[Any, float]]:
    """`n` turns one after the other on one client (one health store): each one's text
    or exception, and how long it took."""
    health = HealthStore()
    out: list[tuple[Any, float]] = []

    async def amain() -> None:
        async with AsyncFallgate(policy, health=health) as gate:
            for _ in range(n):
                t0 = time.monotonic()
                try:
                    result: Any = await achat_text(gate, MESSAGES, stream=stream)
                except Exception as e:
                    result = e
                out.append((result, time.monotonic() - t0))

    if use_async:
        asyncio.run(amain())
    else:
        with Fallgate(policy, health=health) as gate:
            for _ in range(n):
                t0 = time.monotonic()
                try:
                    result = chat_text(gate, MESSAGES, stream=stream)
                except Exception as e:
                    result = e
                out.append((result, time.monotonic() - t0))
    return out


@settings(max_examples=40, deadline=None)
@given(
    healthy=st.integers(0, 2),
    failures=st.lists(st.lists(st.sampled_from(FAST), min_size=1, max_size=4), min_size=2),
    keys=st.lists(st.integers(1, 2), min_size=3, max_size=3),
    use_async=st.booleans(),
    stream=st.booleans(),
)
def test_failures_that_come_back_at_once_never_keep_a_healthy_target_from_answering(
    server, healthy, failures, keys, use_async, stream
):
    """Property: with every target before a healthy one failing at once (rate limits
    with or without Retry-After, 5xx, auth, not found, dropped connections, malformed
    bodies, in any order and number), the turn is answered, by the healthy target or an
    earlier one whose script ran out, and no target after it is asked."""
    script = {m: failures[i] for i, m in enumerate(MODELS[:healthy])}
    server.script({"default": {"kind": "answer", "text": "ok"}, "models": script})
    [(result, seconds)] = _turns(_policy(server, keys, 6.0), 1, use_async=use_async, stream=stream)
    assert result == "ok", (result, server.counts)
    assert all(server.count(m) == 0 for m in MODELS[healthy + 1 :]), server.counts
    assert seconds < 6.0


_ANY_STEP = st.sampled_from(FAST + SLOW + ENDING + BROKEN_STREAMS)


@settings(max_examples=60, deadline=None)  # ~15 s: the slow servers are waited out
@given(
    scripts=st.lists(st.lists(_ANY_STEP, max_size=4), min_size=3, max_size=3),
    keys=st.lists(st.integers(1, 2), min_size=3, max_size=3),
    turns=st.integers(1, 3),
    use_async=st.booleans(),
    stream=st.booleans(),
)
def test_whatever_the_servers_do_a_turn_ends_in_time_with_an_answer_or_a_reason_per_target(
    server, scripts, keys, turns, use_async, stream
):
    """Property: whatever each target does on each request, every turn ends within its
    deadline (plus scheduling slack), as a complete answer (a streamed one too: a break
    after content is never passed off as the whole text) or as a `TurnFailed` that says
    why for every target of the chain; nothing else is raised."""
    deadline = 1.2
    models = dict(zip(MODELS, scripts, strict=True))
    server.script({"default": {"kind": "answer", "text": "ok"}, "models": models})
    for result, seconds in _turns(
        _policy(server, keys, deadline), turns, use_async=use_async, stream=stream
    ):
        assert seconds <= deadline + SLACK, (seconds, result)
        if isinstance(result, BaseException):
            assert isinstance(result, TurnFailed), repr(result)
            assert set(NAMES) <= set(result.reasons), result.reasons
        else:
            assert result in ANSWERS, result
    assert not server.errors
