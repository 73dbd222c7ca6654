"""Hard time bounds, through the real SDK over real sockets (the fault server on loopback).

A slow server must not defeat the bounds: a server that trickles its headers or its
body, or sends keep-alives and never content, is cut at the attempt's total bound
(``attempt_timeout``, or what the deadline leaves), and the healthy fallback answers;
an endless body is cut at ``max_body_bytes``; a committed stream that goes quiet is cut
at ``stream_idle_timeout``; the deadline is a hard stop (no attempt starts after it, a
running one is cut at it), for one turn and for a thousand at once. Sync and asyncio.

The servers below keep trickling far longer than any bound (8 s and more): a turn
that ends before the bound it is given, plus scheduling slack, was cut by fallgate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fallgate import AsyncFallgate, Fallgate, TurnFailed

from helpers import chain

MESSAGES = [{"role": "user", "content": "hi"}]
SLACK = 1.5  # scheduling slack on a shared, loaded 2-core machine; a trickle lasts 8 s

#: Slow primaries: each would keep a turn busy for 8 s under per-read timeouts alone.
SLOW = {
    "trickled headers": {"kind": "trickle_headers", "interval": 0.2, "seconds": 8},
    "trickled body": {"kind": "trickle_body", "interval": 0.2, "seconds": 8},
    "keep-alives and no content": {"kind": "keepalive", "interval": 0.2, "seconds": 8},
}


def _script(slow: dict[str, Any]) -> dict[str, Any]:
    return {"models": {"slow": [slow], "fast": [{"kind": "answer", "text": "fast answer"}]}}


def _slow_then_fast(server: Any, **fields: Any) -> Any:
    fields = {"attempt_timeout": 1, "deadline": 3, "max_attempts": 1, **fields}
    return chain("slow", "fast", server=server, recover_transport=False, **fields)


def _primary_event(trace: Any) -> Any:
    return next(e for e in trace if e.source == "primary" and e.event != "start")


def _text(chunks: Any) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


# -- one slow attempt is cut at its total bound, and the fallback answers -----------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("slow", list(SLOW))
def test_a_trickling_primary_is_cut_at_the_attempt_bound_and_the_fallback_answers(
    fault_server, slow, stream
):
    fault_server.script(_script(SLOW[slow]))
    with Fallgate(_slow_then_fast(fault_server)) as gate:
        t0 = time.monotonic()
        if stream:
            with gate.chat.completions.create(messages=MESSAGES, stream=True) as s:
                text, trace = _text(s), s.trace
        else:
            result = gate.run(messages=MESSAGES)
            text, trace = result.value.choices[0].message.content, result.trace
        took = time.monotonic() - t0
    assert text == "fast answer"
    cut = _primary_event(trace)
    assert (cut.event, cut.dest) == ("transport", "fallback_1")
    assert "AttemptTimeout" in cut.detail
    assert took < 1 + SLACK, f"the 1 s attempt bound held the turn {took:.2f} s"
    assert fault_server.count("slow") == 1 and fault_server.count("fast") == 1


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("slow", list(SLOW))
async def test_async_a_trickling_primary_is_cut_at_the_attempt_bound_and_the_fallback_answers(
    fault_server, slow, stream
):
    fault_server.script(_script(SLOW[slow]))
    async with AsyncFallgate(_slow_then_fast(fault_server)) as gate:
        t0 = time.monotonic()
        if stream:
            s = await gate.chat.completions.create(messages=MESSAGES, stream=True)
            async with s:
                text = _text([c async for c in s])
            trace = s.trace
        else:
            result = await gate.arun(messages=MESSAGES)
            text, trace = result.value.choices[0].message.content, result.trace
        took = time.monotonic() - t0
    assert text == "fast answer"
    cut = _primary_event(trace)
    assert (cut.event, cut.dest) == ("transport", "fallback_1")
    assert "AttemptTimeout" in cut.detail
    assert took < 1 + SLACK, f"the 1 s attempt bound held the turn {took:.2f} s"


def test_the_responses_api_is_bounded_too(fault_server):
    fault_server.script(_script(SLOW["trickled body"]))
    with Fallgate(_slow_then_fast(fault_server)) as gate:
        t0 = time.monotonic()
        reply = gate.responses.create(input="hi")
        took = time.monotonic() - t0
    assert reply.output_text == "fast answer"
    assert took < 1 + SLACK


# -- memory: an endless body is cut at max_body_bytes --------------------------------------------

ENDLESS = {"kind": "endless", "bytes": 65536, "interval": 0.002, "seconds": 6}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_endless_body_is_cut_at_max_body_bytes_and_memory_stays_bounded(fault_server, stream):
    """Property: whatever a server sends, one attempt holds at most ``max_body_bytes``
    (plus one read) of it; the endless reply is a malformed reply and falls back."""
    fault_server.script(_script(ENDLESS))
    policy = _slow_then_fast(fault_server, attempt_timeout=10, deadline=20, max_body_bytes=1 << 20)
    with Fallgate(policy) as gate:
        tracemalloc.start()
        try:
            if stream:
                with gate.chat.completions.create(messages=MESSAGES, stream=True) as s:
                    text, trace = _text(s), s.trace
            else:
                result = gate.run(messages=MESSAGES)
                text, trace = result.value.choices[0].message.content, result.trace
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert text == "fast answer"
    cut = _primary_event(trace)
    assert (cut.event, cut.dest) == ("overloaded", "fallback_1")
    assert "exceeded max_body_bytes (1048576 bytes)" in cut.detail
    assert peak < 16 << 20, f"peak traced memory {peak / 2**20:.1f} MiB for a 1 MiB cap"


async def test_async_an_endless_body_is_cut_at_max_body_bytes(fault_server):
    fault_server.script(_script(ENDLESS))
    policy = _slow_then_fast(fault_server, attempt_timeout=10, deadline=20, max_body_bytes=1 << 20)
    async with AsyncFallgate(policy) as gate:
        t0 = time.monotonic()
        result = await gate.arun(messages=MESSAGES)
        took = time.monotonic() - t0
    assert result.value.choices[0].message.content == "fast answer"
    assert "max_body_bytes" in _primary_event(result.trace).detail
    assert took < 6, "the endless body was read to its end"


def test_the_default_cap_bounds_an_endless_body(fault_server):
    """No cap configured: the default (64 MiB) still ends an endless body."""
    fault_server.script(_script({**ENDLESS, "interval": 0.0, "seconds": 30}))
    with Fallgate(_slow_then_fast(fault_server, attempt_timeout=30, deadline=60)) as gate:
        result = gate.run(messages=MESSAGES)
    assert result.target == "fallback_1"
    assert "exceeded max_body_bytes (67108864 bytes)" in _primary_event(result.trace).detail


# -- streams: the idle bound after the first content ---------------------------------------------

QUIET_AFTER_CONTENT = {"kind": "stream", "chunks": 2, "then": "keepalive", "seconds": 8}


def test_a_committed_stream_that_goes_quiet_is_cut_at_stream_idle_timeout(fault_server):
    """Keep-alive comments are not chunks: after content, the next chunk must come
    within ``stream_idle_timeout`` (here 0.5 s, the attempt bound 5 s)."""
    fault_server.script({"models": {"slow": [QUIET_AFTER_CONTENT]}})
    policy = _slow_then_fast(fault_server, attempt_timeout=5, deadline=10, stream_idle_timeout=0.5)
    got: list[str] = []
    with Fallgate(policy) as gate:
        t0 = time.monotonic()
        with pytest.raises(TurnFailed) as err:
            with gate.chat.completions.create(messages=MESSAGES, stream=True) as s:
                for c in s:
                    got += [c.choices[0].delta.content or ""] if c.choices else []
        took = time.monotonic() - t0
    assert "".join(got) == err.value.partial == "chunk-1 chunk-2 "
    assert err.value.last_outcome.kind == "stream_interrupted"
    assert "stream idle for 0.5 s" in err.value.last_outcome.detail
    assert fault_server.count("fast") == 0, "a committed stream is never replayed"
    assert took < 0.5 + SLACK


async def test_async_a_committed_stream_that_goes_quiet_is_cut_at_stream_idle_timeout(
    fault_server,
):
    fault_server.script({"models": {"slow": [QUIET_AFTER_CONTENT]}})
    policy = _slow_then_fast(fault_server, attempt_timeout=5, deadline=10, stream_idle_timeout=0.5)
    got: list[str] = []
    async with AsyncFallgate(policy) as gate:
        t0 = time.monotonic()
        with pytest.raises(TurnFailed) as err:
            s = await gate.chat.completions.create(messages=MESSAGES, stream=True)
            async with s:
                async for c in s:
                    got += [c.choices[0].delta.content or ""] if c.choices else []
        took = time.monotonic() - t0
    assert "".join(got) == err.value.partial == "chunk-1 chunk-2 "
    assert "stream idle for 0.5 s" in err.value.last_outcome.detail
    assert took < 0.5 + SLACK


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_committed_stream_may_outlast_the_attempt_bound_while_chunks_keep_coming(
    fault_server, use_async
):
    """After the first content chunk the turn is committed: a long answer is not cut at
    ``attempt_timeout`` (nor the deadline) while its chunks come within the idle bound,
    and the time the caller spends between chunks is its own."""
    fault_server.script({"models": {"slow": [{"kind": "stream", "chunks": 5, "interval": 0.3}]}})
    policy = _slow_then_fast(
        fault_server, attempt_timeout=0.5, deadline=0.8, stream_idle_timeout=0.6
    )

    def slow_reader(chunks: Any) -> str:
        out = ""
        for c in chunks:
            time.sleep(0.2)  # the caller's own time, never counted against the stream
            out += (c.choices[0].delta.content or "") if c.choices else ""
        return out

    if use_async:

        async def go() -> str:
            async with AsyncFallgate(policy) as gate:
                s = await gate.chat.completions.create(messages=MESSAGES, stream=True)
                out = ""
                async with s:
                    async for c in s:
                        await asyncio.sleep(0.2)
                        out += (c.choices[0].delta.content or "") if c.choices else ""
                return out

        text = asyncio.run(go())
    else:
        with Fallgate(policy) as gate:
            with gate.chat.completions.create(messages=MESSAGES, stream=True) as s:
                text = slow_reader(s)
    assert text == "chunk-1 chunk-2 chunk-3 chunk-4 chunk-5 "


# -- the deadline is a hard stop -----------------------------------------------------------------

STALL = {"kind": "keepalive", "interval": 0.1, "seconds": 8}


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_no_attempt_starts_after_the_deadline_and_the_running_one_is_cut_at_it(
    fault_server, use_async
):
    """Deadline 1 s, attempts 0.4 s, three targets of two keys that all stall: every
    request reaches the server before the deadline, the turn ends at it, and the
    targets it never reached say the deadline passed."""
    fault_server.script({"default": STALL})
    policy = chain("a", "b", "c", keys=2, server=fault_server, attempt_timeout=0.4, deadline=1.0)
    t0 = time.monotonic()
    with pytest.raises(TurnFailed) as err:
        if use_async:

            async def go() -> None:
                async with AsyncFallgate(policy) as gate:
                    await gate.arun(messages=MESSAGES)

            asyncio.run(go())
        else:
            with Fallgate(policy) as gate:
                gate.run(messages=MESSAGES)
    took = time.monotonic() - t0
    starts = [r.time - t0 for r in fault_server.requests]
    assert starts and all(s < 1.0 for s in starts), f"requests at {starts}"
    assert took < 1.0 + SLACK, f"a 1 s deadline held the turn {took:.2f} s"
    assert "deadline had passed" in str(err.value)


def _serve(script: dict[str, Any], tmp: Path) -> contextlib.AbstractContextManager[str]:
    """The fault server in a process of its own (its threads must not starve the
    client's event loop of the GIL); yields its base URL."""

    @contextlib.contextmanager
    def run() -> Iterator[str]:
        path = tmp / "script.json"
        path.write_text(json.dumps(script), encoding="utf-8")
        proc = subprocess.Popen(
            [sys.executable, "-m", "fallgate.providers.cli", "serve", "--script", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        try:
            line = proc.stdout.readline()
            assert "listening on " in line, line + (proc.stderr.read() if proc.stderr else "")
            yield line.split("listening on ", 1)[1].strip()
        finally:
            proc.terminate()
            proc.communicate(timeout=30)

    return run()


class _Server:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url


def test_a_thousand_concurrent_turns_all_end_at_their_deadline(tmp_path):
    """1,000 asyncio turns at once against a primary and a fallback that both trickle
    keep-alives for 30 s (one a second, within any per-read timeout): with a 3 s
    deadline no turn starts an attempt at or after its deadline, every turn fails,
    and none waits for a trickle to end. How late the slowest turn ends is
    CPU, not waiting: 2,000 SDK requests cost seconds of client CPU on a small machine
    (printed, with the event loop's worst lateness, for docs/bench.md)."""
    n, deadline = 1000, 3.0
    script = {"default": {"kind": "keepalive", "interval": 1.0, "seconds": 30}}
    lag = [0.0]

    async def ticker() -> None:  # the event loop's worst lateness, while the turns run
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            lag[0] = max(lag[0], now - last - 0.05)
            last = now

    with _serve(script, tmp_path) as base_url:
        policy = chain(
            "a", "b", server=_Server(base_url), attempt_timeout=2.0, deadline=deadline,
            max_attempts=1, recover_transport=False,
        )  # fmt: skip

        async def one(gate: AsyncFallgate) -> tuple[float, str, list[float]]:
            t0 = time.monotonic()
            try:
                result = await gate.arun(messages=MESSAGES)
                why, trace = "answered", result.trace
            except TurnFailed as e:
                why, trace = str(e), e.trace
            starts = [e.time for e in trace if e.action == "Attempt"]
            return time.monotonic() - t0, why, starts

        async def all_turns() -> list[tuple[float, str, list[float]]]:
            tick = asyncio.ensure_future(ticker())
            try:
                async with AsyncFallgate(policy) as gate:
                    return await asyncio.gather(*(one(gate) for _ in range(n)))
            finally:
                tick.cancel()

        results = asyncio.run(all_turns())
    took = sorted(t for t, _, _ in results)
    print(  # docs/bench.md's figure (pytest -s)
        f"{n} turns, deadline {deadline:g} s: slowest {took[-1]:.2f} s, median "
        f"{took[n // 2]:.2f} s, fastest {took[0]:.2f} s; event loop late by up to {lag[0]:.2f} s"
    )
    assert len(results) == n
    late = [s for _, _, starts in results for s in starts if s >= deadline]
    assert not late, f"{len(late)} attempts started after the deadline, e.g. at {late[:3]}"
    assert all(why != "answered" for _, why, _ in results)
    assert took[-1] < 15, f"slowest turn {took[-1]:.2f} s: it waited for a trickle"


def test_a_hundred_threads_of_sync_turns_end_at_their_deadline(fault_server):
    """The sync twin at thread scale: 100 threads each run a turn against targets that
    trickle keep-alives for 8 s; no attempt starts after the 1.5 s deadline, every turn
    fails saying so, and none waits for a trickle to end."""
    fault_server.script({"default": {"kind": "keepalive", "interval": 0.2, "seconds": 8}})
    # The fleet's guards off (shared budget, breaker): this is about the deadline alone.
    policy = chain(
        "a",
        "b",
        server=fault_server,
        attempt_timeout=1.0,
        deadline=1.5,
        retry_budget={"enabled": False},
        breaker={"allowed_failures": 1000},
    )
    took: list[float] = []
    failures: list[TurnFailed] = []
    lock = threading.Lock()
    with Fallgate(policy) as gate:

        def one() -> None:
            t0 = time.monotonic()
            try:
                gate.run(messages=MESSAGES)
            except TurnFailed as e:
                with lock:
                    failures.append(e)
            with lock:
                took.append(time.monotonic() - t0)

        threads = [threading.Thread(target=one) for _ in range(100)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert len(took) == len(failures) == 100
    starts = [e.time for f in failures for e in f.trace if e.action == "Attempt"]
    assert starts and max(starts) < 1.5
    assert all("deadline had passed" in str(f) for f in failures)
    assert max(took) < 6, f"slowest turn {max(took):.2f} s: it waited for a trickle"


# -- clients whose transport cannot be wrapped ---------------------------------------------------


class _OwnTransport:
    """A transport of the caller's own (no connection pool fallgate can reach): it hands
    each request to a real one it keeps to itself."""

    def __init__(self) -> None:
        from fallgate.providers.openai.http import transport

        self._inner = transport.AsyncHTTPTransport()

    async def handle_async_request(self, request: Any) -> Any:
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _own_transport_factory(target: Any, api_key: str) -> Any:
    import openai
    from fallgate.providers.openai.http import transport

    base = transport.http.AsyncBaseTransport
    own = type("OwnTransport", (_OwnTransport, base), {})()
    http_client = transport.http.AsyncClient(transport=own)
    return openai.AsyncOpenAI(
        base_url=target.base_url, api_key=api_key, max_retries=0, http_client=http_client
    )


def test_only_clients_on_the_librarys_own_transport_are_instrumented(fault_server):
    from fallgate.providers.openai.http.bounds import instrument, is_instrumented
    from fallgate.providers.openai.http.pools import async_openai_factory

    policy = _slow_then_fast(fault_server)
    ours = async_openai_factory(1.0)(policy.targets[0], "sk-test")
    theirs = _own_transport_factory(policy.targets[0], "sk-test")
    assert instrument(ours) and is_instrumented(ours)
    assert not instrument(theirs) and not is_instrumented(theirs)


async def test_async_a_client_of_your_own_is_still_cut_at_the_attempt_bound(fault_server):
    """A `client_factory` client whose transport fallgate cannot wrap: the asyncio
    wrappers still cut the attempt at its total bound (``asyncio.timeout``)."""
    fault_server.script(_script(SLOW["trickled body"]))
    policy = _slow_then_fast(fault_server)
    async with AsyncFallgate(policy, client_factory=_own_transport_factory) as gate:
        t0 = time.monotonic()
        result = await gate.arun(messages=MESSAGES)
        took = time.monotonic() - t0
    assert result.value.choices[0].message.content == "fast answer"
    assert "AttemptTimeout" in _primary_event(result.trace).detail
    assert took < 1 + SLACK
