"""Real worker processes sharing a health store (a SQLite file, a real redis-server)
against the fault server: the cooldown one worker learns spares the others' requests,
a crashed prober's lease expires, and Redis going away mid-run loses no turn.

Each worker (`tests/fleet/worker.py`) is a `fallgate.Fallgate` with its own store object,
in its own process, driven turn by turn over stdin.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fallgate.fsm.health import records as fleet
from fallgate.providers.stores import open_backend
from fallgate.providers.testing.fault_server import FaultServer

WORKER = Path(__file__).parent / "fleet" / "worker.py"
sys.path.insert(0, str(WORKER.parent))
from worker import FALLBACK, PRIMARY, PRIMARY_KEY  # noqa: E402

pytestmark = pytest.mark.slow  # worker processes on shared SQLite and Redis stores

RATE_LIMITED = {"kind": "status", "status": 429, "headers": {"retry-after": "20"}}
DOWN = {"kind": "status", "status": 503}


class Worker:
    def __init__(self, args: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def ready(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", f"worker did not start: {line!r} {self.stderr()}"

    def send(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("turn\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"worker died: {self.stderr()}"
        return json.loads(line)

    def turn(self) -> dict[str, Any]:
        self.send()
        return self.result()

    def stderr(self) -> str:
        if self.proc.poll() is None:
            self.quit()
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def quit(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self) -> None:
        self.quit()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None and not f.closed:
                f.close()


@pytest.fixture
def fleet_of(fault_server: FaultServer) -> Iterator[Any]:
    """Start workers on the fault server with a store; all stopped after the test."""
    started: list[Worker] = []

    def start(n: int, store: str, **args: Any) -> list[Worker]:
        workers = [
            Worker({"base_url": fault_server.base_url, "store": store, **args}) for _ in range(n)
        ]
        started.extend(workers)
        for w in workers:  # started together: their imports overlap
            w.ready()
        return workers

    yield start
    for w in started:
        w.close()


@pytest.fixture(params=["sqlite", "redis"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'health.db'}"
    return str(request.getfixturevalue("redis_server").url)


def rounds(workers: list[Worker], n: int, stagger: float = 0.02) -> list[dict[str, Any]]:
    """`n` rounds in which every worker starts a turn, `stagger` s after the previous
    one (a fleet's steady traffic), all of a round in flight together."""
    results = []
    for _ in range(n):
        for w in workers:
            w.send()
            time.sleep(stagger)
        results += [w.result() for w in workers]
    return results


def in_turn(workers: list[Worker], n: int) -> list[dict[str, Any]]:
    """`n` rounds in which each worker's turn ends before the next one's starts."""
    return [w.turn() for _ in range(n) for w in workers]


def test_four_processes_sharing_a_store_spend_at_most_two_requests_on_a_cooling_primary(
    fault_server: FaultServer, fleet_of: Any, shared_url: str
) -> None:
    fault_server.script({"models": {PRIMARY: [RATE_LIMITED] * 1000}})
    workers = fleet_of(4, shared_url)
    results = rounds(workers, 10)
    assert [r["model"] for r in results] == [FALLBACK] * 40, results
    assert 1 <= fault_server.count(PRIMARY) <= 2
    assert fault_server.count(FALLBACK) == 40
    # what they share holds the key's id, never the key; `fallgate health` shows it
    backend = open_backend(shared_url)
    records, _ = backend.scan()
    backend.close()
    assert records and PRIMARY_KEY not in json.dumps(records)
    out = subprocess.run(
        [sys.executable, "-m", "fallgate.providers.cli", "health", "--store", shared_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert f"{PRIMARY}@{fault_server.base_url}" in out.stdout and PRIMARY_KEY not in out.stdout


def test_four_processes_with_their_own_stores_each_learn_the_cooldown_themselves(
    fault_server: FaultServer, fleet_of: Any
) -> None:
    """The contrast: without a shared store every process pays one request."""
    fault_server.script({"models": {PRIMARY: [RATE_LIMITED] * 1000}})
    results = rounds(fleet_of(4, "memory"), 3)
    assert [r["model"] for r in results] == [FALLBACK] * 12
    assert fault_server.count(PRIMARY) == 4


def lease_holder(url: str) -> str | None:
    """The owner of an unexpired probe lease on the primary, from the store itself."""
    backend = open_backend(url)
    try:
        records, now = backend.scan()
    finally:
        backend.close()
    for key, r in records.items():
        parsed = fleet.parse_key(key)
        if r and parsed and parsed[1] is None and parsed[0][1] == PRIMARY:
            if fleet.num(r, "lease") > now:
                return str(r.get("owner"))
    return None


def test_kill_9_of_the_worker_probing_a_half_open_primary_frees_its_lease_after_expiry(
    fault_server: FaultServer, fleet_of: Any, shared_url: str
) -> None:
    # one 503 opens the breaker for 0.5 s; the probe after it hangs; the next answers
    fault_server.script(
        {"models": {PRIMARY: [DOWN, {"kind": "hang", "seconds": 30}, {"kind": "answer"}]}}
    )
    prober, other = fleet_of(2, shared_url, allowed_failures=0, cooldown=0.5, attempt_timeout=3.0)
    assert prober.turn()["model"] == FALLBACK  # the 503 opened the primary's breaker
    time.sleep(0.6)  # its open span is over: half-open
    prober.send()  # the probe: the primary hangs
    deadline = time.monotonic() + 5
    # the lease is taken just before the probe's request leaves: wait for both
    while lease_holder(shared_url) is None or fault_server.count(PRIMARY) < 2:
        assert time.monotonic() < deadline, "no probe lease was taken"
        time.sleep(0.02)
    leased_at = time.monotonic()
    os.kill(prober.proc.pid, signal.SIGKILL)
    prober.proc.wait()
    # while the dead worker's lease runs, the other does not probe: it falls back
    assert other.turn()["model"] == FALLBACK
    assert fault_server.count(PRIMARY) == 2
    while lease_holder(shared_url) is not None:
        assert time.monotonic() - leased_at < 3.0 + 2.0, "the lease never expired"
        time.sleep(0.05)
    # expired: the next turn probes, the primary answers, the breaker closes
    assert other.turn()["model"] == PRIMARY
    assert fault_server.count(PRIMARY) == 3
    assert other.turn()["model"] == PRIMARY


def test_redis_stopped_and_restarted_mid_run_loses_no_turn_and_warns_once(
    fault_server: FaultServer, fleet_of: Any, redis_server: Any
) -> None:
    fault_server.script({"models": {PRIMARY: [RATE_LIMITED] * 1000}})
    workers = fleet_of(2, redis_server.url)
    before = in_turn(workers, 3)
    assert fault_server.count(PRIMARY) == 1  # shared: one worker learnt it for both
    redis_server.stop()
    during = in_turn(workers, 4)
    redis_server.start()  # empty: it kept nothing (no persistence)
    time.sleep(0.3)  # past the workers' reconnect interval
    fault_server.script({"models": {PRIMARY: [RATE_LIMITED] * 1000}})
    after = in_turn(workers, 4)
    assert [r["model"] for r in before + during + after] == [FALLBACK] * 22
    # back to sharing: the fresh server learnt the cooldown from one worker, not both
    assert fault_server.count(PRIMARY) == 1
    for w in workers:
        log = w.stderr()
        # the store's own warnings (a turn that falls back warns too, once per change)
        warnings = [
            ln for ln in log.splitlines() if ln.startswith("WARNING") and "health store" in ln
        ]
        assert len(warnings) == 1, log
        assert "unreachable" in warnings[0] and redis_server.url in warnings[0]
        assert PRIMARY_KEY not in log and "Traceback" not in log
