"""Hard bounds on one attempt: wall-clock time per phase and bytes received.

The SDK's ``timeout=`` reaches the HTTP library as a limit on each phase and
each socket read, so a server that trickles a byte every 0.4 s (its headers,
its body, or SSE keep-alive comments) is never timed out, and an endless body
grows memory without end. Here an attempt gets two hard bounds of its own:

- a **deadline** on the monotonic clock, per phase (`providers.openai.http.phases`):
  connect, the first byte of a reply or the first event of a stream, then the
  attempt's total (``Attempt.timeout``: ``attempt_timeout``, or what is left of
  the turn's deadline) or, for a started stream, the idle bound between events
  (the caller's own time between events is not counted). `attempt_bound` makes
  one from the policy; with `issued` the turn's deadline holds to the instant;
- a **byte cap**, ``max_body_bytes``: what the attempt may read off the wire.

Both are enforced under the HTTP library, in its network streams: every socket
read and write of a bounded attempt gets at most the time left (and none once
it is spent), and counts the bytes read. `instrument(client)` wraps the
network backend of an SDK client's transports (httpcore / httpcore2, under
httpx / httpx2) once, when the pools build the client; the bound of the
attempt in progress is read from a context variable (`bounded`), so clients
shared by concurrent turns bound each request by its own attempt. Outside a
bounded attempt the wrapper passes everything through.

A tripped bound raises the library's own ``ReadTimeout`` / ``ReadError``
inside it (so the connection is dropped the way the library drops any broken
one); `bounded` then raises `AttemptTimeout` (a transport fault) or
`BodyTooLarge` (a malformed reply) in place of whatever the SDK made of it.

When a timer of the attempt (its bound's, or the SDK's own per-phase timeout)
fires, the wrappers note how late it fired against when it was due (one clock
read, on the timeout path only). A timer that fired much later than due says
the process was starved (its event loop, or its threads, did not run): the
reply may have been sitting unread in the socket all along, so the timeout is
no evidence that the target is slow or down. `bounded` then raises an
`AttemptTimeout` with ``starved`` set, which the classifier marks a
client-side fault (`fsm.Outcome.client_side`).
For a client whose transport cannot be wrapped (a transport of the caller's
own), the asyncio wrappers run each bounded step under ``asyncio.timeout``
instead (`abounded` with ``backstop``); a sync one keeps only the SDK's
per-phase timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import sys
import time
import weakref
from types import TracebackType
from typing import Any, Final

from ....fsm.clock import Clock, default_clock, steady
from ....fsm.core.actions import Attempt
from ....fsm.core.reserve import stream_hold
from ....fsm.health.store import HealthStore
from ....fsm.policy.model import Policy
from .phases import (
    STARVATION,
    STARVED_AFTER,
    STARVED_SHARE,
    AttemptBound,
    AttemptTimeout,
    BodyTooLarge,
    Spent,
    starved,
)

__all__ = [
    "STARVATION",
    "STARVED_AFTER",
    "STARVED_SHARE",
    "AttemptBound",
    "AttemptTimeout",
    "BodyTooLarge",
    "abounded",
    "attempt_bound",
    "bounded",
    "instrument",
    "instrument_transport",
    "is_instrumented",
    "issued",
    "starved",
]

_MONOTONIC = time.monotonic


def issued() -> float:
    """Now, on the clock of the bounds: when the engine handed over an attempt (pass it
    to `attempt_bound`, so the time its client takes to build counts to the deadline)."""
    return _MONOTONIC()


def attempt_bound(
    policy: Policy,
    a: Attempt,
    *,
    stream: bool = False,
    issued: float | None = None,
    health: HealthStore | None = None,
    clock: Clock | None = None,
) -> AttemptBound:
    """The bounds of attempt `a` (a `stream` or not): its timeout (what the turn's
    deadline leaves of ``attempt_timeout``), the connect, first-byte / first-event and
    idle bounds of the policy, and its ``max_body_bytes``. With `issued` (`issued()`
    when the engine handed `a` over), the turn's deadline is held to the instant: the
    time spent since (building the client, waiting for a lock) is not the server's, so
    `a.timeout` still starts now, but nothing runs past the deadline. A stream's `health`
    store (and the turn's `clock`, default: the default one) tell where it is held until
    it says something (`fsm.core.reserve.stream_hold`)."""
    seconds, left = a.timeout, a.until_deadline
    if issued is not None:
        left -= _MONOTONIC() - issued
        if left < seconds:
            seconds = max(left, 0.0)
    first, field = (
        (policy.first_event_timeout, "first_event_timeout")
        if stream
        else (policy.first_byte_timeout, "first_byte_timeout")
    )
    hold = left
    if stream and health is not None:  # started, nothing said: not into the next's reserve
        now = (steady(clock) if clock is not None else default_clock()).now()
        hold = stream_hold(policy, health, a.target.index, left, now)
    return AttemptBound(
        seconds,
        policy.max_body_bytes,
        connect=policy.connect_timeout,
        first=first,
        first_field=field,
        idle=policy.stream_idle_timeout,
        stream=stream,
        turn_left=left,
        hold_left=hold,
        attempt_timeout=policy.attempt_timeout,
        deadline=policy.deadline,
    )


_CURRENT: Final[contextvars.ContextVar[AttemptBound | None]] = contextvars.ContextVar(
    "fallgate_attempt_bound", default=None
)


class bounded:  # lower case: used like a function, ``with bounded(bound):``
    """Run the block under `bound`: ``with`` (sync) or ``async with``; a tripped bound
    raises its own error. With `backstop` (``async with`` only), also
    ``asyncio.timeout`` at the deadline (for a client whose transport `instrument`
    could not wrap, and for time spent outside the socket). Never hold it across a
    ``yield`` to the caller. A class, not a generator: a stream enters one per event."""

    __slots__ = ("_backstop", "_bound", "_length", "_timeout", "_token")

    def __init__(self, bound: AttemptBound, *, backstop: bool = False) -> None:
        self._bound = bound
        self._backstop = backstop
        self._timeout: Any = None
        self._token: Any = None
        self._length = 0.0

    def __enter__(self) -> AttemptBound:
        self._token = _CURRENT.set(self._bound)
        return self._bound

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        _CURRENT.reset(self._token)
        bound = self._bound
        if isinstance(e, TimeoutError) and bound.tripped is None and bound.left() <= 0:
            bound.tripped = "time"
        if isinstance(e, Exception) and (bound.tripped is not None or bound.late):
            raise bound.error() from e

    async def __aenter__(self) -> AttemptBound:
        bound = self.__enter__()
        if self._backstop:
            self._length = max(0.0, bound.left())
            self._timeout = asyncio.timeout(self._length)
            await self._timeout.__aenter__()
        return bound

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        bound = self._bound
        try:
            if self._timeout is not None:
                await self._timeout.__aexit__(
                    et, e, tb
                )  # a CancelledError of its own: TimeoutError
        except TimeoutError as te:
            _CURRENT.reset(self._token)
            if bound.tripped is None:
                bound.tripped = "time"
            bound.fired("total time bound", self._length, bound.deadline)
            raise bound.error() from te
        self.__exit__(et, e, tb)


def abounded(bound: AttemptBound, *, backstop: bool = True) -> bounded:
    """`bounded` for ``async with``, with the ``asyncio.timeout`` backstop by default."""
    return bounded(bound, backstop=backstop)


# -- the network layer --------------------------------------------------------------------------
# One source for the sync and the asyncio wrappers: `_Op` does the bookkeeping of one bounded
# socket operation (its timeout, what tripped, the byte count); each twin method only calls the
# wrapped one inside it, with or without ``await``.


def _limit(b: AttemptBound, timeout: float | None, core: Any, exc: str) -> float:
    """The timeout for one socket operation of `b` (`AttemptBound.limit`); raises the
    library's `exc` once the deadline has passed."""
    try:
        return b.limit(timeout, connecting=exc == "ConnectTimeout")
    except Spent:
        raise getattr(core, exc)(str(b.error())) from None


# Per socket operation the happy path costs two calls (`_limit`, `limit`): no context
# manager there (tests/test_adapter_cost.py bounds the calls a turn adds).
def _timed_out(
    b: AttemptBound, timeout: float | None, t: float, due: float, exc: str, name: str
) -> None:
    """A socket operation of `b` given `t` seconds (of its own `timeout`) timed out: note
    whether the bound cut it (not the operation's own timeout) and how late it fired."""
    if exc == "ConnectTimeout" and t == b.connect:
        # the connect bound, whichever timer fired: the library's own connect timeout
        # is given the same `connect_timeout`, and names no field
        if b.tripped is None:
            b.tripped = "time"
            b.phase = "connect"
    elif timeout is None or t < timeout:  # the bound, not the op's own
        if b.tripped is None:
            b.tripped = "time"
    b.fired(name, t, due)


class _Stream:
    """A sync network stream whose reads and writes obey the current attempt's bound."""

    __slots__ = ("_core", "_s", "close", "get_extra_info")

    def __init__(self, stream: Any, core: Any) -> None:
        self._s = stream
        self._core = core
        # the stream's own methods where nothing is bounded: the connection pool asks
        # get_extra_info of every idle connection per request (no wrapper frame for it)
        self.get_extra_info = stream.get_extra_info
        self.close = stream.close

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        b = _CURRENT.get()
        if b is None:
            data: bytes = self._s.read(max_bytes, timeout)
            return data
        t = _limit(b, timeout, self._core, "ReadTimeout")
        due = b.due
        try:
            return _counted(b, self._s.read(max_bytes, t), self._core)
        except self._core.ReadTimeout:
            _timed_out(b, timeout, t, due, "ReadTimeout", "read timer")
            raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        b = _CURRENT.get()
        if b is None:
            self._s.write(buffer, timeout)
            return
        t = _limit(b, timeout, self._core, "WriteTimeout")
        due = b.due
        try:
            self._s.write(buffer, t)
        except self._core.WriteTimeout:
            _timed_out(b, timeout, t, due, "WriteTimeout", "write timer")
            raise

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: Any = None
    ) -> Any:
        b = _CURRENT.get()
        if b is None:
            return _Stream(self._s.start_tls(ssl_context, server_hostname, timeout), self._core)
        t = _limit(b, timeout, self._core, "ConnectTimeout")
        due = b.due
        try:
            return _Stream(self._s.start_tls(ssl_context, server_hostname, t), self._core)
        except self._core.ConnectTimeout:
            _timed_out(b, timeout, t, due, "ConnectTimeout", "TLS handshake timer")
            raise


class _AsyncStream:
    """The asyncio twin of `_Stream` (the same `_Op`, awaited)."""

    __slots__ = ("_core", "_s", "aclose", "get_extra_info")

    def __init__(self, stream: Any, core: Any) -> None:
        self._s = stream
        self._core = core
        self.get_extra_info = stream.get_extra_info  # as in `_Stream`
        self.aclose = stream.aclose

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        b = _CURRENT.get()
        if b is None:
            data: bytes = await self._s.read(max_bytes, timeout)
            return data
        t = _limit(b, timeout, self._core, "ReadTimeout")
        due = b.due
        try:
            return _counted(b, await self._s.read(max_bytes, t), self._core)
        except self._core.ReadTimeout:
            _timed_out(b, timeout, t, due, "ReadTimeout", "read timer")
            raise

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        b = _CURRENT.get()
        if b is None:
            await self._s.write(buffer, timeout)
            return
        t = _limit(b, timeout, self._core, "WriteTimeout")
        due = b.due
        try:
            await self._s.write(buffer, t)
        except self._core.WriteTimeout:
            _timed_out(b, timeout, t, due, "WriteTimeout", "write timer")
            raise

    async def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: Any = None
    ) -> Any:
        b = _CURRENT.get()
        if b is None:
            inner = await self._s.start_tls(ssl_context, server_hostname, timeout)
            return _AsyncStream(inner, self._core)
        t = _limit(b, timeout, self._core, "ConnectTimeout")
        due = b.due
        try:
            return _AsyncStream(
                await self._s.start_tls(ssl_context, server_hostname, t), self._core
            )
        except self._core.ConnectTimeout:
            _timed_out(b, timeout, t, due, "ConnectTimeout", "TLS handshake timer")
            raise


def _counted(b: AttemptBound, data: bytes, core: Any) -> bytes:
    """Count `data` against the byte cap; its first byte ends a reply's first-byte phase."""
    if data and b.phase == "first byte":
        b.first_byte()
    b.received += len(data)
    if b.received > b.max_bytes:
        b.tripped = "bytes"
        raise core.ReadError(str(b.error()))
    return data


class _Backend:
    """A sync network backend whose streams obey the current attempt's bound."""

    __slots__ = ("_b", "_core")

    def __init__(self, backend: Any, core: Any) -> None:
        self._b = backend
        self._core = core

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, **kw: Any) -> Any:
        b = _CURRENT.get()
        if b is None:
            return _Stream(self._b.connect_tcp(host, port, timeout, **kw), self._core)
        t = _limit(b, timeout, self._core, "ConnectTimeout")
        due = b.due
        try:
            return _Stream(self._b.connect_tcp(host, port, t, **kw), self._core)
        except self._core.ConnectTimeout:
            _timed_out(b, timeout, t, due, "ConnectTimeout", "connect timer")
            raise

    def connect_unix_socket(self, path: str, timeout: float | None = None, **kw: Any) -> Any:
        b = _CURRENT.get()
        if b is None:
            return _Stream(self._b.connect_unix_socket(path, timeout, **kw), self._core)
        t = _limit(b, timeout, self._core, "ConnectTimeout")
        due = b.due
        try:
            return _Stream(self._b.connect_unix_socket(path, t, **kw), self._core)
        except self._core.ConnectTimeout:
            _timed_out(b, timeout, t, due, "ConnectTimeout", "connect timer")
            raise

    def sleep(self, seconds: float) -> None:
        self._b.sleep(seconds)


class _AsyncBackend:
    """The asyncio twin of `_Backend` (the same `_Op`, awaited)."""

    __slots__ = ("_b", "_core")

    def __init__(self, backend: Any, core: Any) -> None:
        self._b = backend
        self._core = core

    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, **kw: Any
    ) -> Any:
        b = _CURRENT.get()
        if b is None:
            return _AsyncStream(await self._b.connect_tcp(host, port, timeout, **kw), self._core)
        t = _limit(b, timeout, self._core, "ConnectTimeout")
        due = b.due
        try:
            return _AsyncStream(await self._b.connect_tcp(host, port, t, **kw), self._core)
        except self._core.ConnectTimeout:
            _timed_out(b, timeout, t, due, "ConnectTimeout", "connect timer")
            raise

    async def connect_unix_socket(self, path: str, timeout: float | None = None, **kw: Any) -> Any:
        b = _CURRENT.get()
        if b is None:
            inner = await self._b.connect_unix_socket(path, timeout, **kw)
            return _AsyncStream(inner, self._core)
        t = _limit(b, timeout, self._core, "ConnectTimeout")
        due = b.due
        try:
            return _AsyncStream(await self._b.connect_unix_socket(path, t, **kw), self._core)
        except self._core.ConnectTimeout:
            _timed_out(b, timeout, t, due, "ConnectTimeout", "connect timer")
            raise

    async def sleep(self, seconds: float) -> None:
        await self._b.sleep(seconds)


def _wrap_pool(pool: Any) -> bool:
    """Wrap one connection pool's network backend (httpcore / httpcore2); False when
    the pool is not one we know how to wrap."""
    backend = getattr(pool, "_network_backend", None)
    if backend is None:
        return False
    if isinstance(backend, _Backend | _AsyncBackend):
        return True
    core = sys.modules.get(type(pool).__module__.partition(".")[0])
    if core is None or not hasattr(core, "ReadTimeout"):
        return False
    if inspect.iscoroutinefunction(getattr(backend, "connect_tcp", None)):
        pool._network_backend = _AsyncBackend(backend, core)
    else:
        pool._network_backend = _Backend(backend, core)
    return True


#: HTTP clients whose every transport `instrument` wrapped (held weakly).
_WRAPPED: weakref.WeakSet[Any] = weakref.WeakSet()


def instrument_transport(transport: Any) -> bool:
    """`instrument` for one HTTP transport (an httpx / httpx2 ``HTTPTransport`` or
    ``AsyncHTTPTransport``): False when its pool is not one we know how to wrap."""
    return _wrap_pool(getattr(transport, "_pool", None))


def is_instrumented(client: Any) -> bool:
    """Do `client`'s requests obey the attempt bounds at the socket (`instrument`)?"""
    try:
        return getattr(client, "_client", client) in _WRAPPED
    except TypeError:
        return False


def instrument(client: Any) -> bool:
    """Make `client`'s requests obey the attempt bounds (an `openai.OpenAI` /
    `AsyncOpenAI`, or an httpx / httpx2 client). Call it before the client's first
    request (connections made earlier keep unbounded streams). Returns whether every
    transport of the client could be wrapped; one that cannot (a custom transport)
    keeps only the SDK's per-phase timeouts (and, with asyncio, ``asyncio.timeout``)."""
    http_client = getattr(client, "_client", client)
    transports = [getattr(http_client, "_transport", None)]
    mounts = getattr(http_client, "_mounts", None)
    if isinstance(mounts, dict):
        transports += list(mounts.values())
    ok = True
    for t in transports:
        if t is not None and not instrument_transport(t):
            ok = False
    if ok:
        with contextlib.suppress(TypeError):
            _WRAPPED.add(http_client)
    return ok
