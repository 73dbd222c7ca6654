"""Closing a client while its turns run is the caller's act, not a provider's fault.

The real openai SDK over loopback to the fault server: a chain ``a -> b`` whose primary
is healthy but slow (it answers after a few seconds), turns in flight on it, and the
client closed under them: `Fallgate.close()` (threads), `AsyncFallgate.aclose()`, and an
SDK client over `fallgate.http_client` / `async_http_client` closed with its own
``close()``.

On the code before the fix each in-flight turn recorded a transport fault on the primary
("ReadError: Bad file descriptor"), its breaker opened (for the whole fleet on a shared
SQLite store), and the turns went on to the fallback: under the wrapper it was
reported "attempted 1x, bad_request: RuntimeError: this fallgate client is closed"
though nothing was sent, under ``async_http_client`` 20 *new* requests went to it (some
after ``close()`` had returned) and were answered. The sync wrapper's turns waited for
the server's reply before failing at all. Now each turn ends `aborted` at once (its
last outcome `cancelled`: "this fallgate client is closed"), nothing is recorded
against any target, and nothing is sent after the close.

And a stream cancelled mid-iteration under ``async_http_client`` logged asyncio's "Task
exception was never retrieved ... aclose(): asynchronous generator is already running"
(9 of 10 streams; the bare SDK is silent): the library's generators under fallgate's
stream were started while the turn peeked, before the SDK's own, and left to the event
loop's finalizer one was closed twice at once.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from fallgate.fsm.kinds import OutcomeKind
from fallgate.providers.openai.exceptions import ClientClosed

from fallgate import (
    AsyncFallgate,
    Fallgate,
    HealthStore,
    SQLiteHealthStore,
    TurnFailed,
    async_http_client,
    http_client,
)
from fallgate.testing import FaultServer

from helpers import chain

MSG: Any = [{"role": "user", "content": "hi"}]
OK: dict[str, Any] = {"default": {"kind": "answer", "text": "ok"}}
TURNS = 8
SLOW = 4.0  # the primary's (healthy) answer takes this long
CLOSE_AT = 0.6  # the client is closed this long after the turns start
PROMPT = 2.5  # a turn cut by the close ends well before the primary would have answered


def _slow_primary(srv: FaultServer) -> None:
    srv.script(
        {
            **OK,
            "models": {
                "a": [{"kind": "answer", "text": "slow-a", "delay": SLOW}] * 50,
                "b": [{"kind": "answer", "text": "from-b"}] * 50,
            },
        }
    )


def _policy(srv: FaultServer) -> Any:
    return chain("a", "b", server=srv, max_attempts=2, attempt_timeout=20, deadline=30)


def _blames_nobody(health: HealthStore) -> None:
    assert not health.snapshot()["targets"], "closing the client charged a target"


def _aborted_by_the_close(e: BaseException) -> None:
    assert isinstance(e, TurnFailed), repr(e)
    assert e.state == "aborted", str(e)
    o = e.last_outcome
    assert o is not None and o.kind is OutcomeKind.CANCELLED, str(e)
    assert "closed" in o.detail
    assert "bad_request" not in str(e) and "transport" not in str(e), str(e)


def _says_closed(e: BaseException | None) -> bool:
    """The error, or what it was raised from (openai 2.x wraps a transport's error in
    `APIConnectionError`), says the client was closed."""
    while e is not None:
        if isinstance(e, ClientClosed) or "closed" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _run_threads(gate: Fallgate) -> list[tuple[BaseException | str, float]]:
    out: list[tuple[BaseException | str, float]] = []
    lock = threading.Lock()

    def worker() -> None:
        t0 = time.monotonic()
        try:
            r: BaseException | str = (
                gate.chat.completions.create(messages=MSG).choices[0].message.content or ""
            )
        except BaseException as e:
            r = e
        with lock:
            out.append((r, time.monotonic() - t0))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(TURNS)]
    for t in threads:
        t.start()
    time.sleep(CLOSE_AT)
    gate.close()
    for t in threads:
        t.join(SLOW + 20)
    assert not any(t.is_alive() for t in threads), "a turn outlived the close"
    return out


@pytest.mark.timeout(60)
def test_closing_a_sync_fallgate_ends_its_running_turns_at_once_and_benches_no_one_fleet_wide(
    tmp_path: Path,
) -> None:
    db = tmp_path / "health.db"
    with FaultServer(OK) as srv:
        policy = _policy(srv)
        gate = Fallgate(policy, health=SQLiteHealthStore(db))
        gate.run(messages=MSG)  # warm: the primary is up
        _slow_primary(srv)
        ends = _run_threads(gate)
        assert len(ends) == TURNS
        for r, took in ends:
            assert isinstance(r, BaseException), f"answered {r!r} after the close"
            _aborted_by_the_close(r)
            assert took < PROMPT + CLOSE_AT, f"a turn took {took:.2f}s to end after the close"
        assert srv.count("b") == 0, "the close sent turns to the fallback"
        _blames_nobody(gate.health)
        # another process on the same store still goes to the (healthy) primary
        srv.script(OK)
        with Fallgate(policy, health=SQLiteHealthStore(db)) as other:
            assert other.run(messages=MSG).target == "primary"


@pytest.mark.timeout(60)
def test_closing_an_async_fallgate_aborts_its_running_turns_without_blaming_the_primary() -> None:
    async def main() -> None:
        with FaultServer(OK) as srv:
            gate = AsyncFallgate(_policy(srv))
            await gate.arun(messages=MSG)
            _slow_primary(srv)
            tasks = [
                asyncio.ensure_future(gate.chat.completions.create(messages=MSG))
                for _ in range(TURNS)
            ]
            await asyncio.sleep(CLOSE_AT)
            closed = time.monotonic()
            await gate.aclose()
            done, pending = await asyncio.wait(tasks, timeout=SLOW + 20)
            assert not pending
            assert time.monotonic() - closed < PROMPT
            for t in done:
                e = t.exception()
                assert e is not None, "answered after the close"
                _aborted_by_the_close(e)
            assert srv.count("b") == 0
            _blames_nobody(gate.health)
            assert gate.clients.open_clients == 0

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_closing_an_sdk_client_over_async_http_client_sends_nothing_to_the_fallback() -> None:
    async def main() -> None:
        with FaultServer(OK) as srv:
            health = HealthStore()
            client = openai.AsyncOpenAI(
                api_key="unused",
                base_url="http://unused.invalid/v1",
                max_retries=0,
                http_client=async_http_client(_policy(srv), health=health),
            )
            await client.chat.completions.create(model="a", messages=MSG)
            _slow_primary(srv)
            tasks = [
                asyncio.ensure_future(client.chat.completions.create(model="a", messages=MSG))
                for _ in range(TURNS)
            ]
            await asyncio.sleep(CLOSE_AT)
            closed = time.monotonic()
            await client.close()
            done, pending = await asyncio.wait(tasks, timeout=SLOW + 20)
            assert not pending
            assert time.monotonic() - closed < PROMPT
            for t in done:
                e = t.exception()
                assert e is not None, f"answered after the close: {t.result()}"
                assert _says_closed(e), repr(e)
            assert srv.count("b") == 0, "new requests went to the fallback after close()"
            _blames_nobody(health)

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_closing_an_sdk_client_over_http_client_cuts_its_requests_and_sends_nothing_more() -> None:
    with FaultServer(OK) as srv:
        health = HealthStore()
        client = openai.OpenAI(
            api_key="unused",
            base_url="http://unused.invalid/v1",
            max_retries=0,
            http_client=http_client(_policy(srv), health=health),
        )
        client.chat.completions.create(model="a", messages=MSG)
        _slow_primary(srv)
        out: list[tuple[BaseException | None, float]] = []

        def worker() -> None:
            t0 = time.monotonic()
            err: BaseException | None = None
            try:
                client.chat.completions.create(model="a", messages=MSG)
            except BaseException as e:
                err = e
            out.append((err, time.monotonic() - t0))

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(TURNS)]
        for t in threads:
            t.start()
        time.sleep(CLOSE_AT)
        client.close()
        for t in threads:
            t.join(SLOW + 20)
        assert len(out) == TURNS
        for err, took in out:
            assert err is not None, "answered after the close"
            assert _says_closed(err), repr(err)
            assert took < PROMPT + CLOSE_AT, f"a request took {took:.2f}s to end after the close"
        assert srv.count("b") == 0, "new requests went to the fallback after close()"
        _blames_nobody(health)


@pytest.mark.timeout(60)
def test_a_stream_cancelled_mid_iteration_under_async_http_client_logs_no_task_exception() -> None:
    errors: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        stream_step = {"kind": "stream", "chunks": 50, "interval": 0.1}
        with FaultServer({"default": stream_step}) as srv:
            client = openai.AsyncOpenAI(
                api_key="unused",
                base_url="http://unused.invalid/v1",
                max_retries=0,
                http_client=async_http_client(chain("a", server=srv)),
            )

            async def consume() -> None:
                s = await client.chat.completions.create(model="a", messages=MSG, stream=True)
                async for _ in s:
                    await asyncio.sleep(5)  # the caller is slow: cancelled here

            for _ in range(6):
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(consume(), 0.5)
                gc.collect()
                await asyncio.sleep(0.05)
            await client.close()
            gc.collect()
            await asyncio.sleep(0.05)

    asyncio.run(main())
    assert not errors, [str(c.get("exception") or c.get("message")) for c in errors]


@pytest.mark.timeout(60)
def test_closing_an_async_fallgate_under_a_delivering_stream_aborts_it_charging_no_one() -> None:
    async def main() -> None:
        with FaultServer(OK) as srv:
            gate = AsyncFallgate(_policy(srv))
            await gate.arun(messages=MSG)
            srv.script(
                {**OK, "models": {"a": [{"kind": "stream", "chunks": 20, "interval": 0.3}] * 9}}
            )
            got: list[str] = []

            async def read() -> None:
                s = await gate.chat.completions.create(messages=MSG, stream=True)
                async with s:
                    async for c in s:
                        got.extend(ch.delta.content or "" for ch in c.choices)

            tasks = [asyncio.ensure_future(read()) for _ in range(3)]
            await asyncio.sleep(1.0)
            await gate.aclose()
            done, pending = await asyncio.wait(tasks, timeout=SLOW + 20)
            assert not pending and got, "the streams had delivered text before the close"
            for t in done:
                e = t.exception()
                assert e is not None
                _aborted_by_the_close(e)  # not `stream_interrupted`: nothing of the target's
                assert isinstance(e, TurnFailed) and e.partial, "the text it had delivered"
                assert e.partial.startswith("chunk-1 chunk-2 "), e.partial
            assert srv.count("b") == 0
            _blames_nobody(gate.health)
            with pytest.raises(ClientClosed):  # a closed client answers nothing, models too
                gate.models.list()
            with pytest.raises(ClientClosed):
                await gate.models.retrieve("a")

    asyncio.run(main())
