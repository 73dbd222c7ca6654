"""A health-store backend in one SQLite file, shared by the processes of one host.

Each `transact` is one ``BEGIN IMMEDIATE`` transaction: SQLite's write lock serialises
the read-modify-write across threads and processes, so `update` runs exactly once per
call. WAL journaling lets readers (``fallgate health``) proceed beside a writer, and a
busy timeout makes a short wait for the lock part of the transaction instead of an
error. Time is the host's wall clock (every process of one host reads the same one;
docs/design.md, "The SQLite and Redis backends", says what a process with another clock
would see). Expired rows are never returned and are dropped by the next write.

Every call is bounded: waiting for this process's other threads and for another
process's transaction together take at most `busy_timeout`, so a locked file costs a
turn that much and no more (the shared store then goes on with local health). The file
is opened on first use, never in the constructor: a missing folder, a full disk or a
corrupt file is a store outage, not an error that stops a process from starting.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ...fsm.health.backend import Record, Records, StoreUnavailable, Update, decode_record

logger = logging.getLogger("fallgate")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS fallgate_health (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS fallgate_health_expires ON fallgate_health (expires);
"""


#: Seconds a backend fails fast after a lock held past its busy timeout, so that in a
#: long lock only one call a second waits (the others go on with local health at once).
BUSY_PAUSE = 1.0


class SQLiteBackend:
    """Records in the SQLite file at `path` (created on first use if absent; its folder
    must exist).

    `busy_timeout` (seconds) bounds each call's wait, for this process's other threads
    and another process's transaction together; past it the call raises
    `StoreUnavailable`, as does any other database error (opening the file included).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 0.5,
    ) -> None:
        if not busy_timeout > 0:
            raise ValueError(f"busy_timeout must be > 0 seconds, got {busy_timeout!r}")
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self._busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._opened: tuple[int, int] | None = None  # the file `_conn` has open
        self._pid = 0
        self._busy_until = 0.0  # monotonic: fail fast until then (the file was locked)

    def _locked(self) -> float:
        """Take this process's lock within `busy_timeout`; returns the monotonic deadline
        of the call (the caller releases the lock)."""
        start = time.monotonic()
        if start < self._busy_until:
            raise StoreUnavailable(
                f"{self.url}: database is locked (not asked again for {BUSY_PAUSE:g} s)"
            )
        deadline = start + self._busy_timeout
        if not self._lock.acquire(timeout=self._busy_timeout):
            raise StoreUnavailable(
                f"{self.url}: busy: another thread of this process held the store for "
                f"{self._busy_timeout:g} s"
            )
        if time.monotonic() < self._busy_until:  # found locked while this call waited
            self._lock.release()
            raise StoreUnavailable(
                f"{self.url}: database is locked (not asked again for {BUSY_PAUSE:g} s)"
            )
        return deadline

    def _connect(self, deadline: float) -> sqlite3.Connection:
        """The open connection of this process (a child after fork opens its own).

        Processes that open a new file together race to switch it to WAL and create the
        table; SQLite answers some of those steps "locked" at once, without its busy
        handler, so opening retries them (with jitter) until `busy_timeout` has passed.
        """
        if self._conn is not None and self._pid == os.getpid():
            if self._file_id() == self._opened:
                self._wait_at_most(self._conn, deadline)
                return self._conn
            # deleted or replaced under us: the processes that open the path now would
            # share another file than this one, each its own health, and never know
            logger.warning(
                "fallgate: health store %s was deleted or replaced while open; opening "
                "the file now at that path (what this process learns goes there)",
                self.url,
            )
            self._conn.close()
            self._conn = None
        pause = 0.005
        while True:
            conn: sqlite3.Connection | None = None
            try:
                conn = sqlite3.connect(
                    self.path,
                    timeout=max(deadline - time.monotonic(), 0.001),
                    isolation_level=None,
                    check_same_thread=False,
                )
                self._prepare(conn)
            except sqlite3.Error as e:
                if conn is not None:
                    conn.close()
                if _is_busy(e) and time.monotonic() < deadline:
                    time.sleep(random.uniform(0, pause))
                    pause = min(pause * 2, 0.1)
                    continue
                raise StoreUnavailable(f"{self.url}: cannot open the health store: {e}") from None
            self._conn, self._pid = conn, os.getpid()
            self._opened = self._file_id()
            return conn

    def _file_id(self) -> tuple[int, int] | None:
        """Which file the path names now (device and inode; None: none)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _wait_at_most(self, conn: sqlite3.Connection, deadline: float) -> None:
        """SQLite's busy handler waits no longer than what is left of the call."""
        left_ms = max(int((deadline - time.monotonic()) * 1000), 1)
        try:
            conn.execute(f"PRAGMA busy_timeout = {left_ms}")
        except sqlite3.Error as e:
            raise self._unavailable(e) from None

    @staticmethod
    def _prepare(conn: sqlite3.Connection) -> None:
        """WAL mode and the table, each step taken only when the file still needs it."""
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
        # health facts are advisory: a power cut may lose the last commits, never corrupt
        conn.execute("PRAGMA synchronous=NORMAL")
        exists = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fallgate_health'"
        if conn.execute(exists).fetchone():
            return  # a reader never waits for a writer's lock
        # BEGIN IMMEDIATE takes the write lock through the busy handler, not by upgrade
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            SQLiteBackend._rollback(conn)
            raise

    def transact(self, keys: Sequence[str], update: Update, ttl: float) -> tuple[Records, float]:
        keys = list(dict.fromkeys(keys))
        deadline = self._locked()
        try:
            conn = self._connect(deadline)
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise self._unavailable(e) from None
            try:
                now = time.time()
                current = self._read(conn, keys, now)
                result = update(current, now)
                in_force = dict(current)
                expires = now + ttl
                for key, record in result.items():
                    if record is None:
                        conn.execute("DELETE FROM fallgate_health WHERE key = ?", (key,))
                    else:
                        conn.execute(
                            "INSERT INTO fallgate_health (key, value, expires) VALUES (?, ?, ?)"
                            " ON CONFLICT (key) DO UPDATE SET value = excluded.value,"
                            " expires = excluded.expires",
                            (key, json.dumps(record, separators=(",", ":")), expires),
                        )
                    if key in in_force:
                        in_force[key] = None if record is None else dict(record)
                if result:
                    conn.execute("DELETE FROM fallgate_health WHERE expires <= ?", (now,))
                conn.execute("COMMIT")
            except sqlite3.Error as e:
                self._rollback(conn)
                raise self._unavailable(e) from None
            except BaseException:
                self._rollback(conn)
                raise
            return in_force, now
        finally:
            self._lock.release()

    @staticmethod
    def _read(conn: sqlite3.Connection, keys: list[str], now: float) -> dict[str, Record | None]:
        out: dict[str, Record | None] = dict.fromkeys(keys)
        if keys:
            marks = ",".join("?" * len(keys))
            rows = conn.execute(
                f"SELECT key, value FROM fallgate_health WHERE key IN ({marks}) AND expires > ?",
                (*keys, now),
            )
            for key, value in rows:
                out[key] = decode_record(value)
        return out

    def scan(self) -> tuple[Records, float]:
        deadline = self._locked()
        try:
            conn = self._connect(deadline)
            now = time.time()
            try:
                rows = conn.execute(
                    "SELECT key, value FROM fallgate_health WHERE expires > ? ORDER BY key", (now,)
                ).fetchall()
            except sqlite3.Error as e:
                raise self._unavailable(e) from None
        finally:
            self._lock.release()
        records = ((key, decode_record(value)) for key, value in rows)
        return {key: record for key, record in records if record is not None}, now

    def delete(self, prefix: str) -> int:
        # substr, not LIKE: a prefix may hold % or _ (a base URL, a model name)
        deadline = self._locked()
        try:
            conn = self._connect(deadline)
            try:
                cur = conn.execute(
                    "DELETE FROM fallgate_health WHERE substr(key, 1, ?) = ?",
                    (len(prefix), prefix),
                )
            except sqlite3.Error as e:
                raise self._unavailable(e) from None
            return cur.rowcount
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    def _unavailable(self, error: sqlite3.Error) -> StoreUnavailable:
        if _is_busy(error):  # the lock outlived busy_timeout: the next calls fail fast
            self._busy_until = time.monotonic() + BUSY_PAUSE
        return StoreUnavailable(f"{self.url}: {error}")

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    def __repr__(self) -> str:
        return f"SQLiteBackend({self.url!r})"


def _is_busy(error: sqlite3.Error) -> bool:
    """Another connection holds the lock for now (worth another try)."""
    text = str(error).lower()
    return "locked" in text or "busy" in text
