"""The policy as the HTTP client under a real `openai.OpenAI`: each request one turn.

    client = openai.OpenAI(api_key="unused", http_client=fallgate.http_client(policy))
    client.chat.completions.create(model="glm-5.1", messages=[...])   # the real SDK, all of it

Agent frameworks build their own SDK client and read its attributes (``base_url``,
``with_options``, ``beta``, ``_client``, ...): handing them a client whose HTTP
layer is fallgate keeps every one of those real. The transport here runs one turn
of the engine per request the SDK sends: the machine picks target and key, the
request is rewritten for it (`providers.openai.http.exchange`), and the reply is
classified by the wrapper's own classifier (`providers.openai.exceptions`: status,
headers, body; the same catalogue). The SDK parses whatever answer the turn ends
with: a target's reply, or the last error a target sent (``x-should-retry: false``
on every failure, so the SDK's own retries never add to the policy's).

``model`` in the request names where the chain starts (as the wrapper's ``model=``
does: an entry's model, ``provider/model`` or target name); a model the chain does
not hold is answered 400 without a request. A stream commits at its first event
with content (`providers.openai.http.peek`): an error event or a cut before that
is the turn's and may fall back; after it, a cut reaches the SDK as the HTTP
library's own error, which it raises to the caller mid-iteration (unless the answer
had already ended: then the stream just ends).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import attrs

from ....fsm import HealthStore, Policy, Target, TurnFailed, adrive, drive
from ....fsm.clock import Clock
from ....fsm.core.actions import Attempt
from ....fsm.core.turn import Hook
from ....fsm.host.drivers import check_health
from ....fsm.kinds import Outcome
from ..chain import Chains
from ..deliveries import cut_errors
from ..exceptions import ClientClosed, classifier_for
from . import transport
from .bounds import (
    AttemptBound,
    AttemptTimeout,
    BodyTooLarge,
    abounded,
    attempt_bound,
    bounded,
    instrument_transport,
    issued,
)
from .exchange import Exchange, Refused, failed_answer, reply_answer, status_error
from .peek import Peek
from .pools import interrupt_transport
from .sse import AsyncFilteringTransport, FilteringTransport, expect_choices, stream_ended

__all__ = ["AsyncEmbeddedTransport", "EmbeddedTransport", "async_http_client", "http_client"]

logger = logging.getLogger("fallgate")


@attrs.define(slots=True)
class _Turn:
    """What one request's turn remembers: the target of the attempt in progress and
    the last failure (a failed turn answers with it)."""

    target: Target | None = None
    error: BaseException | None = None


class _Gate:
    """Policy, health store, hooks and one transport per target (both flavours)."""

    def __init__(
        self,
        policy: Policy,
        health: HealthStore | None,
        on_transition: Hook | None,
        clock: Clock | None,
        make: Callable[[], Any],
    ) -> None:
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be an fsm.Policy, got {type(policy).__name__}")
        check_health(health)
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(
                f"clock must be an fsm.Clock (now, sleep, asleep), got {type(clock).__name__}"
            )
        self.policy = policy
        self.health = health if health is not None else HealthStore()
        self.on_transition = on_transition
        self.clock = clock
        self.chains = Chains(policy)
        self._make = make
        self._inner: dict[str, Any] = {}
        self._lock = threading.Lock()
        #: Every transport built so far obeys the attempt bounds at the socket
        #: (`providers.openai.http.bounds.instrument_transport`).
        self.bounded = True
        #: Closed by its owner: no transport is built, no attempt made any more.
        self.closed = False

    def inner(self, target: Target) -> Any:
        """The target's own transport (its connection pool), built on first use and
        bounded like the wrapper's clients (each attempt's phases, total and bytes).
        Once the gate is closed, `ClientClosed` (the turn ends `aborted`)."""
        if self.closed:
            raise ClientClosed
        got = self._inner.get(target.name)
        if got is None:
            with self._lock:
                if self.closed:
                    raise ClientClosed
                got = self._inner.get(target.name)
                if got is None:
                    got = self._inner[target.name] = self._make()
                    if not instrument_transport(got):
                        self.bounded = False
        return got

    def drop(self, target: Target) -> Any | None:
        """Transport recovery: the target's next attempt gets a new transport."""
        with self._lock:
            return self._inner.pop(target.name, None)

    def close_all(self) -> list[Any]:
        """Close the gate: the transports to close (their attempts in flight end
        `aborted`, see `options`)."""
        with self._lock:
            self.closed = True
            old, self._inner = list(self._inner.values()), {}
        return old

    def bound(self, a: Attempt, stream: bool, handed: float) -> AttemptBound:
        """Attempt `a`'s bounds (a stream's held until it says something: `attempt_bound`)."""
        return attempt_bound(
            self.policy, a, stream=stream, issued=handed, health=self.health, clock=self.clock
        )

    def options(self, turn: _Turn, ex: Exchange) -> dict[str, Any]:
        # an attempt cut by the gate's close is the caller's act: `cancelled`, no fault
        classify = classifier_for(self.policy, lambda: turn.target, closed=lambda: self.closed)

        def remember(e: BaseException) -> Outcome:
            turn.error = e
            return classify(e)

        return {
            "classify": remember,
            "health": self.health,
            "on_transition": self.on_transition,
            "clock": self.clock,
            "first": ex.first,
        }


def _begin(gate: _Gate, request: Any) -> Exchange | Any:
    """The request's `Exchange`, or the answer the gate gives without a turn."""
    if request.headers.get("x-stainless-retry-count", "0") not in ("0", ""):
        _sdk_retried(request.headers["x-stainless-retry-count"])
    try:
        ex = Exchange(request, gate.chains)
        local = ex.local(gate.policy)
    except Refused as r:
        return r.answer(request)
    return ex if local is None else local


_warned: list[bool] = []


def _sdk_retried(count: str) -> None:
    """The SDK sent a request again (its retry `count`): every answer here says
    ``x-should-retry: false``, so only an error escaping the turn gets here; say once
    where the retries belong."""
    if not _warned:
        _warned.append(True)
        logger.warning(
            "fallgate: the openai SDK retried a request through fallgate.http_client "
            "(retry %s): the policy's max_attempts are the retries; build the SDK client "
            "with max_retries=0",
            count,
        )


def _sse(reply: Any, ex: Exchange) -> bool:
    """A stream to peek: SSE on a chat/responses request, sent without compression."""
    return (
        ex.api is not None
        and reply.headers.get("content-type", "").startswith("text/event-stream")
        and reply.headers.get("content-encoding", "identity") == "identity"
    )


def _event_came(peek: Peek, before: int, bound: AttemptBound) -> None:
    """A held-back chunk that completed an event (a keep-alive comment is none): the
    next must come within the idle bound, and the turn's deadline until it commits."""
    if peek.events != before:
        bound.event()


def _library_error(e: AttemptTimeout | BodyTooLarge) -> BaseException:
    """After the commit a tripped bound reaches the SDK as the HTTP library's own error
    (what it raised inside the read, naming the bound), as any other cut does."""
    cause = e.__cause__
    return cause if cause is not None else e


def _ended_or_raise(reply: Any, e: Exception) -> None:
    """A committed stream's read failed with `e`. A cut (the connection, or the idle
    bound: `deliveries.cut_errors`) after the stream had said its answer's end
    (`sse.stream_ended`) leaves the answer whole, as the wrapper takes it: return, and the
    stream ends there for the SDK (a usage chunk or ``[DONE]`` was all it lost). Anything
    else reaches the SDK: a tripped bound as the HTTP library's own error."""
    if isinstance(e, cut_errors()) and stream_ended(reply):
        logger.info(
            "fallgate: a stream cut after its end (%s); its answer is whole", type(e).__name__
        )
        return
    if isinstance(e, AttemptTimeout | BodyTooLarge):
        raise _library_error(e) from None
    raise e


def _failed(gate: _Gate, e: TurnFailed, turn: _Turn, request: Any) -> Any:
    """The answer of a failed turn (`failed_answer`); a turn the gate's close ended
    `aborted` raises `ClientClosed` to the SDK instead, as a closed HTTP client does."""
    if e.state == "aborted" and gate.closed:
        raise ClientClosed() from turn.error
    name = turn.target.name if turn.target is not None else ""
    return failed_answer(e, turn.error, name, request)


def _stream_headers(reply: Any, target: str) -> list[tuple[str, str]]:
    headers = [(k, v) for k, v in reply.headers.items() if k.lower() != "content-length"]
    return [*headers, ("x-fallgate-target", target)]


# -- sync ----------------------------------------------------------------------------------


class _Replayed(transport.http.SyncByteStream):  # type: ignore[misc]
    """The held-back events, then the rest of the target's stream."""

    def __init__(
        self, held: list[bytes], rest: Iterator[bytes], reply: Any, bound: AttemptBound
    ) -> None:
        self._held = held
        self._rest = rest
        self._reply = reply
        self._bound = bound

    def __iter__(self) -> Iterator[bytes]:
        held, self._held = self._held, []
        yield from held
        bound, rest = self._bound, self._rest
        fresh = True
        while True:  # each read under the idle bound and the byte cap, as the wrapper's
            if fresh:  # the idle bound starts at the read: the caller's time is its own
                bound.event(committed=True)
            try:
                with bounded(bound):
                    chunk = next(rest)
            except StopIteration:
                return
            except Exception as e:
                _ended_or_raise(self._reply, e)
                return
            fresh = b"data" in chunk  # a keep-alive comment does not restart it
            yield chunk

    def close(self) -> None:
        self._reply.close()


class _Embedded:
    """What both transports are: one `_Gate` over the policy; a flavour names the
    library transport each target's requests go out on (`_inner_transport`)."""

    def __init__(
        self,
        policy: Policy,
        *,
        health: HealthStore | None = None,
        on_transition: Hook | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.gate = _Gate(policy, health, on_transition, clock, self._inner_transport)

    @staticmethod
    def _inner_transport() -> Any:
        raise NotImplementedError


class EmbeddedTransport(_Embedded, transport.http.BaseTransport):  # type: ignore[misc]
    """A sync transport whose `handle_request` runs one turn (see the module)."""

    @staticmethod
    def _inner_transport() -> Any:
        return FilteringTransport(**transport.transport_options())

    def handle_request(self, request: Any) -> Any:
        request.read()
        ex = _begin(self.gate, request)
        if not isinstance(ex, Exchange):
            return ex
        turn = _Turn()

        def attempt(a: Attempt) -> Any:
            handed = issued()
            turn.target = a.target
            out = ex.outbound(a, self.gate.policy)
            inner = self.gate.inner(a.target)
            bound = self.gate.bound(a, ex.stream, handed)
            with bounded(bound):
                reply = inner.handle_request(out)
                if reply.status_code < 300 and ex.stream and _sse(reply, ex):
                    return self._peeked(reply, ex, a.target.name, bound)
                try:
                    content = reply.read()
                finally:
                    reply.close()
            if reply.status_code >= 300:
                raise status_error(reply, out)
            ex.check(content)
            return reply_answer(reply, content, request, a.target.name)

        def rebuild(target: Target) -> None:
            old = self.gate.drop(target)
            if old is not None:
                old.close()

        try:
            result = drive(
                self.gate.policy, attempt, rebuild=rebuild, **self.gate.options(turn, ex)
            )
        except TurnFailed as e:
            return _failed(self.gate, e, turn, request)
        return result.value

    def _peeked(self, reply: Any, ex: Exchange, target: str, bound: AttemptBound) -> Any:
        assert ex.api is not None
        expect_choices(reply, (ex.payload or {}).get("n"))  # its end is every choice's
        peek = Peek(ex.api)
        held: list[bytes] = []
        rest = iter(reply.stream)
        try:
            for chunk in rest:
                held.append(chunk)
                before = peek.events
                if peek.feed(chunk):
                    break
                _event_came(peek, before, bound)
            else:
                peek.end()
        except BaseException:
            reply.close()
            raise
        return transport.http.Response(
            reply.status_code,
            headers=_stream_headers(reply, target),
            stream=_Replayed(held, rest, reply, bound),
            extensions={k: v for k, v in reply.extensions.items() if k == "http_version"},
        )

    def close(self) -> None:
        """Close every target's transport; requests in flight are cut at once (a sync
        read would wait for the server otherwise) and raise `ClientClosed`."""
        old = self.gate.close_all()
        for t in old:
            interrupt_transport(t)
        for t in old:
            t.close()


# -- async ---------------------------------------------------------------------------------


class _AsyncReplayed(transport.http.AsyncByteStream):  # type: ignore[misc]
    """See `_Replayed`."""

    def __init__(
        self,
        held: list[bytes],
        rest: AsyncIterator[bytes],
        reply: Any,
        bound: AttemptBound,
        backstop: bool,
    ) -> None:
        self._held = held
        self._rest = rest
        self._reply = reply
        self._bound = bound
        self._backstop = backstop

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held, self._held = self._held, []
        for chunk in held:
            yield chunk
        bound, rest = self._bound, self._rest
        fresh = True
        while True:  # see `_Replayed`
            if fresh:
                bound.event(committed=True)
            try:
                async with abounded(bound, backstop=self._backstop):
                    chunk = await rest.__anext__()
            except StopAsyncIteration:
                return
            except Exception as e:
                _ended_or_raise(self._reply, e)
                return
            fresh = b"data" in chunk
            yield chunk

    async def aclose(self) -> None:
        await self._reply.aclose()

    def __del__(self) -> None:
        """A stream the caller abandoned (a cancelled task, a dropped iterator) closes its
        connection first. The library's async generators under it were started here,
        while the turn peeked, before the SDK's own: left to the event loop's finalizer,
        they are closed in that order, and an inner one is closed by its outer one and by
        its own finalizer at once ("aclose(): asynchronous generator is already running",
        logged per stream). Closed first, each of them has nothing left to do."""
        reply = self._reply
        if getattr(reply, "is_closed", True):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # collected outside the loop: its finalizer closes them
            return
        task = loop.create_task(reply.aclose())  # its first step before any finalizer's
        _closing.add(task)
        task.add_done_callback(_closed)


#: Abandoned streams' closes in progress (a task the loop holds only weakly).
_closing: set[asyncio.Task[None]] = set()


def _closed(task: asyncio.Task[None]) -> None:
    _closing.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: a close that failed has nothing to report to


class AsyncEmbeddedTransport(_Embedded, transport.http.AsyncBaseTransport):  # type: ignore[misc]
    """The asyncio twin of `EmbeddedTransport`; a cancelled request ends its turn
    `aborted`."""

    @staticmethod
    def _inner_transport() -> Any:
        return AsyncFilteringTransport(**transport.transport_options())

    async def handle_async_request(self, request: Any) -> Any:
        await request.aread()
        ex = _begin(self.gate, request)
        if not isinstance(ex, Exchange):
            return ex
        turn = _Turn()

        async def attempt(a: Attempt) -> Any:
            handed = issued()
            turn.target = a.target
            out = ex.outbound(a, self.gate.policy)
            inner = self.gate.inner(a.target)
            bound = self.gate.bound(a, ex.stream, handed)
            async with abounded(bound, backstop=not self.gate.bounded):
                reply = await inner.handle_async_request(out)
                if reply.status_code < 300 and ex.stream and _sse(reply, ex):
                    return await self._peeked(reply, ex, a.target.name, bound)
                try:
                    content = await reply.aread()
                finally:
                    await reply.aclose()
            if reply.status_code >= 300:
                raise status_error(reply, out)
            ex.check(content)
            return reply_answer(reply, content, request, a.target.name)

        async def rebuild(target: Target) -> None:
            old = self.gate.drop(target)
            if old is not None:
                await old.aclose()

        try:
            result = await adrive(
                self.gate.policy, attempt, rebuild=rebuild, **self.gate.options(turn, ex)
            )
        except TurnFailed as e:
            return _failed(self.gate, e, turn, request)
        return result.value

    async def _peeked(self, reply: Any, ex: Exchange, target: str, bound: AttemptBound) -> Any:
        assert ex.api is not None
        expect_choices(reply, (ex.payload or {}).get("n"))  # its end is every choice's
        peek = Peek(ex.api)
        held: list[bytes] = []
        rest = reply.stream.__aiter__()
        try:
            while True:
                try:
                    chunk = await rest.__anext__()
                except StopAsyncIteration:
                    peek.end()
                held.append(chunk)
                before = peek.events
                if peek.feed(chunk):
                    break
                _event_came(peek, before, bound)
        except BaseException:
            await reply.aclose()
            raise
        return transport.http.Response(
            reply.status_code,
            headers=_stream_headers(reply, target),
            stream=_AsyncReplayed(held, rest, reply, bound, not self.gate.bounded),
            extensions={k: v for k, v in reply.extensions.items() if k == "http_version"},
        )

    async def aclose(self) -> None:
        for t in self.gate.close_all():
            await t.aclose()


# -- the clients ---------------------------------------------------------------------------


def http_client(
    policy: Policy,
    *,
    health: HealthStore | None = None,
    on_transition: Hook | None = None,
    clock: Clock | None = None,
) -> Any:
    """The installed openai SDK's own sync HTTP client (httpx2 for openai 3.x, httpx for
    2.x) over `EmbeddedTransport`: pass it as ``openai.OpenAI(http_client=...)``.

    The SDK client's ``api_key`` and ``base_url`` are placeholders (each target's come
    from the policy); it follows no redirect (a failed turn may answer with a target's
    3xx: following it would run the turn again); ``health`` defaults to a store of this
    client's own, shared by every request through it; ``clock`` is what its turns wait
    on."""
    embedded = EmbeddedTransport(policy, health=health, on_transition=on_transition, clock=clock)
    return transport.DefaultClient(transport=embedded, follow_redirects=False)


def async_http_client(
    policy: Policy,
    *,
    health: HealthStore | None = None,
    on_transition: Hook | None = None,
    clock: Clock | None = None,
) -> Any:
    """The async twin of `http_client`: pass it as ``openai.AsyncOpenAI(http_client=...)``."""
    embedded = AsyncEmbeddedTransport(
        policy, health=health, on_transition=on_transition, clock=clock
    )
    return transport.DefaultAsyncClient(transport=embedded, follow_redirects=False)
