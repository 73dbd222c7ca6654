"""Slow servers: time to answer with a primary that trickles, fallgate vs the bare SDK.

`python -m bench.slow` prints docs/bench.md's table. The primary sends one piece every
0.2 s for 8 s (its headers, its body, or keep-alives before any content); the SDK's
``timeout=1`` is a per-read limit, so the bare SDK waits the trickle out; fallgate
(``attempt_timeout = 1``, ``deadline = 3``, a healthy fallback) cuts the attempt at its
total bound and answers from the fallback. Sync, non-streamed, one run each.
"""

from __future__ import annotations

import time

import openai
from fallgate.fsm.policy.model import Target

from fallgate import Fallgate, Policy
from fallgate.testing import FaultServer

SLOW = {
    "trickled headers": {"kind": "trickle_headers", "interval": 0.2, "seconds": 8},
    "trickled body": {"kind": "trickle_body", "interval": 0.2, "seconds": 8},
    "keep-alives, no content": {"kind": "keepalive", "interval": 0.2, "seconds": 8},
}
MESSAGES = [{"role": "user", "content": "hi"}]


def main() -> None:
    print("| primary | fallgate s (who answered) | bare SDK s (timeout=1) |")
    print("|---|---:|---:|")
    for name, step in SLOW.items():
        script = {"models": {"slow": [step], "fast": [{"kind": "answer", "text": "fast"}]}}
        with FaultServer(script) as srv:
            targets = [Target("fault", m, srv.base_url, keyless=True) for m in ("slow", "fast")]
            policy = Policy(
                targets, attempt_timeout=1, deadline=3, max_attempts=1, recover_transport=False
            )
            with Fallgate(policy) as gate:
                t0 = time.monotonic()
                result = gate.run(messages=MESSAGES)
                ours = time.monotonic() - t0
            srv.script({"models": {"slow": [step]}})
            with openai.OpenAI(
                base_url=srv.base_url, api_key="sk-bench", max_retries=0, timeout=1
            ) as sdk:
                t0 = time.monotonic()
                sdk.chat.completions.create(model="slow", messages=MESSAGES)  # type: ignore[arg-type]
                bare = time.monotonic() - t0
        print(f"| {name} | {ours:.2f} ({result.target}) | {bare:.2f} |")


if __name__ == "__main__":
    main()
