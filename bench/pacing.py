"""Pacing from the rate-limit headers: a fleet against a primary's real limits.

8 worker processes send turns as fast as they can for `SECONDS` against one fault server
whose primary has 2 keys, each limited to `R` requests and `T` tokens per `WINDOW` seconds
(`providers.testing.fault_server.limits`: the headers on every reply, 429 + Retry-After
when a bucket is empty), with a fallback that has its own limit. Per system:

- 429s received (% of the requests sent);
- turns answered, and failed;
- goodput: the primary's answered requests as a share of its quota over the run
  (2 keys x R per window);
- p50 / p99 turn latency.

Systems: fallgate with pacing (shared `RedisHealthStore`), fallgate without pacing (same
store), the bare openai SDK (``max_retries=2``, the primary only, one key per worker),
LiteLLM's Router (both deployments with their ``rpm`` / ``tpm``,
``routing_strategy="usage-based-routing-v2"``, the same redis-server) when litellm is
installed (the ``bench`` extra).

    python -m bench --only pacing
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import time
from typing import Any

from .workers import Workers

WORKERS = 8
SECONDS = 12.0
WINDOW = 2.0
R = 20  # requests per key per window
T = 4000  # tokens per key per window
FALLBACK_R = 400
PRIMARY, FALLBACK = "paced-primary", "paced-fallback"
MESSAGES = [{"role": "user", "content": "Say hi in a few words."}]
MAX_TOKENS = 20
SYSTEMS = ("fallgate+pacing", "fallgate-no-pacing", "sdk", "litellm")


def _policy(base_url: str, pacing: bool) -> Any:
    from fallgate.fsm import Policy

    return Policy.from_dict(
        {
            "primary": {
                "provider": "openai",
                "model": PRIMARY,
                "base_url": base_url,
                "api_keys": ["sk-paced-a", "sk-paced-b"],
                "rotation": "round_robin",
            },
            "fallback_providers": [
                {"provider": "openai", "model": FALLBACK, "base_url": base_url, "api_key": "sk-f"}
            ],
            "pacing": pacing,
            "deadline": 30.0,
        }
    )


def _worker(args: dict[str, Any]) -> dict[str, Any]:
    system, base_url, redis, n = args["system"], args["base_url"], args["redis"], args["index"]
    until = None
    lat: list[float] = []
    answered: dict[str, int] = {}
    failed = 0
    errors: dict[str, int] = {}  # why turns failed (the first line of each), counted
    if system.startswith("fallgate"):
        import fallgate
        from fallgate import providers

        client = providers.Fallgate(
            _policy(base_url, system == "fallgate+pacing"),
            health=fallgate.RedisHealthStore(redis),
        )

        def call() -> str:
            r = client.chat.completions.create(messages=MESSAGES, max_tokens=MAX_TOKENS)
            return str(r.model)

    elif system == "sdk":
        import openai

        sdk = openai.OpenAI(
            base_url=base_url, api_key=["sk-paced-a", "sk-paced-b"][n % 2], max_retries=2
        )

        def call() -> str:
            r = sdk.chat.completions.create(model=PRIMARY, messages=MESSAGES, max_tokens=MAX_TOKENS)
            return str(r.model)

    else:
        import logging
        import os

        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
        import litellm
        from litellm import Router

        litellm.suppress_debug_info = True
        logging.getLogger("LiteLLM").setLevel(logging.ERROR)
        host, port = redis.removeprefix("redis://").split("/")[0].split(":")

        def dep(model: str, key: str, rpm: int, tpm: int | None) -> dict[str, Any]:
            params: dict[str, Any] = {
                "model": f"openai/{model}",
                "api_base": base_url,
                "api_key": key,
                "rpm": rpm,
            }
            if tpm is not None:
                params["tpm"] = tpm
            return {"model_name": "chat", "litellm_params": params}

        per_min = 60.0 / WINDOW
        router = Router(
            model_list=[
                dep(PRIMARY, "sk-paced-a", int(R * per_min), int(T * per_min)),
                dep(PRIMARY, "sk-paced-b", int(R * per_min), int(T * per_min)),
                dep(FALLBACK, "sk-f", int(FALLBACK_R * per_min), None),
            ],
            routing_strategy="usage-based-routing-v2",
            redis_host=host,
            redis_port=int(port),
            num_retries=2,
        )

        def call() -> str:
            r = router.completion(model="chat", messages=MESSAGES, max_tokens=MAX_TOKENS)
            return str(r.model).split("/")[-1]

    call()  # warm (the server's buckets are reset before the run)
    print("ready", flush=True)
    sys.stdin.readline()
    until = time.monotonic() + args["seconds"]
    while time.monotonic() < until:
        t0 = time.monotonic()
        try:
            model = call()
            answered[model] = answered.get(model, 0) + 1
        except Exception as e:
            failed += 1
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            errors[why] = errors.get(why, 0) + 1
        lat.append(time.monotonic() - t0)
    return {"answered": answered, "failed": failed, "latency": lat, "errors": errors}


def _run(
    system: str, redis: str, seconds: float = SECONDS, workers: int = WORKERS
) -> dict[str, Any]:
    from fallgate.providers.testing import FaultServer

    limits = {
        PRIMARY: {"requests": R, "tokens": T, "window": WINDOW},
        FALLBACK: {"requests": FALLBACK_R, "window": WINDOW},
    }
    with FaultServer(limits=limits) as srv:
        import redis as redis_lib

        redis_lib.Redis.from_url(redis).flushall()
        configs = [
            {"system": system, "base_url": srv.base_url, "redis": redis, "index": i,
             "seconds": seconds}
            for i in range(workers)
        ]  # fmt: skip
        with Workers("bench.pacing", configs, f"pacing worker ({system})") as procs:
            time.sleep(WINDOW)  # the warm-up requests' windows end
            srv.buckets.reset()
            results, seconds = procs.run(timeout=seconds + 120)
        refused = sum(srv.buckets.refused.values())
        charged = dict(srv.buckets.charged)
    sent = refused + sum(charged.values())
    lat = sorted(x for r in results for x in r["latency"])
    answered: dict[str, int] = {}
    errors: dict[str, int] = {}
    for r in results:
        for m, k in r["answered"].items():
            answered[m] = answered.get(m, 0) + k
        for why, k in r.get("errors", {}).items():
            errors[why] = errors.get(why, 0) + k
    quota = 2 * R * (seconds / WINDOW)
    return {
        "system": system,
        "requests": sent,
        "429s": refused,
        "429_pct": round(100.0 * refused / sent, 2) if sent else 0.0,
        "answered": sum(answered.values()),
        "answered_by": answered,
        "failed": sum(r["failed"] for r in results),
        "goodput_pct": round(100.0 * answered.get(PRIMARY, 0) / quota, 1),
        "p50_ms": round(1000 * statistics.median(lat), 1) if lat else None,
        "p99_ms": round(1000 * lat[int(0.99 * (len(lat) - 1))], 1) if lat else None,
        "seconds": round(seconds, 1),
        "errors": errors,
    }


def measure(log: Any = print, quick: bool = False) -> dict[str, Any]:
    """Every system's row; `quick` (the smoke test's mode): fallgate with pacing alone, 2
    workers for two windows."""
    from .fleet import redis_url

    rows = []
    with redis_url() as redis:
        if redis is None:
            log("  redis-server is not installed: the pacing bench needs it")
            return {"rows": []}
        seconds, workers = (2 * WINDOW, 2) if quick else (SECONDS, WORKERS)
        for system in SYSTEMS[:1] if quick else SYSTEMS:
            if system == "litellm" and importlib.util.find_spec("litellm") is None:
                # (found, not imported: importing it here would fetch its cost map)
                log("  litellm: not installed (pip install -e '.[bench]'), skipped")
                continue
            log(f"  {system} ...")
            rows.append(_run(system, redis, seconds, workers))
    log(table(rows))
    for r in rows:
        for why, k in sorted(r["errors"].items(), key=lambda kv: -kv[1])[:3]:
            log(f"  {r['system']}: {k} failed: {why}")
    return {"rows": rows, "setup": {
        "workers": workers, "seconds": seconds, "window": WINDOW, "requests_per_key": R,
        "tokens_per_key": T, "keys": 2, "fallback_requests": FALLBACK_R,
    }}  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    head = "| system | requests | 429s | answered | failed | goodput (primary quota) | p50 | p99 |"
    out = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['system']} | {r['requests']} | {r['429s']} ({r['429_pct']}%) | "
            f"{r['answered']} | {r['failed']} | {r['goodput_pct']}% | {r['p50_ms']} ms | "
            f"{r['p99_ms']} ms |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
