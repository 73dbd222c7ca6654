"""pytest plugin (entry point ``pytest11: fallgate``): the `fault_server` and
`redis_server` fixtures.

Installed with fallgate; nothing to import or register:

def test_falls_back(fault_server):
    fault_server.script({"models": {"a": [{"kind": "status", "status": 503}]}})
    client = openai.OpenAI(base_url=fault_server.base_url, api_key="sk-test")
    ...
    assert fault_server.count("a") == 1
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .fault_server import FaultServer
from .redis_server import RedisServer, RedisServerMissing


@pytest.fixture
def fault_server() -> Iterator[FaultServer]:
    """A started fault server on loopback with an empty script (every model
    answers "ok"); set the script with ``fault_server.script({...})``. Stopped,
    with its sockets closed and threads joined, when the test ends."""
    with FaultServer() as server:
        yield server


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A real `redis-server` from PATH on a free loopback port, without persistence
    (``redis_server.url``); ``redis_server.stop()`` / ``.kill()`` and ``.start()`` take it
    away and bring it back on the same port mid-test. Stopped and its folder removed when
    the test ends; the test is skipped, saying why, where redis-server is not installed."""
    try:
        server = RedisServer()
    except RedisServerMissing as e:
        pytest.skip(str(e))
    with server:
        yield server
