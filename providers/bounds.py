"""Hard bounds on one attempt: total wall-clock time and bytes received.

The SDK's ``timeout=`` reaches the HTTP library as a limit on each phase and
each socket read, so a server that trickles a byte every 0.4 s (its headers,
its body, or SSE keep-alive comments) is never timed out, and an endless body
grows memory without end. Here an attempt gets two hard bounds of its own:

- a **deadline** on the monotonic clock: the attempt's total time (connect,
  headers, body), ``Attempt.timeout`` from its start (``attempt_timeout``, or
  what is left of the turn's deadline). A stream runs under it until its first
  content event has reached the caller; after that each wait for the next
  event has ``stream_idle_timeout`` (the caller's own time between events is
  not counted);
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
import math
import sys
import time
import weakref
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Final

from ..fsm.actions import Attempt
from ..fsm.policy import Policy
from .classify import MalformedReply

__all__ = [
    "AttemptBound",
    "AttemptTimeout",
    "BodyTooLarge",
    "abounded",
    "attempt_bound",
    "bounded",
    "instrument",
    "is_instrumented",
]

_MONOTONIC = time.monotonic

#: A timer that fired later than this (seconds) past its due time, and by more than
#: `STARVED_SHARE` of its own length, fired late because the process was starved: 0.1 s
#: is asyncio's own threshold for a callback that blocks the loop
#: (``loop.slow_callback_duration``); the share keeps ordinary scheduling noise on a
#: busy machine (a few hundredths of a 4 s timeout) the target's.
STARVED_AFTER = 0.1
STARVED_SHARE = 0.25


def starved(late: float, length: float) -> bool:
    """Did a timer `length` seconds long that fired `late` seconds past its due time
    fire late because the process was starved?"""
    return late > STARVED_AFTER and late > STARVED_SHARE * length


class _Starvation:
    """When a timer of this process last fired late enough to say it was starved, and
    how late (starvation is the process's: every client in it shares the CPU). An
    attempt whose own timer fired on time, but that was out while the process starved,
    spent its time waiting for the process too (each of its steps waits for a loop
    iteration): its timeout is no more the target's than a late one."""

    __slots__ = ("at", "late")

    def __init__(self) -> None:
        self.at = -math.inf
        self.late = 0.0


STARVATION = _Starvation()


class AttemptTimeout(TimeoutError):
    """An attempt ran out of its total time (or a stream out of its idle time), or a
    timer of it fired late.
    `unsent`: it ran out before the attempt's first network operation (the client
    was busy: under a burst a thousand turns share one event loop), so the target
    never saw it. `starved`: the timer that ended it fired well past its due time
    (`starved()`): the process did not run meanwhile, so whatever the target did
    went unobserved. Either makes it a client-side fault (`client_side`)."""

    def __init__(self, message: str, unsent: bool = False, starved: bool = False) -> None:
        super().__init__(message)
        self.unsent = unsent
        self.starved = starved

    @property
    def client_side(self) -> bool:
        """The fault is this client's, not the target's (`fsm.Outcome.client_side`)."""
        return self.unsent or self.starved


class BodyTooLarge(MalformedReply):
    """A reply larger than ``max_body_bytes`` (classified as a malformed reply)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the reply exceeded max_body_bytes ({limit} bytes)")
        self.limit = limit


class AttemptBound:
    """The bounds of one attempt in progress (mutable: a stream moves its deadline)."""

    __slots__ = (
        "deadline",
        "due",
        "lag",
        "late",
        "late_timer",
        "max_bytes",
        "phase",
        "received",
        "seconds",
        "started",
        "timed_out",
        "touched",
        "tripped",
        "unsent",
    )

    def __init__(self, seconds: float, max_bytes: int) -> None:
        #: The limit the deadline was last set from, and what it bounds (for messages).
        self.seconds = seconds
        self.phase = "total"
        self.started = _MONOTONIC()
        self.deadline = self.started + seconds
        self.max_bytes = max_bytes
        self.received = 0
        #: What ran out: "time", "bytes", or None.
        self.tripped: str | None = None
        #: A network operation (connect, read, write) has started under this bound.
        self.touched = False
        #: The time ran out before any did.
        self.unsent = False
        #: When the timer of the network operation in progress is due (monotonic).
        self.due = self.deadline
        #: How late a timer of this attempt fired, when it fired late enough to say the
        #: process was starved (`starved()`); 0.0 otherwise. `late_timer` names it.
        self.late = 0.0
        self.late_timer = ""
        #: How late its timers fired at most, however little (`admission` reads it).
        self.lag = 0.0
        #: A timer of it fired (`fired`).
        self.timed_out = False

    def restart(self, seconds: float) -> None:
        """Start the bound over from now, `seconds` long (the attempt waited for a slot
        before it began: `admission`)."""
        self.seconds = seconds
        self.started = _MONOTONIC()
        self.deadline = self.due = self.started + seconds

    def idle(self, seconds: float) -> None:
        """From now on, the next event must come within `seconds` (a committed stream)."""
        self.seconds = seconds
        self.phase = "idle"
        self.deadline = _MONOTONIC() + seconds

    def left(self) -> float:
        return self.deadline - _MONOTONIC()

    def fired(self, timer: str, length: float, due: float) -> None:
        """A timer of this attempt (`timer`, `length` seconds, due at `due`) fired: note
        how late, when that says the process was starved."""
        now = _MONOTONIC()
        late = now - due
        self.timed_out = True
        if late > self.lag:
            self.lag = late
        if starved(late, length):
            STARVATION.at = now
            STARVATION.late = late
            if late > self.late:
                self.late = late
                self.late_timer = timer
        elif not self.late and STARVATION.at >= self.started:
            # on time, but the process starved while this attempt was out
            self.late = STARVATION.late
            self.late_timer = "process's timers"

    def starved(self) -> bool:
        """Was the process starved while this attempt was out, as far as it knows?"""
        return self.late > 0.0

    def error(self) -> Exception:
        """What the attempt raises once a bound has tripped, or once a timer of it fired
        late enough to say the process was starved."""
        if self.tripped == "bytes":
            return BodyTooLarge(self.max_bytes)
        starved = self.late > 0.0
        late = (
            f"the {self.late_timer} fired {self.late:.2g} s late (the process was starved)"
            if starved
            else ""
        )
        if self.tripped is None:  # a timer of the SDK's own (per phase), fired late
            return AttemptTimeout(late, starved=starved)
        late = f"; {late}" if starved else ""
        if self.phase == "idle":
            return AttemptTimeout(
                f"stream idle for {self.seconds:g} s (stream_idle_timeout){late}", starved=starved
            )
        if self.unsent:
            return AttemptTimeout(
                f"attempt exceeded its {self.seconds:g} s total time bound before it "
                f"reached the network{late}",
                unsent=True,
                starved=starved,
            )
        return AttemptTimeout(
            f"attempt exceeded its {self.seconds:g} s total time bound{late}", starved=starved
        )


def attempt_bound(policy: Policy, a: Attempt) -> AttemptBound:
    """The bounds of attempt `a`: its timeout (what the turn's deadline leaves of
    ``attempt_timeout``) and the policy's ``max_body_bytes``."""
    return AttemptBound(a.timeout, policy.max_body_bytes)


_CURRENT: Final[contextvars.ContextVar[AttemptBound | None]] = contextvars.ContextVar(
    "fallgate_attempt_bound", default=None
)


@contextlib.contextmanager
def bounded(bound: AttemptBound) -> Iterator[AttemptBound]:
    """Run the block under `bound` (sync); a tripped bound raises its own error."""
    token = _CURRENT.set(bound)
    try:
        yield bound
    except Exception as e:
        if bound.tripped is not None or bound.late:
            raise bound.error() from e
        raise
    finally:
        _CURRENT.reset(token)


class abounded:  # lower case: used like a function, ``async with abounded(bound):``
    """The asyncio twin of `bounded`; with `backstop`, also ``asyncio.timeout`` at the
    deadline (for a client whose transport `instrument` could not wrap, and for time
    spent outside the socket). Never hold it across a ``yield`` to the caller. A class,
    not a generator: a stream enters one per event."""

    __slots__ = ("_backstop", "_bound", "_length", "_timeout", "_token")

    def __init__(self, bound: AttemptBound, *, backstop: bool = True) -> None:
        self._bound = bound
        self._backstop = backstop
        self._timeout: Any = None
        self._token: Any = None
        self._length = 0.0

    async def __aenter__(self) -> AttemptBound:
        self._token = _CURRENT.set(self._bound)
        if self._backstop:
            self._length = max(0.0, self._bound.left())
            self._timeout = asyncio.timeout(self._length)
            await self._timeout.__aenter__()
        return self._bound

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool:
        bound = self._bound
        try:
            if self._timeout is not None:
                await self._timeout.__aexit__(
                    et, e, tb
                )  # a CancelledError of its own: TimeoutError
        except TimeoutError as te:
            if bound.tripped is None:
                bound.tripped = "time"
            bound.fired("total time bound", self._length, bound.deadline)
            raise bound.error() from te
        finally:
            _CURRENT.reset(self._token)
        if isinstance(e, TimeoutError) and bound.tripped is None and bound.left() <= 0:
            bound.tripped = "time"
        if isinstance(e, Exception) and (bound.tripped is not None or bound.late):
            raise bound.error() from e
        return False


# -- the network layer --------------------------------------------------------------------------


def _limit(b: AttemptBound, timeout: float | None, core: Any, exc: str) -> float:
    """The timeout for one socket operation of a bounded attempt (noted as `b.due`);
    raises the library's `exc` once the deadline has passed (noting how long ago: no
    network operation was waiting then, so a deadline noticed long after it passed
    ran out while the process was kept from running)."""
    now = _MONOTONIC()
    left = b.deadline - now
    if left <= 0:
        if b.tripped is None:
            b.tripped = "time"
            b.unsent = not b.touched
            b.fired("total time bound", b.seconds, b.deadline)
        raise getattr(core, exc)(str(b.error()))
    b.touched = True
    t = left if timeout is None or timeout > left else timeout
    b.due = now + t
    return t


def _counted(b: AttemptBound, data: bytes, core: Any) -> bytes:
    b.received += len(data)
    if b.received > b.max_bytes:
        b.tripped = "bytes"
        raise core.ReadError(str(b.error()))
    return data


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
        core = self._core
        t = _limit(b, timeout, core, "ReadTimeout")
        due = b.due
        try:
            data = self._s.read(max_bytes, t)
        except core.ReadTimeout:
            if timeout is None or t < timeout:  # the bound, not the read's own limit, ran out
                b.tripped = b.tripped or "time"
            b.fired("read timer", t, due)
            raise
        return _counted(b, data, core)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        b = _CURRENT.get()
        if b is None:
            self._s.write(buffer, timeout)
            return
        core = self._core
        t = _limit(b, timeout, core, "WriteTimeout")
        due = b.due
        try:
            self._s.write(buffer, t)
        except core.WriteTimeout:
            b.fired("write timer", t, due)
            raise

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: Any = None
    ) -> Any:
        b = _CURRENT.get()
        if b is None:
            return _Stream(self._s.start_tls(ssl_context, server_hostname, timeout), self._core)
        core = self._core
        t = _limit(b, timeout, core, "ConnectTimeout")
        due = b.due
        try:
            return _Stream(self._s.start_tls(ssl_context, server_hostname, t), core)
        except core.ConnectTimeout:
            b.fired("TLS handshake timer", t, due)
            raise


class _AsyncStream:
    """The asyncio twin of `_Stream`."""

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
        core = self._core
        t = _limit(b, timeout, core, "ReadTimeout")
        due = b.due
        try:
            data = await self._s.read(max_bytes, t)
        except core.ReadTimeout:
            if timeout is None or t < timeout:  # the bound, not the read's own limit, ran out
                b.tripped = b.tripped or "time"
            b.fired("read timer", t, due)
            raise
        return _counted(b, data, core)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        b = _CURRENT.get()
        if b is None:
            await self._s.write(buffer, timeout)
            return
        core = self._core
        t = _limit(b, timeout, core, "WriteTimeout")
        due = b.due
        try:
            await self._s.write(buffer, t)
        except core.WriteTimeout:
            b.fired("write timer", t, due)
            raise

    async def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: Any = None
    ) -> Any:
        b = _CURRENT.get()
        if b is None:
            inner = await self._s.start_tls(ssl_context, server_hostname, timeout)
            return _AsyncStream(inner, self._core)
        core = self._core
        t = _limit(b, timeout, core, "ConnectTimeout")
        due = b.due
        try:
            inner = await self._s.start_tls(ssl_context, server_hostname, t)
        except core.ConnectTimeout:
            b.fired("TLS handshake timer", t, due)
            raise
        return _AsyncStream(inner, core)


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
        core = self._core
        t = _limit(b, timeout, core, "ConnectTimeout")
        due = b.due
        try:
            return _Stream(self._b.connect_tcp(host, port, t, **kw), core)
        except core.ConnectTimeout:
            b.fired("connect timer", t, due)
            raise

    def connect_unix_socket(self, path: str, timeout: float | None = None, **kw: Any) -> Any:
        b = _CURRENT.get()
        if b is not None:
            timeout = _limit(b, timeout, self._core, "ConnectTimeout")
        return _Stream(self._b.connect_unix_socket(path, timeout, **kw), self._core)

    def sleep(self, seconds: float) -> None:
        self._b.sleep(seconds)


class _AsyncBackend:
    """The asyncio twin of `_Backend`."""

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
        core = self._core
        t = _limit(b, timeout, core, "ConnectTimeout")
        due = b.due
        try:
            return _AsyncStream(await self._b.connect_tcp(host, port, t, **kw), core)
        except core.ConnectTimeout:
            b.fired("connect timer", t, due)
            raise

    async def connect_unix_socket(self, path: str, timeout: float | None = None, **kw: Any) -> Any:
        b = _CURRENT.get()
        if b is not None:
            timeout = _limit(b, timeout, self._core, "ConnectTimeout")
        return _AsyncStream(await self._b.connect_unix_socket(path, timeout, **kw), self._core)

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
        if t is None:
            continue
        if not _wrap_pool(getattr(t, "_pool", None)):
            ok = False
    if ok:
        with contextlib.suppress(TypeError):
            _WRAPPED.add(http_client)
    return ok
