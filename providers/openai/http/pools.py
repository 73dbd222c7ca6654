"""One real SDK client per (target, credential), built lazily, rebuilt on demand.

Keys are read at use time (`Credential.resolve`): a changed environment
variable gets a fresh client on the next attempt, a missing one raises
`fsm.MissingCredential` naming the variable. Every client is made with the
SDK's own retries off (`max_retries=0`), so retries never multiply.

The default factories never let the SDK pick an endpoint, a key or headers
from its own environment defaults (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
``OPENAI_CUSTOM_HEADERS``; ``OPENAI_ORG_ID`` / ``OPENAI_PROJECT_ID`` anywhere
but OpenAI's own endpoint): `client_arguments` passes the target's base_url
and key explicitly, and `check_client` verifies what the SDK made of them.

Clients are shared by concurrent turns, so "close and recreate" (transport
recovery, a key change) *retires* a client: new attempts get a fresh one at
once, and the old one is closed when its last in-flight request lets go of it.

Transport recovery is scoped to a client *generation*: each target's clients
carry the generation they were built in, a turn notes the generation it leased
(`Seen`), and its rebuild names it. When the target has been rebuilt since,
the rebuild is already done and the turn reuses the new clients; when its
client answered another turn after this turn's attempt began, it is not broken
(the server or the event loop is overloaded) and is kept. So a burst of
turns that all saw the same broken client rebuilds it once, not once per turn:
under overload, rebuilding per turn threw away every warm connection the other
turns shared and sent a new wave of connects into an overflowing accept queue.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar
from urllib.parse import urlsplit

import attrs
import openai

from ....fsm import Target
from ....fsm.errors import MissingCredential
from ....fsm.policy.model import Credential
from ....fsm.redact import safe_url
from ..exceptions import ClientClosed, ClientUnavailable
from ..pacing import attach
from . import sse, transport
from .bounds import instrument
from .transport import shared_ssl_context

C = TypeVar("C", openai.OpenAI, openai.AsyncOpenAI)
ClientFactory = Callable[[Target, str], openai.OpenAI]
AsyncClientFactory = Callable[[Target, str], openai.AsyncOpenAI]

__all__ = [
    "AsyncClientFactory",
    "AsyncClientPool",
    "ClientFactory",
    "ClientPool",
    "Seen",
    "async_openai_factory",
    "check_client",
    "client_arguments",
    "interrupt",
    "interrupt_transport",
    "openai_factory",
    "shared_ssl_context",
]

#: Hosts where the SDK's OPENAI_ORG_ID / OPENAI_PROJECT_ID headers mean something.
_OPENAI_HOSTS = frozenset({"api.openai.com"})


def _ambient_header_names() -> list[str]:
    """The header names the SDK would add from ``OPENAI_CUSTOM_HEADERS`` (openai 3.x
    reads it: ``Name: value`` per line; its ``Authorization`` would replace the key)."""
    text = os.environ.get("OPENAI_CUSTOM_HEADERS") or ""
    return [line.split(":", 1)[0].strip() for line in text.splitlines() if ":" in line]


def client_arguments(target: Target, api_key: str) -> dict[str, Any]:
    """The SDK constructor arguments that make `target`'s endpoint and key explicit.

    The SDK fills what it is not given from its environment: ``base_url=None``
    means ``OPENAI_BASE_URL`` (else api.openai.com), a missing key means
    ``OPENAI_API_KEY``, and openai 3.x adds ``OPENAI_CUSTOM_HEADERS`` (whose
    ``Authorization`` wins over the key). So a target without a base_url, or
    an empty key, is refused here, and the headers the environment would add
    are masked (`openai.Omit`), as are the organization and project headers
    for anything but OpenAI's own endpoint.
    """
    if not isinstance(target.base_url, str) or not target.base_url:
        raise ValueError(
            f"target {target.name} ({target.provider}) has no base_url: refusing to let the "
            "SDK pick its default endpoint (OPENAI_BASE_URL / api.openai.com)"
        )
    if not isinstance(api_key, str) or not api_key:
        raise ValueError(
            f"target {target.name} ({target.provider}) has an empty key: refusing to let the "
            "SDK read OPENAI_API_KEY"
        )
    omit = openai.Omit()
    headers: dict[str, Any] = {name: omit for name in _ambient_header_names()}
    if urlsplit(target.base_url).hostname not in _OPENAI_HOSTS:
        headers["OpenAI-Organization"] = omit
        headers["OpenAI-Project"] = omit
    headers["Authorization"] = f"Bearer {api_key}"
    return {"api_key": api_key, "base_url": target.base_url, "default_headers": headers}


def check_client(client: Any, target: Target, api_key: str) -> None:
    """Raises unless `client` talks to `target`'s base_url with `api_key` (what the
    SDK made of `client_arguments`; a mismatch would send the prompt elsewhere)."""
    got = str(client.base_url).rstrip("/")
    want = str(target.base_url).rstrip("/")
    if got != want or client.api_key != api_key:
        raise ValueError(
            f"the SDK client for target {target.name} points at {safe_url(got)!r}, "
            f"not {safe_url(want)!r} "
            "(or carries another key): refusing to send"
        )


def openai_factory(timeout: float) -> ClientFactory:
    """The default sync factory: `openai.OpenAI` at the target's base_url with its key
    (nothing taken from the SDK's environment defaults), no SDK retries."""

    def build(target: Target, api_key: str) -> openai.OpenAI:
        client = openai.OpenAI(
            **client_arguments(target, api_key),
            max_retries=0,
            timeout=timeout,
            http_client=transport.sync_http_client(timeout, sse.FilteringTransport),
        )
        try:
            check_client(client, target, api_key)
        except ValueError:
            client.close()
            raise
        return client

    return build


def async_openai_factory(timeout: float) -> AsyncClientFactory:
    """The default async factory: `openai.AsyncOpenAI`, same rules as `openai_factory`."""

    def build(target: Target, api_key: str) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(
            **client_arguments(target, api_key),
            max_retries=0,
            timeout=timeout,
            http_client=transport.async_http_client(timeout, sse.AsyncFilteringTransport),
        )
        check_client(client, target, api_key)  # nothing to close yet: no request was made
        return client

    return build


class Seen:
    """One turn's view of the pool: per target name, the client generation it last
    leased and when (monotonic seconds)."""

    __slots__ = ("generation", "leased_at")

    def __init__(self) -> None:
        self.generation: dict[str, int] = {}
        self.leased_at: dict[str, float] = {}


@attrs.define(eq=False)
class _Entry(Generic[C]):
    client: C
    fingerprint: int  # of the key (`_fingerprint`): tells a changed env var, not keeping it
    generation: int = 0  # the target's rebuild count when this client was built
    users: int = 0
    bounded: bool = False  # its requests obey the attempt bounds at the socket (`instrument`)


def _fingerprint(key: str) -> int:
    """The key's salted hash (per process; never leaves it). Read before every attempt:
    a sha256 here was ~0.4 % of a turn's CPU in `bench.throughput`."""
    return hash(key)


class _Pool(Generic[C]):
    """The bookkeeping shared by the sync and async pools (no I/O here)."""

    #: The SDK client class a factory must return, and the wrapper that takes it.
    _SDK: ClassVar[tuple[type, str]] = (object, "")

    def __init__(self, factory: Callable[[Target, str], C]) -> None:
        self._factory: Callable[[Target, str], C] = factory
        self._lock = threading.Lock()
        self._live: dict[tuple[str, str], _Entry[C]] = {}
        self._retired: list[_Entry[C]] = []
        self._generation: dict[str, int] = {}  # target name -> rebuilds so far
        self._ok_at: dict[str, float] = {}  # target name -> last answer on its generation
        self._closed = False
        self.built = 0  # clients created so far (for tests and stats)
        self.rebuilds = 0  # transport recoveries that built new clients

    def _build(self, target: Target, key: str, generation: int) -> _Entry[C]:
        try:
            client = self._factory(target, key)
        except Exception as e:
            raise ClientUnavailable(target.name, e) from e
        sdk, wrapper = self._SDK
        if not isinstance(client, sdk):
            # the caller's mistake, not the target's: raised to the caller, never retried
            _discard(client)
            raise TypeError(
                f"client_factory must return an {sdk.__module__}.{sdk.__qualname__} for "
                f"{wrapper}, got {type(client).__module__}.{type(client).__qualname__} "
                f"(for target {target.name})"
            )
        if getattr(client, "max_retries", 0) != 0:
            # A user factory forgot: the engine owns retries, the SDK must not add its own.
            client = client.with_options(max_retries=0)
        # each attempt's total time and bytes (`providers.openai.http.bounds`)
        bounded = instrument(client)
        attach(client)  # every reply's rate-limit headers, for pacing (any factory's client)
        self.built += 1
        return _Entry(client, _fingerprint(key), generation, bounded=bounded)

    def _retire(self, entry: _Entry[C]) -> None:
        self._retired.append(entry)

    def _collect(self) -> list[C]:
        """Retired clients nobody uses any more (to close outside the lock)."""
        done = [e for e in self._retired if e.users <= 0]
        if done:
            self._retired = [e for e in self._retired if e.users > 0]
        return [e.client for e in done]

    def _acquire(
        self, target: Target, cred: Credential, seen: Seen | None
    ) -> tuple[_Entry[C], list[C]]:
        name = target.name
        if seen is not None:  # noted first: a client that cannot be built was still seen
            seen.generation[name] = self._generation.get(name, 0)
            seen.leased_at[name] = time.monotonic()
        key = cred.resolve(name)  # MissingCredential names the variable
        fp = _fingerprint(key)
        slot = (name, cred.id)
        with self._lock:
            if self._closed:
                raise ClientClosed
            entry = self._live.get(slot)
            if entry is None or entry.fingerprint != fp:
                if entry is not None:
                    self._retire(entry)
                entry = self._build(target, key, self._generation.get(name, 0))
                self._live[slot] = entry
            entry.users += 1
            if seen is not None:
                seen.generation[name] = entry.generation
            return entry, self._collect() if self._retired else []

    def _let_go(self, entry: _Entry[C], name: str, ok: bool) -> list[C]:
        with self._lock:
            entry.users -= 1
            if ok and entry.generation == self._generation.get(name, 0):
                self._ok_at[name] = time.monotonic()
            return self._collect() if self._retired else []

    def answered_others(self, target: Target, seen: Seen) -> bool:
        """Did `target` answer another attempt since this turn's last lease of it (on
        its current clients)? Then it is up: a transport fault of this turn's attempt is
        its connection's (`fsm.Outcome.client_side`)."""
        name = target.name
        return self._ok_at.get(name, -math.inf) > seen.leased_at.get(name, math.inf)

    def _renew(self, target: Target, seen: Seen | None) -> list[C]:
        """Retire `target`'s clients and build fresh ones for every credential that
        resolves; raises `ClientUnavailable` when the factory fails. With `seen` (the
        turn's view), nothing happens when the target was rebuilt after the generation
        the turn leased: that rebuild was the one this turn asks for."""
        name = target.name
        with self._lock:
            if self._closed:
                raise ClientClosed
            gen = self._generation.get(name, 0)
            if seen is not None and name in seen.generation:
                if seen.generation[name] < gen:  # rebuilt since this turn's client
                    seen.generation[name] = gen
                    return []
                if self._ok_at.get(name, -math.inf) > seen.leased_at.get(name, math.inf):
                    # It answered another turn since this turn's attempt began: not
                    # broken (the server or the loop is overloaded); rebuilding would
                    # only throw away its warm connections.
                    return []
            gen += 1
            self._generation[name] = gen
            self._ok_at.pop(name, None)
            if seen is not None:
                seen.generation[name] = gen
            for slot in [s for s in self._live if s[0] == name]:
                self._retire(self._live.pop(slot))
            self.rebuilds += 1
            for cred in target.pool():
                try:
                    key = cred.resolve(name)
                except MissingCredential:
                    continue  # the next attempt with it reports the variable
                self._live[(name, cred.id)] = self._build(target, key, gen)
            return self._collect()

    def _close_all(self) -> list[C]:
        with self._lock:
            self._closed = True
            clients = [e.client for e in self._live.values()] + [e.client for e in self._retired]
            self._live.clear()
            self._retired.clear()
            return clients

    @property
    def closed(self) -> bool:
        """Closed by its owner (`close` / `aclose` has begun)."""
        return self._closed

    def cut(self, e: BaseException | None) -> None:
        """An attempt that failed with `e` on a client of this pool: once the pool is
        closed, whatever it failed with (its connection shut under it, a request the
        closed client refused) was the close, the owner's act: `ClientClosed` (from `e`),
        which the classifier reads as `cancelled` (the turn ends `aborted`, charged to no
        target)."""
        if self._closed and isinstance(e, Exception) and not isinstance(e, ClientClosed):
            raise ClientClosed from e

    def check_open(self) -> None:
        if self._closed:
            raise ClientClosed

    @property
    def open_clients(self) -> int:
        """Clients not yet closed (live and retired-but-in-use)."""
        with self._lock:
            return len(self._live) + len(self._retired)

    def generation(self, target: Target) -> int:
        """How many times `target`'s clients have been rebuilt."""
        return self._generation.get(target.name, 0)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "live": sorted(f"{t}/{c}" for t, c in self._live),
                "retired_in_use": len(self._retired),
                "built": self.built,
                "rebuilds": self.rebuilds,
                "closed": self._closed,
            }


class _Lease(Generic[C]):
    """One attempt's hold on a pooled client (``with pool.lease(...) as client``).
    A class rather than a generator-based context manager: one per attempt, on the
    hot path of every turn (`bench.throughput`)."""

    __slots__ = ("_cred", "_entry", "_pool", "_seen", "_target", "bounded")

    def __init__(self, pool: _Pool[C], target: Target, cred: Credential, seen: Seen | None):
        self._pool: _Pool[C] = pool
        self._target = target
        self._cred = cred
        self._seen = seen
        self._entry: _Entry[C] | None = None
        #: Once entered: do the client's requests obey the attempt bounds at the socket?
        self.bounded = False


class _SyncLease(_Lease[openai.OpenAI]):
    def __enter__(self) -> openai.OpenAI:
        entry, stale = self._pool._acquire(self._target, self._cred, self._seen)
        self._entry, self.bounded = entry, entry.bounded
        if stale:
            _close_sync(stale)
        client: openai.OpenAI = entry.client
        return client

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, _: object) -> None:
        assert self._entry is not None
        stale = self._pool._let_go(self._entry, self._target.name, et is None)
        if stale:
            _close_sync(stale)
        self._pool.cut(e)


class _AsyncLease(_Lease[openai.AsyncOpenAI]):
    async def __aenter__(self) -> openai.AsyncOpenAI:
        entry, stale = self._pool._acquire(self._target, self._cred, self._seen)
        self._entry, self.bounded = entry, entry.bounded
        if stale:
            await _close_async(stale)
        client: openai.AsyncOpenAI = entry.client
        return client

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, _: object
    ) -> None:
        assert self._entry is not None
        stale = self._pool._let_go(self._entry, self._target.name, et is None)
        if stale:
            await _close_async(stale)
        self._pool.cut(e)


class ClientPool(_Pool[openai.OpenAI]):
    """Sync clients, thread-safe."""

    _SDK = (openai.OpenAI, "Fallgate (openai.AsyncOpenAI is for AsyncFallgate)")

    def lease(self, target: Target, cred: Credential, seen: Seen | None = None) -> _SyncLease:
        """The client for (target, credential) for the duration of one attempt
        (``with pool.lease(...) as client``); its generation is noted in `seen` (the
        turn's view, for `rebuild`)."""
        return _SyncLease(self, target, cred, seen)

    def rebuild(self, target: Target, seen: Seen | None = None) -> None:
        """Transport recovery: close and recreate `target`'s clients, unless they were
        rebuilt since the generation `seen` notes (then the new ones serve)."""
        _close_sync(self._renew(target, seen))

    def close(self) -> None:
        """Close every client. Attempts in flight on them are cut at once (a sync read
        would otherwise wait for the server or its timeout) and end their turns
        `aborted` (`exceptions.ClientClosed`); none is made after."""
        clients = self._close_all()
        for c in clients:
            interrupt(c)
        _close_sync(clients)


class AsyncClientPool(_Pool[openai.AsyncOpenAI]):
    """Async clients; one event loop at a time (the SDK's connections belong to a loop)."""

    _SDK = (openai.AsyncOpenAI, "AsyncFallgate (openai.OpenAI is for Fallgate)")

    def lease(self, target: Target, cred: Credential, seen: Seen | None = None) -> _AsyncLease:
        """``async with pool.lease(...) as client``: see `ClientPool.lease`."""
        return _AsyncLease(self, target, cred, seen)

    async def rebuild(self, target: Target, seen: Seen | None = None) -> None:
        await _close_async(self._renew(target, seen))

    async def aclose(self) -> None:
        await _close_async(self._close_all())


def interrupt(client: Any) -> None:
    """Cut every request in flight on `client` (an SDK or HTTP client) now: its
    connections' sockets are shut down, which wakes a read blocked on another thread
    (closing the client alone does not). Best effort: a transport of the caller's own
    is left to its close."""
    http_client = getattr(client, "_client", client)
    transports = [getattr(http_client, "_transport", None)]
    mounts = getattr(http_client, "_mounts", None)
    if isinstance(mounts, dict):
        transports += list(mounts.values())
    for t in transports:
        if t is not None:
            interrupt_transport(t)


def interrupt_transport(t: Any) -> None:
    """`interrupt` for one HTTP transport (httpx / httpx2 over httpcore / httpcore2)."""
    try:
        connections = list(getattr(getattr(t, "_pool", None), "connections", ()))
    except Exception:  # not a pool we know
        return
    for conn in connections:
        inner = getattr(conn, "_connection", conn)  # HTTPConnection -> HTTP/1.1 or /2
        stream = getattr(inner, "_network_stream", None)
        info = getattr(stream, "get_extra_info", None)
        if info is None:
            continue
        with contextlib.suppress(Exception):
            sock = info("socket")
            if isinstance(sock, socket.socket):
                sock.shutdown(socket.SHUT_RDWR)


def _discard(client: Any) -> None:
    """Close what a factory built that cannot be used, if it closes without awaiting."""
    close = getattr(client, "close", None)
    if isinstance(client, openai.AsyncOpenAI) or not callable(close):
        return  # an async client's close is a coroutine: its connections are not open yet
    with contextlib.suppress(Exception):
        close()


def _close_sync(clients: list[openai.OpenAI]) -> None:
    for c in clients:
        c.close()


async def _close_async(clients: list[openai.AsyncOpenAI]) -> None:
    for c in clients:
        await c.close()
