"""Worker processes for the multi-process benchmarks (`fleet`, `pacing`): each is
`python -m <module> <config JSON>`, says "ready" once warm, starts its turns on "go",
and prints its result as JSON on its last line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from types import TracebackType
from typing import Any


class Workers:
    """Start every worker and wait until each is ready (``with``); `run` starts them
    together and collects their results. Any worker still running at exit is killed."""

    def __init__(self, module: str, configs: list[dict[str, Any]], what: str) -> None:
        self.module, self.configs, self.what = module, configs, what
        self.procs: list[subprocess.Popen[str]] = []

    def __enter__(self) -> Workers:
        for config in self.configs:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", self.module, json.dumps(config)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        try:
            for p in self.procs:
                self._until_ready(p)
        except BaseException:
            self._kill()
            raise
        return self

    def run(self, timeout: float) -> tuple[list[dict[str, Any]], float]:
        """Start every worker's turns at once: their results, and the seconds from the
        start until the last one ended."""
        t0 = time.monotonic()
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in self.procs:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(
                    f"{self.what} failed (exit status {p.returncode}): "
                    f"{(err or out or '(no output)')[-800:]}"
                )
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results, time.monotonic() - t0

    def __exit__(
        self,
        et: type[BaseException] | None,
        e: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._kill()

    def _kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def _until_ready(self, p: subprocess.Popen[str]) -> None:
        """Read the worker's output up to its "ready" line; a library may print before
        it (a warning at import), which is kept for the error if the worker dies."""
        assert p.stdout is not None
        seen: list[str] = []
        while True:
            line = p.stdout.readline()
            if line.strip() == "ready":
                return
            if not line:  # the worker ended before it was ready
                p.kill()
                _, err = p.communicate(timeout=10)
                said = (err or "".join(seen) or "(no output)")[-800:]
                raise RuntimeError(
                    f"{self.what} did not start (exit status {p.returncode}): {said}"
                )
            seen.append(line)
