"""A health-store backend in Redis, shared by a fleet of hosts (extra ``fallgate[redis]``).

Atomic in one round trip in the common case: the backend remembers the records (and
their versions) it last saw, runs `update` on them locally, and sends the result with
the versions it was computed from to one Lua script, which writes only if every
version still matches (compare-and-set) and otherwise answers the current records;
`update` then runs again on those. The script knows nothing of health: it compares
versions and writes strings.

Time is the server's: each reply carries Redis ``TIME``, and `now` between replies is
the host's monotonic clock plus the offset measured at the last reply, so hosts whose
wall clocks disagree still agree on cooldowns. Expiry is ``PX`` (a duration).

A version is the server's time and a counter (unique across restarts of a server
without persistence, so a remembered version can never match a newer record by
accident). A connection error raises `StoreUnavailable` naming the URL without its
password; the next call after `reconnect_after` seconds tries again.

Most turns change nothing, and nobody else changed anything since their last exchange:
those cost no round trip. A second connection (RESP3) subscribes to the server's
invalidations of every key under the namespace (``CLIENT TRACKING ON BCAST``); the
records a reply brought are *fresh* until an invalidation names them, and a `transact`
whose records are all fresh and whose `update` writes nothing is answered from them
(the invalidations are read first, without waiting: one non-blocking read). Backends of
one process on the same server and namespace also tell each other of their writes, so
a write is seen at once by every later turn of its process; another host's write is
seen once its invalidation has arrived (one network delay). A server without tracking
(before Redis 6, some proxies) is asked every time, as is any key after the watch lost
its connection, until the watch is back and the key has been read again.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ...fsm.health.backend import Record, Records, StoreUnavailable, Update, decode_record
from .urls import masked, userinfo

#: KEYS: the records' keys, then the version counter. ARGV[1]: ttl in ms; ARGV[2..n+1]:
#: the versions `update` read ("0" = absent); ARGV[n+2..2n+1]: what to write ("" keep,
#: "-" delete, else JSON). Reply: {1 = written | 0 = conflict, TIME s, TIME us, the
#: stored strings ("version json") of the n keys now}.
_CAS = """
if redis.replicate_commands then redis.replicate_commands() end
local n = #KEYS - 1
local now = redis.call('TIME')
local current = {}
local conflict = false
for i = 1, n do
  local raw = redis.call('GET', KEYS[i])
  current[i] = raw
  local version = '0'
  if raw then version = string.match(raw, '^(%S+) ') end
  if version ~= ARGV[1 + i] then conflict = true end
end
if conflict then return {0, now[1], now[2], unpack(current, 1, n)} end
for i = 1, n do
  local new = ARGV[1 + n + i]
  if new == '-' then
    redis.call('DEL', KEYS[i])
    current[i] = false
  elseif new ~= '' then
    local stored = now[1] .. '.' .. now[2] .. '.' .. redis.call('INCR', KEYS[n + 1]) .. ' ' .. new
    redis.call('SET', KEYS[i], stored, 'PX', ARGV[1])
    current[i] = stored
  end
end
return {1, now[1], now[2], unpack(current, 1, n)}
"""

#: Conflicts in a row that retry at once; later ones first wait a jittered, growing
#: pause, so a process writing in a tight loop cannot starve the others.
_EAGER_TRIES = 3
_PAUSE_CAP = 0.02

T = TypeVar("T")

_CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)

#: Writes by the backends of this process, per (server, namespace): a counter each
#: bumps after a write and the others compare at the start of a `transact`.
_LOCAL_WRITES: dict[tuple[str, str], int] = {}


class RedisBackend:
    """Records under ``{namespace}:`` in the Redis server at `url` (``redis://``,
    ``rediss://`` or ``unix://``).

    `timeout` (seconds) bounds connecting and each command; a health store must never
    hold a turn up for long. After a connection error the backend answers
    `StoreUnavailable` at once for `reconnect_after` seconds, then tries again.
    """

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "fallgate",
        timeout: float = 0.5,
        reconnect_after: float = 1.0,
    ) -> None:
        if not isinstance(url, str):
            raise TypeError(f"url must be a redis://, rediss:// or unix:// URL, got {url!r:.40}")
        self.url = masked(url)
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if not reconnect_after >= 0:
            raise ValueError(f"reconnect_after must be >= 0 seconds, got {reconnect_after!r}")
        if not namespace or any(c in namespace for c in "{}*?[]\\"):
            raise ValueError(f"namespace must be a plain non-empty name, got {namespace!r}")
        try:
            self._client = redis.Redis.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0),
                decode_responses=True,
            )
        except ValueError as e:
            raise ValueError(f"{self.url}: not a Redis URL: {_why_not(url, e)}") from None
        pool = self._client.connection_pool
        try:  # a connection is built only now (no I/O): an option redis does not take
            pool.connection_class(**pool.connection_kwargs)  # would fail the first turn
        except TypeError as e:
            raise ValueError(f"{self.url}: an option redis does not take: {e}") from None
        # one hash tag: every key lands in one slot, so the script also runs on a cluster
        self._prefix = f"{{{namespace}}}:"
        self._counter = f"{{{namespace}}}#version"
        self._cas = self._client.register_script(_CAS)
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[str, Record | None]] = {}
        # keys whose `_seen` is current (no invalidation since the reply that brought it)
        self._fresh: set[str] = set()
        # bumped whenever freshness may have been lost; a reply marks its keys fresh only
        # if nothing bumped it since the command was sent
        self._epoch = 0
        self._url, self._namespace, self._timeout = url, namespace, timeout
        self._local = (self.url, namespace)
        self._local_seen = _LOCAL_WRITES.get(self._local, 0)
        self._watch: Any = None  # the tracking connection, once set up
        self._watch_after = 0.0  # when to try setting it up (again)
        self._watchless = False  # the server cannot track: ask it every time
        self._offset: float | None = None
        self._down_until = 0.0
        self._reconnect_after = reconnect_after
        # contention is bounded in time like any command: 4 command timeouts at most
        self._conflict_budget = 4 * timeout

    # -- the protocol ---------------------------------------------------------------------
    def transact(self, keys: Sequence[str], update: Update, ttl: float) -> tuple[Records, float]:
        keys = list(dict.fromkeys(keys))
        ttl_ms = max(1, round(ttl * 1000))
        with self._lock:
            self._catch_up()
            epoch = self._epoch
            fresh = self._watch is not None and self._fresh.issuperset(keys)
            seen = {k: self._seen.get(k) for k in keys}
            offset = self._offset
        records: dict[str, Record | None] = {
            k: None if s is None else s[1] for k, s in seen.items()
        }
        versions = [("0" if s is None else s[0]) for s in seen.values()]
        # never heard the server's clock (or it restarted): one read first, to learn it
        reading = offset is None
        give_up = time.monotonic() + self._conflict_budget
        for tries in itertools.count():
            if tries >= _EAGER_TRIES:
                if time.monotonic() >= give_up:
                    break
                time.sleep(random.uniform(0, min(_PAUSE_CAP, 0.0005 * 2 ** (tries - _EAGER_TRIES))))
            if reading:
                now, versions, writes = 0.0, ["?"] * len(keys), [""] * len(keys)
            else:
                now = time.monotonic() + (offset or 0.0)
                result = update(records, now)
                writes = [_encode(result, k, records[k]) for k in keys]
                if fresh and not any(writes):
                    return records, now  # nothing changed since our last read, nothing to write
                fresh = False
            reply = self._call(keys, ttl_ms, versions, writes)
            written, server_now, stored = int(reply[0]), _time(reply[1], reply[2]), reply[3:]
            offset = server_now - time.monotonic()
            fresh_records = [_decode(s) for s in stored]
            with self._lock:
                self._offset = offset
                for k, f in zip(keys, fresh_records, strict=True):
                    if f is None:
                        self._seen.pop(k, None)
                    else:
                        self._seen[k] = f
                if written and any(writes):
                    self._local_seen = _LOCAL_WRITES[self._local] = (
                        _LOCAL_WRITES.get(self._local, 0) + 1
                    )
                if self._epoch == epoch and self._watch is not None:
                    self._fresh.update(keys)
            records = {
                k: None if f is None else f[1] for k, f in zip(keys, fresh_records, strict=True)
            }
            if written and not reading:
                return records, now
            reading = False
            versions = [("0" if f is None else f[0]) for f in fresh_records]
        raise StoreUnavailable(
            f"{self.url}: other writers changed the same records on every try for"
            f" {self._conflict_budget:g} s"
        )

    # -- freshness (the invalidations) ------------------------------------------------------
    def _catch_up(self) -> None:
        """Forget the freshness of what changed since the last call (under `_lock`): the
        invalidations the watch has received, the writes of this process's other backends;
        set the watch up when it is not (yet, or again)."""
        local = _LOCAL_WRITES.get(self._local, 0)
        if local != self._local_seen:
            self._local_seen = local
            self._stale(None)
        watch = self._watch
        if watch is None:
            if not self._watchless and time.monotonic() >= max(self._watch_after, self._down_until):
                self._start_watch()
            return
        try:
            # the parser's poll, not the connection's: that one formats an error text each call
            while watch._parser.can_read(0):
                watch.read_response(push_request=True, timeout=0, disconnect_on_error=False)
        except redis.TimeoutError:
            pass  # a push not yet whole: the rest is read next time
        except (*_CONNECTION_ERRORS, redis.RedisError):
            self._drop_watch()

    def _stale(self, keys: Any) -> None:
        """Invalidation of `keys` (the server's full names; None: every key)."""
        self._epoch += 1
        if keys is None:
            self._fresh.clear()
            return
        n = len(self._prefix)
        for key in keys:
            name = key.decode() if isinstance(key, bytes) else str(key)
            self._fresh.discard(name[n:])

    def _start_watch(self) -> None:
        """A RESP3 connection told of every change under the namespace (one round trip)."""
        self._watch_after = time.monotonic() + self._reconnect_after
        try:
            pool = redis.ConnectionPool.from_url(
                self._url,
                protocol=3,
                socket_timeout=self._timeout,
                socket_connect_timeout=self._timeout,
                retry=Retry(NoBackoff(), 0),
            )
            conn: Any = pool.make_connection()  # redis-py's Connection (untyped)
            conn.connect()
            conn.send_command("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", self._prefix)
            conn.read_response()
        except redis.ResponseError:  # no RESP3 or no tracking here: ask every time
            self._watchless = True
            return
        except _CONNECTION_ERRORS as e:
            # the server does not answer (down, or stuck): the exchange that asked ends now,
            # not after a second timeout on the command (two would cost a short turn its
            # deadline); asked again after reconnect_after
            self._down_until = time.monotonic() + self._reconnect_after
            raise StoreUnavailable(f"{self.url}: {e or type(e).__name__}") from None
        except (redis.RedisError, ValueError):
            return  # tried again after reconnect_after
        conn._parser.set_invalidation_push_handler(lambda push: self._stale(push[1]))
        self._watch = conn
        self._epoch += 1

    def _drop_watch(self) -> None:
        watch, self._watch = self._watch, None
        self._stale(None)
        if watch is not None:
            try:
                watch.disconnect()
            except Exception:  # closing a dead socket: nothing to save
                pass

    def scan(self) -> tuple[Records, float]:
        def run() -> tuple[Records, float]:
            keys = list(self._keys(self._prefix + "*"))
            pipe = self._client.pipeline(transaction=False)
            pipe.time()
            if keys:
                pipe.mget(keys)
            replies = pipe.execute()
            seconds, micros = replies[0]
            values = replies[1] if keys else []
            out: dict[str, Record | None] = {}
            for key, raw in sorted(zip(keys, values, strict=True)):
                decoded = _decode(raw)
                if decoded is not None and decoded[1] is not None:
                    out[key[len(self._prefix) :]] = decoded[1]
            return out, seconds + micros / 1e6

        return self._guard(run)

    def delete(self, prefix: str) -> int:
        def run() -> int:
            pattern = self._prefix + _glob_escape(prefix) + "*"
            keys = list(self._keys(pattern))
            return int(self._client.delete(*keys)) if keys else 0

        count = self._guard(run)
        with self._lock:
            for key in [k for k in self._seen if k.startswith(prefix)]:
                del self._seen[key]
            self._stale(None)
        return count

    def close(self) -> None:
        with self._lock:
            self._drop_watch()
        self._client.close()

    # -- plumbing ---------------------------------------------------------------------------
    def _call(self, keys: list[str], ttl_ms: int, versions: list[str], writes: list[str]) -> Any:
        return self._guard(
            lambda: self._cas(
                keys=[self._prefix + k for k in keys] + [self._counter],
                args=[ttl_ms, *versions, *writes],
            )
        )

    def _keys(self, pattern: str) -> Iterator[str]:
        yield from self._client.scan_iter(match=pattern, count=500)

    def _guard(self, run: Callable[[], T]) -> T:
        """`run()`, with connection errors as `StoreUnavailable` (URL without password)."""
        if time.monotonic() < self._down_until:
            raise StoreUnavailable(f"{self.url}: unreachable (retrying shortly)")
        try:
            return run()
        except (*_CONNECTION_ERRORS, redis.exceptions.BusyLoadingError) as e:
            with self._lock:
                # the server may have restarted empty: what we remember is no longer news
                self._seen.clear()
                self._drop_watch()
                self._offset = None
                self._down_until = time.monotonic() + self._reconnect_after
            raise StoreUnavailable(f"{self.url}: {e or type(e).__name__}") from None
        except redis.RedisError as e:  # refused by the server: auth, ACL, out of memory, ...
            raise StoreUnavailable(f"{self.url}: {e or type(e).__name__}") from None

    def __repr__(self) -> str:
        return f"RedisBackend({self.url!r})"


def _why_not(url: str, e: ValueError) -> str:
    """The URL parser's complaint, unless the URL holds a password: the parser may quote
    a piece of it (a ``/`` in the password ends the host: "Port could not be cast to
    integer value as 'pa'"), so then the likely cause is said instead."""
    if not userinfo(url) or "scheme" in str(e):  # a scheme's complaint quotes no password
        return str(e)
    return (
        "cannot read it (a password with / # ? @ or a space must be percent-escaped: "
        "urllib.parse.quote(password, safe=''))"
    )


def _encode(result: Records, key: str, before: Record | None) -> str:
    if key not in result:
        return ""
    record = result[key]
    if record is None:
        return "-" if before is not None else ""
    return json.dumps(record, separators=(",", ":"))


def _decode(stored: str | None) -> tuple[str, Record | None] | None:
    """(version, record) of a stored value; a damaged one reads as no record, but keeps
    its version, so that the next write replaces it."""
    if not stored:
        return None
    version, _, text = stored.partition(" ")
    return version, decode_record(text)


def _time(seconds: Any, micros: Any) -> float:
    return int(seconds) + int(micros) / 1e6


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
