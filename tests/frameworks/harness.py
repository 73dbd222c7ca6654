"""Agent frameworks from PyPI over `fallgate.http_client`, against the fault server.

Used by `check_frameworks.py` (CI: `make test-frameworks`), one venv per framework
(build/fw-NAME: the framework, the openai it brings, fallgate's wheel); never in .venv.

Every check runs one scenario with a fresh HTTP client (so a fresh health store): the
primary (``gpt-4o-mini``) answers 429, the fallback (``gpt-4o``) is healthy. A check
passes when the framework got the fallback's answer and the server saw the primary
once and the fallback as often as the framework asked for a model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import fallgate
from fallgate.testing import FaultServer

PRIMARY = "gpt-4o-mini"
FALLBACK = "gpt-4o"
#: What the frameworks' own SDK clients are given: never reached (the policy's
#: targets are where requests go).
PLACEHOLDER_URL = "http://fallgate.invalid/v1"
PLACEHOLDER_KEY = "sk-unused-fallgate-picks-the-key"
ANSWER = "Sunny in Paris, 21 C."
RATE_LIMITED = {"kind": "status", "status": 429, "headers": {"retry-after": "30"}}
WEATHER_CALL = {
    "kind": "tool_calls",
    "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
}

EXAMPLES = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples", "frameworks")

#: Every call of the tool, as the framework made it.
TOOL_CALLS: list[str] = []


def get_weather(city: str) -> str:
    """The weather in a city."""
    TOOL_CALLS.append(city)
    return json.dumps({"city": city, "forecast": "sunny, 21 C"})


class Gate:
    """One fault server for a framework's checks, and a fresh policy client per check."""

    def __init__(self) -> None:
        self.server = FaultServer()
        self.server.start()

    def policy(self) -> fallgate.Policy:
        base = self.server.base_url
        return fallgate.Policy.from_dict(
            {
                "primary": {
                    "provider": "fault",
                    "model": PRIMARY,
                    "base_url": base,
                    "api_key": "sk-fw-primary",
                },
                "fallback_providers": [
                    {
                        "provider": "fault",
                        "model": FALLBACK,
                        "base_url": base,
                        "api_key": "sk-fw-fallback",
                    }
                ],
            }
        )

    def script(self, *fallback_steps: dict[str, Any]) -> None:
        """The primary answers 429 (then would answer "wrong"), the fallback these steps."""
        self.server.script(
            {
                "default": {"kind": "answer", "text": "not scripted"},
                "models": {
                    PRIMARY: [RATE_LIMITED, {"kind": "answer", "text": "from the primary"}],
                    FALLBACK: list(fallback_steps),
                },
            }
        )
        TOOL_CALLS.clear()

    def expect(self, got: str, fallback_calls: int, *, tool: bool = False) -> None:
        """The fallback's answer reached the framework; the server saw the primary once."""
        counts = dict(self.server.counts)
        want = {PRIMARY: 1, FALLBACK: fallback_calls}
        if ANSWER.split(",")[0] not in got:
            raise AssertionError(f"the framework answered {got!r}, not the fallback's {ANSWER!r}")
        if counts != want:
            raise AssertionError(f"requests per model {counts}, expected {want}")
        if tool and TOOL_CALLS != ["Paris"]:
            raise AssertionError(f"the tool ran with {TOOL_CALLS}, expected ['Paris']")

    def run_example(self, name: str, *fallback_steps: dict[str, Any]) -> None:
        """examples/frameworks/NAME run as a user runs it, with a policy file whose
        primary and fallback are this server: the fallback's answer is printed."""
        self.script(*fallback_steps)
        base = self.server.base_url
        toml = "".join(
            f'{head}\nprovider = "fault"\nmodel = "{model}"\nbase_url = "{base}"\n'
            f'api_key = "sk-fw-{model}"\n'
            for head, model in (("[primary]", PRIMARY), ("[[fallback_providers]]", FALLBACK))
        )
        with tempfile.TemporaryDirectory() as tmp:
            policy = os.path.join(tmp, "policy.toml")
            with open(policy, "w", encoding="utf-8") as f:
                f.write(toml)
            example = os.path.join(EXAMPLES, name)
            done = subprocess.run(
                [sys.executable, "-P", example, policy, "Weather in Paris?"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        if done.returncode != 0:
            raise AssertionError(f"{name} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        self.expect(done.stdout, 1)

    def close(self) -> None:
        self.server.stop()


def plain_steps() -> list[dict[str, Any]]:
    return [{"kind": "answer", "text": ANSWER}]


def tool_steps() -> list[dict[str, Any]]:
    return [WEATHER_CALL, {"kind": "answer", "text": ANSWER}]


def run_checks(name: str, checks: list[tuple[str, Callable[[Gate], None]]]) -> int:
    """Run each check; one line each, then ``check_frameworks[NAME]: N passed, M failed``."""
    gate = Gate()
    passed = failed = 0
    try:
        for label, check in checks:
            t0 = time.perf_counter()
            try:
                check(gate)
            except Exception:
                failed += 1
                print(f"FAIL {name}: {label}")
                traceback.print_exc()
            else:
                passed += 1
                print(f"ok   {name}: {label} ({time.perf_counter() - t0:.2f}s)")
    finally:
        gate.close()
    print(f"check_frameworks[{name}]: {passed} passed, {failed} failed")
    sys.stdout.flush()
    return 1 if failed else 0
