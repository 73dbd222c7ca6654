"""The shared health stores users pass as ``health=``: one SQLite file per host, or Redis.

Both are `fsm.health.shared_store.SharedHealthStore` over a backend of this package: the turn reads
and writes a local replica, exchanged with the backend at most once per attempt; a
backend that cannot be reached leaves turns on local health with one WARNING, and is
tried again on the next exchange.
"""

from __future__ import annotations

import os

from ...fsm.health.shared_store import DEFAULT_TTL, SharedHealthStore
from .sqlite import SQLiteBackend


class SQLiteHealthStore(SharedHealthStore):
    """Health shared by the processes of one host through the SQLite file at `path`
    (created on first use if absent; its folder must exist). Never opens the file in
    the constructor: a folder that is missing, a full disk or a corrupt file only means
    local health (one WARNING) until the file can be used.

    `busy_timeout`: seconds one exchange may wait (for this process's other turns and
    another process's write together) before going on with local health. `ttl`: seconds
    a record outlives its last write."""

    __slots__ = ()

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ttl: float = DEFAULT_TTL,
        busy_timeout: float = 0.5,
    ) -> None:
        super().__init__(SQLiteBackend(path, busy_timeout=busy_timeout), ttl=ttl)

    def __repr__(self) -> str:
        return f"SQLiteHealthStore({self.name!r})"


class RedisHealthStore(SharedHealthStore):
    """Health shared by a fleet of hosts through the Redis server at `url`
    (``redis://[:password@]host[:port][/db]``, ``rediss://``, ``unix://``; needs
    ``pip install 'fallgate[redis]'``). Never connects in the constructor: a server
    that is down now only means local health until it answers.

    `namespace`: the key prefix (several fleets can share one server apart).
    `timeout`: seconds for connecting and each command. `reconnect_after`: seconds
    between tries while the server is unreachable. `ttl`: seconds a record outlives its
    last write (an expiry on the server, so host clocks do not matter)."""

    __slots__ = ()

    def __init__(
        self,
        url: str,
        *,
        ttl: float = DEFAULT_TTL,
        namespace: str = "fallgate",
        timeout: float = 0.5,
        reconnect_after: float = 1.0,
    ) -> None:
        from . import redis_backend_class

        backend = redis_backend_class()(
            url, namespace=namespace, timeout=timeout, reconnect_after=reconnect_after
        )
        super().__init__(backend, ttl=ttl)

    def __repr__(self) -> str:
        return f"RedisHealthStore({self.name!r})"
