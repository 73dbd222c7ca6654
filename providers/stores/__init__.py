"""Backends of the shared health store: one SQLite file per host, or a Redis server.

`open_backend` picks one from a URL (``sqlite:///path/to/health.db`` or
``redis://[:password@]host[:port][/db]``, ``rediss://``, ``unix://``). The Redis
backend needs the ``redis`` package (``pip install 'fallgate[redis]'``) and is
imported only when asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...fsm.health.backend import Backend
from .sqlite import SQLiteBackend
from .urls import masked

if TYPE_CHECKING:
    from .redis import RedisBackend

__all__ = ["Backend", "RedisBackend", "SQLiteBackend", "open_backend"]

REDIS_SCHEMES = ("redis", "rediss", "unix")


def redis_backend_class() -> type[RedisBackend]:
    """`RedisBackend`, or an ImportError saying which extra to install."""
    try:
        from .redis import RedisBackend
    except ImportError as e:
        if e.name != "redis":
            raise
        raise ImportError(
            "the Redis health store needs the redis package: pip install 'fallgate[redis]'",
            name="redis",
        ) from None
    return RedisBackend


def open_backend(url: str, *, create: bool = True) -> Backend:
    """The backend a store URL names; ValueError (naming the URL, never its password)
    for anything else, or for a SQLite file that does not exist unless `create`."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if sep and scheme == "sqlite":
        # sqlite:///relative.db is a relative path, sqlite:////abs.db an absolute one,
        # as in SQLAlchemy's URLs; sqlite:///:memory: would be a store of one process
        path = rest[1:] if rest.startswith("/") else rest
        if not path or path == ":memory:":
            raise ValueError(f"{url}: give the database file's path (sqlite:///path/to/health.db)")
        if not create and not Path(path).is_file():
            raise ValueError(f"{url}: no such health store file: {path}")
        return SQLiteBackend(path)
    if sep and scheme in REDIS_SCHEMES:
        return redis_backend_class()(url)
    raise ValueError(
        f"unsupported health store URL {masked(url)!r}: expected sqlite:///path/to/health.db "
        "or redis://host:port/db"
    )


def __getattr__(name: str) -> object:
    if name == "RedisBackend":
        return redis_backend_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
