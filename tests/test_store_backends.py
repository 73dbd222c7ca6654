"""The health-store backends keep the one contract of `fsm.health.backend.Backend`: an atomic
read-modify-write of records, expiry after a ttl, prefix deletion, a scan, and
`StoreUnavailable` (naming the store, never its password) when they cannot be reached.

Every backend (in-memory, SQLite, Redis) runs the same scenarios; the shared ones also
run them across real processes, against a real SQLite file and a real `redis-server`.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fallgate.fsm.health.backend import Backend, MemoryBackend, Records, StoreUnavailable
from fallgate.fsm.redact import safe_url
from fallgate.providers.stores import SQLiteBackend, open_backend
from fallgate.providers.stores.redis import RedisBackend
from fallgate.providers.stores.sqlite import BUSY_PAUSE
from fallgate.providers.testing.redis_server import RedisServer

Factory = Callable[[], Backend]


def _store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Factory]]:
    """(url, a factory of clients of one store): each client is a separate backend
    object, as separate processes would hold (the in-memory backend: the one object)."""
    opened: list[Backend] = []
    if request.param == "memory":
        memory = MemoryBackend()
        yield memory.url, lambda: memory
        return
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'health.db'}"
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        url = server.url

    def make() -> Backend:
        # a generous command timeout: on a loaded CI machine 8 threads may queue past 0.5 s
        backend = RedisBackend(url, timeout=5) if url.startswith("redis") else open_backend(url)
        opened.append(backend)
        return backend

    yield url, make
    for backend in opened:
        backend.close()


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Factory]]:
    yield from _store(request, tmp_path)


@pytest.fixture(params=["sqlite", "redis"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Factory]]:
    """A store that several processes share (a URL each can open)."""
    yield from _store(request, tmp_path)


def increment(key: str) -> Callable[[Records, float], Records]:
    def update(records: Records, now: float) -> Records:
        record = records[key] or {"n": 0}
        n = record["n"]
        assert isinstance(n, int)
        return {key: {"n": n + 1, "at": now}}

    return update


def count(backend: Backend, key: str) -> int:
    records, _ = backend.transact([key], lambda r, now: {}, ttl=60)
    record = records[key]
    return 0 if record is None else int(record["n"] or 0)


def test_absent_records_read_as_none_and_a_write_is_in_force_for_every_client(store) -> None:
    _, make = store
    a, b = make(), make()
    records, now = a.transact(["k", "other"], lambda r, now: {"k": {"v": "x", "n": 1}}, ttl=60)
    assert records == {"k": {"v": "x", "n": 1}, "other": None}
    assert abs(now - time.time()) < 5  # this host's clock and the server's are one here
    seen, _ = b.transact(["k", "other"], lambda r, now: {}, ttl=60)
    assert seen == {"k": {"v": "x", "n": 1}, "other": None}


def test_update_reads_what_another_client_wrote_since(store) -> None:
    _, make = store
    a, b = make(), make()
    a.transact(["k"], increment("k"), ttl=60)
    b.transact(["k"], increment("k"), ttl=60)  # a's view of "k" is now stale
    records, _ = a.transact(["k"], increment("k"), ttl=60)
    assert records["k"] is not None and records["k"]["n"] == 3
    assert count(b, "k") == 3


def test_a_record_mapped_to_none_is_deleted(store) -> None:
    _, make = store
    a, b = make(), make()
    a.transact(["k", "j"], lambda r, now: {"k": {"n": 1}, "j": {"n": 2}}, ttl=60)
    records, _ = b.transact(["k", "j"], lambda r, now: {"k": None}, ttl=60)
    assert records == {"k": None, "j": {"n": 2}}
    assert a.scan()[0] == {"j": {"n": 2}}


def test_an_update_that_raises_writes_nothing_and_the_store_goes_on(store) -> None:
    _, make = store
    a = make()
    a.transact(["k"], increment("k"), ttl=60)

    def broken(records: Records, now: float) -> Records:
        raise ZeroDivisionError("a bug in the caller's update")

    with pytest.raises(ZeroDivisionError):
        a.transact(["k"], broken, ttl=60)
    a.transact(["k"], increment("k"), ttl=60)
    assert count(make(), "k") == 2


def test_records_expire_after_their_ttl_and_a_write_renews_it(store) -> None:
    _, make = store
    a, b = make(), make()
    a.transact(["short", "renewed"], lambda r, now: {"short": {"n": 1}, "renewed": {"n": 1}}, 0.4)
    time.sleep(0.25)
    a.transact(["renewed"], increment("renewed"), ttl=0.4)
    time.sleep(0.25)  # "short" is 0.5 s old (expired), "renewed" written 0.25 s ago
    records, _ = b.transact(["short", "renewed"], lambda r, now: {}, ttl=60)
    assert records["short"] is None
    assert records["renewed"] is not None and records["renewed"]["n"] == 2
    assert set(b.scan()[0]) == {"renewed"}
    time.sleep(0.3)
    assert b.scan()[0] == {}
    assert a.transact(["renewed"], lambda r, now: {}, ttl=60)[0] == {"renewed": None}


def test_delete_removes_exactly_the_keys_under_a_prefix_even_with_pattern_characters(
    store,
) -> None:
    _, make = store
    a, b = make(), make()
    keys = ["t|a*b|m", "t|a*b|m|cred", "t|aXb|m", "t|a%b", "t|a_b", "t|a[1]", "u|a*b"]
    a.transact(keys, lambda r, now: {k: {"n": 1} for k in keys}, ttl=60)
    assert b.delete("t|a*b|") == 2
    assert b.delete("t|a%") == 1
    assert b.delete("t|a_") == 1
    assert b.delete("t|a[") == 1
    assert b.delete("nothing") == 0
    assert sorted(a.scan()[0]) == ["t|aXb|m", "u|a*b"]
    # a client that had read the deleted records sees them gone
    assert a.transact(["t|a*b|m"], lambda r, now: {}, ttl=60)[0] == {"t|a*b|m": None}


def test_scan_gives_every_record_and_the_store_clock(store) -> None:
    _, make = store
    a = make()
    a.transact(["x", "y"], lambda r, now: {"x": {"until": now + 20}, "y": {"s": "open"}}, 60)
    records, now = make().scan()
    assert set(records) == {"x", "y"}
    until = records["x"]["until"]
    assert isinstance(until, float) and 19 < until - now <= 20


def test_now_never_goes_back_for_one_client(store) -> None:
    _, make = store
    a = make()
    nows = [a.transact(["k"], increment("k"), ttl=60)[1] for _ in range(50)]
    assert nows == sorted(nows)


def test_threads_of_one_process_lose_no_increment(store) -> None:
    _, make = store
    backend = make()

    def work() -> None:
        for _ in range(50):
            backend.transact(["k"], increment("k"), ttl=60)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert count(backend, "k") == 400


WORKER = """
import sys
from fallgate.providers.stores import open_backend
url, n = sys.argv[1], int(sys.argv[2])
backend = open_backend(url)
def update(records, now):
    record = records["k"] or {"n": 0}
    return {"k": {"n": record["n"] + 1}}
for _ in range(n):
    backend.transact(["k"], update, 60)
backend.close()
"""


@pytest.mark.slow  # real worker processes
def test_processes_sharing_the_store_lose_no_increment(shared_store) -> None:
    """N real processes x M increments through `transact` leave exactly N*M."""
    url, make = shared_store
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, url, "150"], stderr=subprocess.PIPE)
        for _ in range(6)
    ]
    try:
        errors = [p.communicate(timeout=60)[1].decode() for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0] * 6, "\n".join(errors)
    assert count(make(), "k") == 900


# -- Redis: compare-and-set, server clock, expiry as durations, outages -----------------------


@pytest.fixture
def redis_backend(redis_server: RedisServer) -> Iterator[Callable[..., RedisBackend]]:
    """A factory of `RedisBackend` clients of the test's server, closed after the test."""
    opened: list[RedisBackend] = []

    def make(url: str | None = None, **options: float) -> RedisBackend:
        backend = RedisBackend(url or redis_server.url, **options)
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        backend.close()


def test_redis_reruns_update_on_a_conflict_with_the_fresh_records(
    redis_server, redis_backend
) -> None:
    a, b = redis_backend(), redis_backend()
    a.transact(["k"], increment("k"), ttl=60)
    b.transact(["k"], increment("k"), ttl=60)
    seen: list[object] = []

    def update(records: Records, now: float) -> Records:
        seen.append(records["k"] and records["k"]["n"])
        return increment("k")(records, now)

    records, _ = a.transact(["k"], update, ttl=60)
    assert seen == [1, 2]  # first on a's stale view, then again on what b wrote
    assert records["k"] is not None and records["k"]["n"] == 3


def test_redis_a_conflict_on_every_try_gives_up_after_its_time_bound_naming_it(
    redis_server, redis_backend
) -> None:
    """Contention is bounded in time (4 command timeouts), then it is an unavailable store."""
    a, b = redis_backend(timeout=0.05), redis_backend()
    a.transact(["k"], increment("k"), ttl=60)

    def update(records: Records, now: float) -> Records:
        b.transact(["k"], increment("k"), ttl=60)  # another writer wins every race
        return increment("k")(records, now)

    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"changed the same records on every try for 0\.2 s"):
        a.transact(["k"], update, ttl=60)
    assert 0.2 <= time.monotonic() - started < 2.0


def test_redis_common_case_is_one_round_trip(redis_server, redis_backend) -> None:
    """A client that wrote a key last updates it again with one command (the script)."""
    backend = redis_backend()
    backend.transact(["k"], increment("k"), ttl=60)
    client = backend._client
    sent: list[object] = []
    execute = client.execute_command

    def counting(*args: object, **options: object) -> object:
        sent.append(args[0])
        return execute(*args, **options)

    client.execute_command = counting  # type: ignore[method-assign]
    for _ in range(10):
        backend.transact(["k"], increment("k"), ttl=60)
    assert sent == ["EVALSHA"] * 10
    assert count(backend, "k") == 11


def test_redis_expiry_is_a_duration_on_the_server(redis_server, redis_backend) -> None:
    import redis

    backend = redis_backend()
    backend.transact(["k"], increment("k"), ttl=30)
    raw = redis.Redis.from_url(redis_server.url)
    [key] = raw.keys("*:k")
    assert 29_000 < raw.pttl(key) <= 30_000
    raw.close()


def test_redis_time_is_the_servers_whatever_this_hosts_wall_clock_says(
    redis_server, redis_backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis

    server_now = float(redis.Redis.from_url(redis_server.url).time()[0])
    monkeypatch.setattr(time, "time", lambda: 0.0)  # a host whose wall clock is wrong
    backend = redis_backend()
    _, now = backend.transact(["k"], increment("k"), ttl=60)
    assert abs(now - server_now) < 5
    _, scanned = backend.scan()
    assert abs(scanned - server_now) < 5


def test_redis_stopped_raises_store_unavailable_then_works_after_restart(
    redis_server, redis_backend
) -> None:
    backend = redis_backend(reconnect_after=0.2)
    backend.transact(["k"], increment("k"), ttl=60)
    redis_server.stop()
    for call in (
        lambda: backend.transact(["k"], increment("k"), ttl=60),
        backend.scan,
        lambda: backend.delete("k"),
    ):
        with pytest.raises(StoreUnavailable, match=f"^{redis_server.url}: "):
            call()
    redis_server.start()
    time.sleep(0.25)
    # the server came back empty (no persistence): nothing remembered from before is served
    records, _ = backend.transact(["k"], increment("k"), ttl=60)
    assert records["k"] is not None and records["k"]["n"] == 1


def test_redis_a_remembered_version_never_matches_a_newer_record_after_a_restart(
    redis_server,
    redis_backend,
) -> None:
    a = redis_backend()
    a.transact(["k"], increment("k"), ttl=60)  # a remembers k at its first version
    redis_server.kill()
    redis_server.start()
    b = redis_backend()
    b.transact(["k"], lambda r, now: {"k": {"n": 40}}, ttl=60)  # the first version again
    records, _ = a.transact(["k"], increment("k"), ttl=60)
    assert records["k"] is not None and records["k"]["n"] == 41


def test_redis_errors_name_the_url_but_never_its_password(redis_server, redis_backend) -> None:
    import redis

    admin = redis.Redis.from_url(redis_server.url)
    admin.config_set("requirepass", "the-right-one")
    admin.close()
    url = redis_server.url.replace("redis://", "redis://:hunter2secret@")
    backend = redis_backend(url, reconnect_after=0)
    with pytest.raises(StoreUnavailable) as refused:  # a wrong password
        backend.transact(["k"], increment("k"), ttl=60)
    redis_server.stop()
    with pytest.raises(StoreUnavailable) as unreachable:
        backend.scan()
    for caught in (refused, unreachable):
        message = str(caught.value)
        assert "hunter2secret" not in message
        assert message.startswith(f"redis://***@127.0.0.1:{redis_server.port}/0: ")
    assert "hunter2secret" not in repr(backend) and "hunter2secret" not in backend.url


def test_redis_unreachable_answers_at_once_until_it_is_time_to_reconnect(
    redis_server, redis_backend
) -> None:
    backend = redis_backend(reconnect_after=30)
    redis_server.stop()
    with pytest.raises(StoreUnavailable, match=r"Connection refused|connecting"):
        backend.scan()
    redis_server.start()
    with pytest.raises(StoreUnavailable, match="retrying shortly"):
        backend.scan()


# -- SQLite -----------------------------------------------------------------------------


def test_sqlite_a_lock_held_past_the_busy_timeout_is_store_unavailable(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "health.db"
    backend = SQLiteBackend(path, busy_timeout=0.1)
    backend.transact(["k"], lambda r, now: {}, ttl=60)  # opened (lazily) and prepared
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreUnavailable, match=f"^sqlite:///{path}: database is locked"):
        backend.transact(["k"], increment("k"), ttl=60)
    holder.execute("ROLLBACK")
    holder.close()
    # for BUSY_PAUSE after a lock outlived busy_timeout, calls fail at once, not waiting
    start = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"database is locked \(not asked again"):
        backend.transact(["k"], increment("k"), ttl=60)
    assert time.monotonic() - start < 0.05
    time.sleep(BUSY_PAUSE)
    backend.transact(["k"], increment("k"), ttl=60)
    assert count(backend, "k") == 1


@pytest.mark.parametrize(
    ("journal", "lock"),
    [
        # another worker still reading the new file: SQLite refuses the switch to WAL at
        # once, without its busy handler
        ("delete", "SELECT * FROM other"),
        ("delete", "INSERT INTO other VALUES (1)"),
        ("wal", "INSERT INTO other VALUES (1)"),
    ],
)
def test_sqlite_opening_waits_for_a_lock_held_briefly_by_another_process(
    tmp_path: Path, journal: str, lock: str
) -> None:
    """Workers that start together open one file: opening waits out a short lock, then works."""
    import sqlite3

    path = tmp_path / "health.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute(f"PRAGMA journal_mode={journal}")
    holder.execute("CREATE TABLE other (x)")
    holder.execute("BEGIN")
    holder.execute(lock).fetchall()
    timer = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    timer.start()
    try:
        backend = SQLiteBackend(path, busy_timeout=5.0)
    finally:
        timer.join()
        holder.close()
    backend.transact(["k"], increment("k"), ttl=60)
    assert count(backend, "k") == 1
    backend.close()


def test_sqlite_a_file_in_a_missing_folder_is_refused_on_first_use_naming_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "no-such-folder" / "health.db"
    backend = SQLiteBackend(path)  # opens lazily: a process with this store still starts
    with pytest.raises(StoreUnavailable, match=f"sqlite:///{path}: cannot open"):
        backend.transact(["k"], increment("k"), ttl=60)
    path.parent.mkdir()
    backend.transact(["k"], increment("k"), ttl=60)  # the folder is there now: it opens
    assert count(backend, "k") == 1


def test_sqlite_uses_wal_so_a_reader_is_not_blocked_by_a_writer(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "health.db"
    backend = SQLiteBackend(path, busy_timeout=0.1)
    backend.transact(["k"], increment("k"), ttl=60)
    holder = sqlite3.connect(path, isolation_level=None)
    assert holder.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    holder.execute("BEGIN IMMEDIATE")
    reader = SQLiteBackend(path, busy_timeout=0.1)
    assert set(reader.scan()[0]) == {"k"}
    holder.execute("ROLLBACK")
    holder.close()
    reader.close()


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("sqlite:///", "give the database file's path"),
        ("sqlite:///:memory:", "give the database file's path"),
        ("postgres://user:pw@host/db", "unsupported health store URL"),
        ("health.db", "unsupported health store URL"),
    ],
)
def test_a_bad_store_url_is_refused_naming_it_without_password(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as caught:
        open_backend(url)
    assert ":pw@" not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:1/0?password=hunter2secret",
        "redis://127.0.0.1:1/0?socket_timeout=1&password=hunter2secret",
        "unix:///tmp/redis.sock?db=0&password=hunter2secret",
        "redis://cache:6379/0?password=hunter2secret&socket_timeout=abc",
        "redis://cache:bad/0?password=hunter2secret",
        "ftp://cache/?token=hunter2secret",
    ],
)
def test_a_password_in_the_store_urls_query_is_never_shown(url: str) -> None:
    """redis-py takes ``?password=`` as the password: errors and reprs mask it too."""
    assert "hunter2secret" not in safe_url(url)
    try:
        backend = open_backend(url)
    except ValueError as e:
        assert "hunter2secret" not in str(e)
    else:
        assert "hunter2secret" not in backend.url and "hunter2secret" not in repr(backend)
        with pytest.raises(StoreUnavailable) as unreachable:
            backend.scan()
        assert "hunter2secret" not in str(unreachable.value)
        assert "password=***" in str(unreachable.value)


@pytest.mark.parametrize("separator", ["/", " ", "@", "#", "?"])
@pytest.mark.parametrize("scheme", ["redis://", "redis:/", "rediss://"])
def test_a_password_written_without_escaping_is_never_shown(scheme: str, separator: str) -> None:
    """A password should be percent-escaped in a URL and often is not: a URL parser then
    reads a piece of it as the port or the path. Whatever it makes of it, no piece of the
    password (either side of the character that should have been escaped) reaches the
    error, the repr or the store's name."""
    pieces = ["Xq7", "Zr9Wk2"]
    url = f"{scheme}:{separator.join(pieces)}@127.0.0.1:1/0"
    try:
        backend = open_backend(url)
    except ValueError as e:
        shown = str(e)
    else:
        shown = f"{backend.url} {backend!r}"
        with pytest.raises(StoreUnavailable) as unreachable:
            backend.scan()
        shown += str(unreachable.value)
    assert [p for p in pieces if p in shown] == [], shown


def test_an_option_redis_does_not_take_is_refused_at_once_not_at_the_first_turn() -> None:
    with pytest.raises(ValueError, match="an option redis does not take") as caught:
        open_backend("redis://default:s3cretPW@127.0.0.1:1/0?ssl_cert_reqs=bogus")
    assert "s3cretPW" not in str(caught.value)


def _damage(url: str, key: str, text: str) -> None:
    """Put `text` under `key` behind the backend's back (a damaged row, another writer)."""
    if url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO fallgate_health VALUES (?, ?, ?)", (key, text, 1e12)
            )
    else:
        import redis

        admin = redis.Redis.from_url(url)
        admin.set("{fallgate}:" + key, "1.2.3 " + text)
        admin.close()


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[1, 2]",
        '"text"',
        "[" * 5000,
        '{"opens": NaN}',
        '{"opens": Infinity}',
        '{"rr": 1e300}',
        '{"until": 1e12, "opens": 1}',
        '{"opens": [1]}',
    ],
)
def test_a_damaged_record_reads_as_absent_and_the_next_write_replaces_it(
    shared_store, text: str
) -> None:
    url, make = shared_store
    backend = make()
    backend.transact(["other"], increment("other"), ttl=60)  # the table exists
    _damage(url, "k", text)
    assert count(backend, "k") == 0
    assert "k" not in backend.scan()[0] or backend.scan()[0]["k"] == {}
    backend.transact(["k"], increment("k"), ttl=60)
    assert count(make(), "k") == 1


def test_a_turn_answers_although_its_shared_store_holds_a_damaged_record(
    tmp_path: Path,
) -> None:
    """A turn never fails because of its store, not even because of what it holds."""
    from fallgate.fsm import Policy

    from fallgate import SQLiteHealthStore, run

    key = "sk-test-00000000000000000000000000"
    policy = Policy.from_dict(
        {
            "primary": {"provider": "openai", "model": "gpt-4.1", "api_key": key},
            "fallback_providers": [{"provider": "openai", "model": "gpt-4.1-mini", "api_key": key}],
        }
    )

    class RateLimited(Exception):
        status_code, headers = 429, {"retry-after": "20"}

    def call(target, credential):
        if target.model == "gpt-4.1":
            raise RateLimited("429")
        return "ok"

    path = tmp_path / "health.db"
    assert run(policy, call, health=SQLiteHealthStore(path)).value == "ok"
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE fallgate_health SET value = '{not json'")
    result = run(policy, call, health=SQLiteHealthStore(path))
    assert result.value == "ok"


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"url": None}, TypeError, "url must be a redis://, rediss:// or unix:// URL, got None"),
        ({"reconnect_after": float("nan")}, ValueError, "reconnect_after must be >= 0 seconds"),
        ({"reconnect_after": -1}, ValueError, "reconnect_after must be >= 0 seconds"),
    ],
)
def test_a_bad_redis_store_argument_is_refused_naming_it(
    options: dict[str, object], error: type[Exception], message: str
) -> None:
    from fallgate import RedisHealthStore

    kwargs: dict[str, object] = {"url": "redis://127.0.0.1:1/0", **options}
    url = kwargs.pop("url")
    with pytest.raises(error, match=message):
        RedisHealthStore(url, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_sqlite_file_deleted_or_replaced_while_open_is_reopened_saying_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """A process keeps its file open; an operator deletes the file (or moves another in),
    and the processes that start after open the new one. The old process follows them to
    the file at the path, with one WARNING, instead of keeping health of its own nobody
    sees."""
    path = tmp_path / "health.db"
    old = SQLiteBackend(path)
    old.transact(["k"], increment("k"), ttl=60)
    path.unlink()
    if how == "replaced":
        SQLiteBackend(path).transact(["other"], increment("other"), ttl=60)
    old.transact(["k"], increment("k"), ttl=60)  # the first exchange after: reopens
    assert count(SQLiteBackend(path), "k") == 1, "the write went to the file at the path"
    warned = [r for r in caplog.records if "was deleted or replaced while open" in r.getMessage()]
    assert len(warned) == 1
    old.transact(["k"], increment("k"), ttl=60)
    assert len([r for r in caplog.records if "replaced while open" in r.getMessage()]) == 1
