"""One worker process of a fleet: a `fallgate.Fallgate` whose health store is shared
(SQLite, Redis) or its own (``memory``), driven by its parent over stdin.

argv[1] is JSON: {base_url, store ("memory" or a store URL), attempt_timeout,
allowed_failures, cooldown}. Prints ``ready``; then for each line ``turn`` runs one
chat turn and prints {"model": the model that answered (or null), "error": ...};
``quit`` ends it. fallgate's log (WARNING and up) goes to stderr, one record a line.
"""

from __future__ import annotations

import json
import logging
import sys

from fallgate.fsm import Policy, Target
from fallgate.fsm.policy.model import Breaker, Cooldown, Credential

import fallgate

PRIMARY, FALLBACK, WARMUP = "primary-model", "fallback-model", "warmup"
MESSAGES = [{"role": "user", "content": "hi"}]
#: The primary's key: a test asserts it never shows up in logs, the store or the CLI.
PRIMARY_KEY = "sk-primary-SECRET-0123456789"


def policy(args: dict) -> Policy:
    base = args["base_url"]
    return Policy(
        targets=[
            Target("fault", PRIMARY, base, credentials=[Credential.literal(PRIMARY_KEY)]),
            Target("fault", FALLBACK, base, credentials=[Credential.literal("sk-fallback")]),
        ],
        max_attempts=1,
        attempt_timeout=args.get("attempt_timeout", 5.0),
        breaker=Breaker(allowed_failures=args.get("allowed_failures", 2)),
        cooldown=Cooldown(initial=args.get("cooldown", 5.0)),
    )


def store(spec: str) -> fallgate.HealthStore:
    if spec == "memory":
        return fallgate.HealthStore()
    if spec.startswith("sqlite:///"):
        return fallgate.SQLiteHealthStore(spec[len("sqlite:///") :])
    return fallgate.RedisHealthStore(spec, reconnect_after=0.2)


def main() -> int:
    args = json.loads(sys.argv[1])
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    log = logging.getLogger("fallgate")
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    pol = policy(args)
    health = store(args["store"])
    client = fallgate.Fallgate(pol, health=health)
    # warm, as a running fleet is: build each target's SDK client and open its
    # connection with a request for a model no test scripts (left out of the counts)
    for t in pol.targets:
        for c in t.pool():
            with client.clients.lease(t, c) as sdk:
                sdk.chat.completions.create(model=WARMUP, messages=MESSAGES)
    backend = getattr(health, "backend", None)
    if backend is not None:  # and open the store (a SQLite file is opened on first use)
        try:
            backend.scan()
        except Exception:  # unreachable now (a test that starts Redis later): local health
            pass
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        try:
            reply = client.chat.completions.create(messages=MESSAGES)
            out = {"model": reply.model, "error": None}
        except Exception as e:  # reported to the parent, which asserts on it
            out = {"model": None, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
