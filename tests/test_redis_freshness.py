"""The Redis health store asks the server only when it has to: a turn that changes nothing,
after nobody changed anything, costs no round trip; any change another client or another
process made is still read by the next exchange, and losing the watch on the server's
invalidations means asking again.

Real `redis-server`, real backends; each scenario counts the commands a backend sends.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
from fallgate.fsm import Policy, Target, run
from fallgate.fsm.health.backend import Records
from fallgate.providers.stores.redis import RedisBackend
from fallgate.providers.stores.shared import RedisHealthStore
from fallgate.providers.testing.redis_server import RedisServer


def _read(records: Records, now: float) -> Records:
    return {}


def _put(key: str, n: int) -> Callable[[Records, float], Records]:
    return lambda records, now: {key: {"n": n}}


def _counted(backend: RedisBackend) -> list[object]:
    """The commands `backend` sends from now on (its command client's, not the watch's)."""
    sent: list[object] = []
    execute = backend._client.execute_command

    def counting(*args: object, **options: object) -> object:
        sent.append(args[0])
        return execute(*args, **options)

    backend._client.execute_command = counting  # type: ignore[method-assign]
    return sent


@pytest.fixture
def backends(redis_server: RedisServer) -> Iterator[Callable[[], RedisBackend]]:
    opened: list[RedisBackend] = []

    def make() -> RedisBackend:
        backend = RedisBackend(redis_server.url, timeout=5)
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        backend.close()


def test_reading_records_nobody_changed_since_costs_no_round_trip(backends) -> None:
    backend = backends()
    backend.transact(["a", "b"], _put("a", 1), ttl=60)
    backend.transact(["a", "b"], _read, ttl=60)  # our own write's invalidation: read once
    sent = _counted(backend)
    for _ in range(20):
        records, _ = backend.transact(["a", "b"], _read, ttl=60)
        assert records["a"] == {"n": 1} and records["b"] is None
    assert sent == []


def test_a_write_by_another_client_is_read_by_the_next_exchange(backends) -> None:
    mine, theirs = backends(), backends()
    mine.transact(["k"], _read, ttl=60)
    for n in range(1, 30):  # each write is seen by the very next read, never later
        theirs.transact(["k"], _put("k", n), ttl=60)
        records, _ = mine.transact(["k"], _read, ttl=60)
        assert records["k"] == {"n": n}


def test_a_write_by_another_process_is_read_by_the_next_exchange(
    redis_server: RedisServer, backends
) -> None:
    mine = backends()
    mine.transact(["k"], _read, ttl=60)
    mine.transact(["k"], _read, ttl=60)
    writer = (
        "import sys; from fallgate.providers.stores.redis import RedisBackend as B; "
        "b = B(sys.argv[1]); b.transact(['k'], lambda r, now: {'k': {'n': 7}}, ttl=60)"
    )
    subprocess.run([sys.executable, "-c", writer, redis_server.url], check=True, timeout=60)
    records, _ = mine.transact(["k"], _read, ttl=60)
    assert records["k"] == {"n": 7}


def test_after_the_watch_lost_its_connection_the_backend_asks_again(
    redis_server: RedisServer, backends
) -> None:
    import redis

    mine = backends()
    mine.transact(["k"], _read, ttl=60)
    admin = redis.Redis.from_url(redis_server.url)
    # the watch's connection is the one in tracking mode: cut it, then change the record
    # from a plain client (no backend of this process to tell of it)
    [tracking] = [c for c in admin.client_list() if "t" in c["flags"]]
    admin.client_kill_filter(_id=tracking["id"])
    admin.set("{fallgate}:k", '1.1.1 {"n":5}')
    records, _ = mine.transact(["k"], _read, ttl=60)
    assert records["k"] == {"n": 5}
    admin.close()


def test_a_server_restart_forgets_freshness(redis_server: RedisServer, backends) -> None:
    mine = backends()
    mine.transact(["k"], _put("k", 1), ttl=60)
    mine.transact(["k"], _read, ttl=60)
    redis_server.kill()
    redis_server.start()
    # the server came back empty: the record is gone, and the backend must not serve it
    records, _ = mine.transact(["k"], _read, ttl=60)
    assert records["k"] is None


def test_a_happy_turn_on_a_redis_store_makes_no_round_trip(redis_server: RedisServer) -> None:
    """The store's exchanges (begin, grant, end) of a one-attempt answered turn, once the
    chain's records are known and nobody changed them: no command at all."""
    store = RedisHealthStore(redis_server.url)
    policy = Policy(
        [Target("p", "m", "http://127.0.0.1:9/v1", keyless=True),
         Target("p", "m2", "http://127.0.0.1:9/v1", keyless=True)]
    )
    for _ in range(3):
        assert run(policy, lambda *_: "ok", health=store).attempts == 1
    sent = _counted(store.backend)  # type: ignore[arg-type]
    for _ in range(10):
        assert run(policy, lambda *_: "ok", health=store).attempts == 1
    assert sent == []
    store.backend.close()
