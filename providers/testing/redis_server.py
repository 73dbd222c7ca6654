"""A real `redis-server` on loopback, for tests and benchmarks of the Redis health store.

Started from PATH on a free port in a temporary folder, with no persistence (so a
restart starts empty, like a fresh server); `stop`, `kill` and `start` again on the
same port let a test take the store away mid-run and bring it back.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType


class RedisServerMissing(RuntimeError):
    """No `redis-server` executable on PATH."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One `redis-server` process; ``url`` stays the same across `stop`/`start`."""

    def __init__(self, executable: str | None = None, *, startup_timeout: float = 10.0) -> None:
        found = executable or shutil.which("redis-server")
        if found is None:
            raise RedisServerMissing(
                "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)"
            )
        self.executable = found
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._startup_timeout = startup_timeout
        self._dir = Path(tempfile.mkdtemp(prefix="fallgate-redis-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> RedisServer:
        """Start (again) on this server's port and wait until it answers PING."""
        if self.running:
            return self
        log = self._dir / "redis.log"
        self._proc = subprocess.Popen(
            [
                self.executable,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._dir),
                "--logfile",
                str(log),
                "--daemonize",
                "no",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + self._startup_timeout
        while not self._pong():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"redis-server on port {self.port} did not start:\n{tail}")
            time.sleep(0.02)
        return self

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Stop gracefully (SIGTERM), as an operator would; the port is closed after."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """Stop at once (SIGKILL), as a crash would."""
        self._end(signal.SIGKILL)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Stuck, not down (SIGSTOP, then SIGCONT on the way out): connections are
        accepted by the kernel and nothing answers, as an overloaded or blocked server."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise RuntimeError("the Redis server is not running")
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(proc.pid, signal.SIGCONT)

    def _end(self, sig: int) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisServer({self.url!r}, running={self.running})"
