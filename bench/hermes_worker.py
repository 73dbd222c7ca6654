"""One hermes-agent conversation under one fault scenario, in the hermes venv.

Run by `bench.hermes` as ``build/hermes-venv/bin/python -P bench/hermes_worker.py
JSON`` (``-P``: the repository's top-level folders, ``providers/`` above all, must
not shadow hermes-agent's own packages). Same protocol as `bench.fault_worker`:
argv[1] is JSON {system, base_url, fallback}; the worker builds a real `AIAgent`
(tests/hermes/harness.py: provider zai, glm-5.1, glm-4.7 as ``fallback_model``
when the scenario has a fallback, hermes' timeouts 1 s), warms hermes with one
conversation on the unscripted model ``warmup``, prints ``ready``, runs one
conversation ("Say hi.") and prints one JSON line {seconds, answered, error,
hermes_fallback}. ``system`` "hermes-agent + fallgate" first calls
``fallgate.providers.integrations.hermes.attach(agent, {"max_attempts": 2, "attempt_timeout":
1})``: the faults table's fallgate policy. Everything hermes prints goes to
stderr; stdout carries the protocol only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

CLIENT_TIMEOUT = 1.0
HERMES = "hermes-agent"
HERMES_FALLGATE = "hermes-agent + fallgate"


def main(argv: list[str]) -> int:
    proto = os.fdopen(os.dup(1), "w")  # the parent reads this; hermes' prints go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "hermes"))
    import harness

    args = json.loads(argv[1])
    harness.set_up(timeout=CLIENT_TIMEOUT)
    spy = harness.FallbackSpy()
    harness.warm(args["base_url"])
    agent = harness.make_agent(args["base_url"], fallback=bool(args["fallback"]))
    if args["system"] == HERMES_FALLGATE:
        from fallgate.providers.integrations.hermes import attach

        attach(agent, {"max_attempts": 2, "attempt_timeout": CLIENT_TIMEOUT})
    elif args["system"] != HERMES:
        raise SystemExit(f"unknown system {args['system']!r}")
    switches = spy.switches
    print("ready", file=proto, flush=True)
    error = ""
    t0 = time.perf_counter()
    try:
        result = agent.run_conversation("Say hi.")
        answered = bool(result.get("final_response")) and not result.get("failed")
        if not answered:
            error = str(result.get("error") or result.get("final_response") or "")[:160]
    except Exception as e:  # the outcome is data here: report it
        answered = False
        error = f"{type(e).__name__}: {str(e)[:160]}"
    seconds = time.perf_counter() - t0
    out = {
        "seconds": seconds,
        "answered": answered,
        "error": error,
        "hermes_fallback": spy.switches > switches,
    }
    print(json.dumps(out), file=proto, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
