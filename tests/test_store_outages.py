"""A health store that fails never costs a turn more than its bound (issue 24, finding 2).

Real SQLite files, a real second process holding the lock, the real SDK against the
fault server. On main: a locked file queued every turn of a process behind one lock
while SQLite waited its 2 s busy timeout (10 turns with a 3 s deadline took up to 20 s);
`SQLiteHealthStore(path)` raised in its constructor for a missing folder or a corrupt
file; round robin over 4 keys on a
shared store gave 28-48 requests per key where 40 is exact.
"""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fallgate.fsm import instant_waits
from fallgate.providers import Fallgate
from fallgate.providers.testing.fault_server import FaultServer

import fallgate

from helpers import chain, key

MSG = [{"role": "user", "content": "hi"}]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "fallgate" and r.levelno >= logging.WARNING
    ]


@pytest.mark.parametrize("broken", ["missing folder", "corrupt file", "a directory"])
def test_a_store_that_cannot_open_does_not_raise_and_degrades_with_one_warning(
    fault_server: FaultServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, broken: str
) -> None:
    path = tmp_path / "health.db"
    if broken == "missing folder":
        path = tmp_path / "no-such-folder" / "health.db"
    elif broken == "corrupt file":
        path.write_bytes(b"this is not a database, it is a text file\n" * 100)
    else:
        path.mkdir()
    store = fallgate.SQLiteHealthStore(path)  # main raised here
    caplog.set_level(logging.WARNING, logger="fallgate")
    with Fallgate(chain("a", server=fault_server), health=store) as gate:
        for _ in range(5):
            assert gate.run(messages=MSG).value.choices[0].message.content == "ok"
    warned = _warnings(caplog)
    assert len(warned) == 1, warned
    assert "going on with local health" in warned[0] and str(path) in warned[0]


_HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
"""


def test_a_file_locked_by_another_process_never_holds_a_turn_past_its_deadline(
    fault_server: FaultServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "health.db"
    store = fallgate.SQLiteHealthStore(path)
    policy = chain("a", "b", server=fault_server, deadline=3.0, max_attempts=1)
    caplog.set_level(logging.WARNING, logger="fallgate")
    with Fallgate(policy, health=store) as gate:
        gate.run(messages=MSG)  # the file exists and is prepared
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(path), "8"], stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            took: list[float] = []
            answered: list[str] = []

            def one() -> None:
                start = time.monotonic()
                result = gate.run(messages=MSG)
                took.append(time.monotonic() - start)
                answered.append(result.model)

            threads = [threading.Thread(target=one) for _ in range(10)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            holder.kill()
            holder.wait()
            if holder.stdout is not None:
                holder.stdout.close()
    assert answered == ["a"] * 10  # the primary answered all: none benched by the store
    assert max(took) < 3.0, sorted(took)
    assert len(_warnings(caplog)) == 1


def test_round_robin_over_four_keys_on_a_shared_store_is_exact(
    fault_server: FaultServer, tmp_path: Path
) -> None:
    path = tmp_path / "health.db"
    policy = chain({"model": "a", "rotation": "round_robin"}, server=fault_server, keys=4)
    # four stores on one file: four replicas, as four processes have
    gates = [Fallgate(policy, health=fallgate.SQLiteHealthStore(path)) for _ in range(4)]
    barrier = threading.Barrier(4)

    def turns(gate: Fallgate) -> None:
        for _ in range(40):
            barrier.wait()
            gate.run(messages=MSG)

    with instant_waits():
        threads = [threading.Thread(target=turns, args=(g,)) for g in gates]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for g in gates:
        g.close()
    used = Counter(r.api_key for r in fault_server.requests)
    assert sorted(used.values()) == [40, 40, 40, 40], used
    assert set(used) == {key(0, k) for k in range(4)}


class _FullDisk:
    """A SQLite connection on a full disk: reads answer, every write fails as SQLite
    says it (``SQLITE_FULL``)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if sql.lstrip().split()[0].upper() in ("INSERT", "DELETE", "UPDATE", "REPLACE"):
            raise sqlite3.OperationalError("database or disk is full")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self._conn, name)


def test_a_full_disk_is_one_warning_per_outage_however_many_turns_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 24 measured 806 WARNINGs in 8 s on a full disk. A full disk answers reads
    and refuses writes: 4 threads x 30 turns on a primary answering 503 (every turn
    reports, every report is a write refused) log one WARNING; the disk freed, the next
    write ends the outage (INFO), and filling it again is a second outage, one WARNING
    more. Every turn is answered by the fallback all along."""
    script = {
        "models": {"a": [{"kind": "status", "status": 503}] * 10_000},
        "default": {"kind": "answer", "text": "ok"},
    }
    store = fallgate.SQLiteHealthStore(tmp_path / "health.db")
    caplog.set_level(logging.INFO, logger="fallgate")
    with FaultServer(script) as srv, instant_waits():
        policy = chain("a", "b", server=srv, breaker={"allowed_failures": 1000})
        with Fallgate(policy, health=store) as gate:
            gate.run(messages=MSG)  # the file is open and prepared
            backend: Any = store.backend
            real = backend._conn
            answered: list[str] = []

            def turns() -> None:
                for _ in range(30):
                    answered.append(gate.run(messages=MSG).model)

            def outage() -> None:
                backend._conn = _FullDisk(real)
                threads = [threading.Thread(target=turns) for _ in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                backend._conn = real

            outage()
            assert len(_store_warnings(caplog)) == 1, _store_warnings(caplog)
            gate.run(messages=MSG)  # a write that the freed disk takes: the outage ends
            assert any("reachable again" in r.getMessage() for r in caplog.records)
            outage()
    assert answered == ["b"] * 240
    warned = _store_warnings(caplog)
    assert len(warned) == 2, warned
    assert all("database or disk is full" in w for w in warned)


def _store_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [w for w in _warnings(caplog) if "health store" in w]
