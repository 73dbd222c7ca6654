"""`fallgate.http_client(policy)` bounds each attempt as the wrapper does: per phase
(connect, first byte / first event, total, idle between a started stream's events) and
its bytes, at the socket of the transports it builds; real SDK over real sockets to the
fault server (as tests/test_e2e_attempt_phases.py does for the wrapper).

Before these bounds, a silent primary was cut only at ``attempt_timeout`` (each phase's
timeout), a trickled body or a keep-alive-only stream never (every byte restarts a
read timeout)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import pytest
from fallgate.fsm import Policy
from fallgate.fsm.trace import TraceEvent
from fallgate.providers.openai.http.bounds import AttemptTimeout
from fallgate.providers.testing.fault_server import FaultServer
from test_embedded_client import MSG, PLACEHOLDER, sdk
from test_embedded_client import _closed as _closed  # every SDK client a test made is closed

import fallgate

from helpers import chain

SLACK = 0.6  # a loaded 2-core machine
FAST = {"kind": "answer", "text": "fallback answer"}


def _policy(server: FaultServer, **fields: Any) -> Policy:
    fields = {"max_attempts": 1, "recover_transport": False, "deadline": 6, **fields}
    return chain("slow", "fast", server=server, **fields)


def _primary_detail(events: list[TraceEvent]) -> str:
    e = next(e for e in events if e.source == "primary" and e.event != "start")
    return str(e.detail)


def test_a_silent_primary_is_cut_at_the_first_byte_bound(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"slow": [{"kind": "timeout", "seconds": 8}], "fast": [FAST]}})
    events: list[TraceEvent] = []
    client = sdk(_policy(fault_server, attempt_timeout=3, first_byte_timeout=0.4), events)
    t0 = time.monotonic()
    reply = client.chat.completions.create(model="slow", messages=MSG)
    took = time.monotonic() - t0
    assert reply.choices[0].message.content == "fallback answer"
    assert "no first byte within 0.4 s (first_byte_timeout)" in _primary_detail(events)
    assert 0.4 <= took < 0.4 + SLACK


def test_a_trickled_body_is_cut_at_the_attempts_total(fault_server: FaultServer) -> None:
    """Headers at once, then a byte every 0.1 s for 8 s: each read is quick, so only the
    attempt's total (1.2 s) cuts it."""
    trickle = {"kind": "trickle_body", "interval": 0.1, "seconds": 8}
    fault_server.script({"models": {"slow": [trickle], "fast": [FAST]}})
    events: list[TraceEvent] = []
    client = sdk(_policy(fault_server, attempt_timeout=1.2, first_byte_timeout=0.3), events)
    t0 = time.monotonic()
    reply = client.chat.completions.create(model="slow", messages=MSG)
    took = time.monotonic() - t0
    assert reply.choices[0].message.content == "fallback answer"
    assert "attempt exceeded its 1.2 s total time bound" in _primary_detail(events)
    assert 1.2 <= took < 1.2 + SLACK


def test_a_started_stream_is_cut_at_the_idle_bound_keepalives_not_counting(
    fault_server: FaultServer,
) -> None:
    """Two chunks (committed: the SDK has them), then only keep-alive comments: the idle
    bound (0.5 s) cuts it, well before attempt_timeout (3 s) and the server's 8 s (a
    read timeout alone restarts at every comment); the SDK raises what it raises for
    any cut after the commit, and nothing is sent again."""
    stalls = {"kind": "stream", "chunks": 2, "then": "keepalive", "seconds": 8, "interval": 0.1}
    fault_server.script({"models": {"slow": [stalls], "fast": [FAST]}})
    events: list[TraceEvent] = []
    client = sdk(_policy(fault_server, attempt_timeout=3, stream_idle_timeout=0.5), events)
    delivered: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(Exception) as err:
        for c in client.chat.completions.create(model="slow", messages=MSG, stream=True):
            delivered.append(c.choices[0].delta.content or "" if c.choices else "")
    took = time.monotonic() - t0
    assert "".join(delivered) == "chunk-1 chunk-2 "
    # the SDK's own error for the library's read timeout, as for any cut after the commit
    assert not isinstance(err.value, AttemptTimeout)
    assert isinstance(err.value, openai.APIConnectionError | TimeoutError) or (
        type(err.value).__module__.startswith("httpx")
    ), repr(err.value)
    assert 0.5 <= took < 0.5 + SLACK
    assert fault_server.counts == {"slow": 1}


def test_a_steady_stream_is_never_cut_at_the_first_event_bound(fault_server: FaultServer) -> None:
    """Events every 0.5 s (longer than first_event_timeout, 0.3 s; together longer than
    attempt_timeout, 1 s), within the idle bound (1 s): the whole answer."""
    steady = {"kind": "stream", "chunks": 4, "interval": 0.5}
    fault_server.script({"models": {"slow": [steady], "fast": [FAST]}})
    policy = _policy(
        fault_server, attempt_timeout=1, first_event_timeout=0.3, stream_idle_timeout=1
    )
    client = sdk(policy, [])
    stream = client.chat.completions.create(model="slow", messages=MSG, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "chunk-1 chunk-2 chunk-3 chunk-4 "
    assert fault_server.counts.get("fast", 0) == 0


def test_async_a_keepalive_only_stream_is_cut_at_the_first_event_bound(
    fault_server: FaultServer,
) -> None:
    """200 and keep-alive comments, never an event: the turn's (not committed), cut at
    first_event_timeout (0.4 s) and the fallback streams the answer."""
    alive = {"kind": "keepalive", "interval": 0.1, "seconds": 8}
    fault_server.script({"models": {"slow": [alive], "fast": [FAST]}})
    events: list[TraceEvent] = []
    policy = _policy(fault_server, attempt_timeout=3, first_event_timeout=0.4)

    async def main() -> tuple[str, float]:
        client = openai.AsyncOpenAI(
            api_key="sk-placeholder",
            base_url=PLACEHOLDER,
            http_client=fallgate.async_http_client(policy, on_transition=events.append),
        )
        t0 = time.monotonic()
        stream = await client.chat.completions.create(model="slow", messages=MSG, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        took = time.monotonic() - t0
        await client.close()
        return text, took

    text, took = asyncio.run(main())
    assert text == "fallback answer"
    assert "no first event within 0.4 s (first_event_timeout)" in _primary_detail(events)
    assert 0.4 <= took < 0.4 + SLACK
