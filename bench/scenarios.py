"""The fault scenarios of the time-to-answer benchmark, as fault-server scripts plus
their oracle.

The oracle is the least time any policy could take given the script (network
latency of a few ms ignored): a healthy fallback that can be taken at once
makes it 0; client timeouts that no policy can see through before they expire
cost their full length (two 1 s timeouts: 2 s).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import attrs
from fallgate.providers.testing.fault_server import FaultServer, Step

PRIMARY = "glm-5.1"
FALLBACK = "glm-4.7"
WARMUP = "warmup"  # never scripted: answered by the default step, not counted
CLIENT_TIMEOUT = 1.0

_TIMEOUT = {"kind": "timeout", "seconds": 5}
_503 = {"kind": "status", "status": 503}
_429 = {"kind": "status", "status": 429}
_QUOTA = {
    "kind": "status",
    "status": 429,
    "body": {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing "
            "details.",
            "type": "insufficient_quota",
            "code": "insufficient_quota",
        }
    },
}


@attrs.frozen
class Scenario:
    name: str
    script: dict[str, Any]
    oracle_seconds: float
    oracle_why: str
    fallback: bool = True  # does the chain have a (healthy) fallback?
    # (model, seconds): every request for `model` within `seconds` of its first one
    # is answered 429 with Retry-After = the time left (a real rate-limit window).
    window: tuple[str, float] | None = None


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "healthy primary (reference: one request)",
        {"models": {}},
        0.0,
        "one request; what every system pays per request on this machine",
    ),
    Scenario(
        "429 Retry-After 20 + healthy fallback",
        {"models": {PRIMARY: [{**_429, "headers": {"retry-after": "20"}}]}},
        0.0,
        "fall back at once: the fallback is healthy",
        window=(PRIMARY, 20.0),
    ),
    Scenario(
        "2 timeouts then success (no fallback)",
        {"models": {PRIMARY: [_TIMEOUT, _TIMEOUT]}},
        2 * CLIENT_TIMEOUT,
        "two client timeouts cannot be cut short; retry at once",
        fallback=False,
    ),
    Scenario(
        "5x 503 + fallback",
        {"models": {PRIMARY: [_503] * 5}},
        0.0,
        "fall back after the first 503",
    ),
    Scenario(
        "429 insufficient_quota + fallback",
        {"models": {PRIMARY: [_QUOTA] * 10}},
        0.0,
        "quota is not retryable: fall back at once",
    ),
    Scenario(
        "scenario 1: timeout, timeout, recovery, 429 -> fallback",
        {"models": {PRIMARY: [_TIMEOUT, _TIMEOUT, _429] + [_429] * 5}},
        2 * CLIENT_TIMEOUT,
        "two client timeouts, then the 429 falls back at once",
    ),
)


class WindowedFaultServer(FaultServer):
    """The fault server, plus a time-based rate-limit window for one model.

    Scripts are per request; a rate limit is per time. Within the window a
    request for the model gets 429 with the Retry-After still to run, so a
    client that retries early is refused, as a real provider would.
    """

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._window: tuple[str, float] | None = None
        self._window_start: float | None = None
        self._wlock = threading.Lock()

    def set_window(self, window: tuple[str, float] | None) -> None:
        with self._wlock:
            self._window, self._window_start = window, None

    def _take(self, model: str, *rest: Any, **kw: Any) -> tuple[Step, int | None]:
        step, index = super()._take(model, *rest, **kw)
        with self._wlock:
            w = self._window
            if w is None or w[0] != model:
                return step, index
            now = time.monotonic()
            if self._window_start is None:
                self._window_start = now
            left = self._window_start + w[1] - now
        if left <= 0:
            return step, index
        return Step(
            kind="status", status=429, headers=(("retry-after", str(math.ceil(left))),)
        ), index
