"""One system answering one scenario, in its own process (so a run can be capped).

Protocol with the parent (`bench.faults`): argv[1] is JSON {system, base_url,
fallback}. The child builds its clients and warms them with a request for the
unscripted model `WARMUP` (untimed: imports, first-use costs and connection
set-up are not the turn; the parent leaves WARMUP out of the counts), prints
``ready``, makes one chat completion through the chain, and prints one JSON
line {seconds, answered, error}.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .scenarios import CLIENT_TIMEOUT, FALLBACK, PRIMARY, WARMUP

MESSAGES = [{"role": "user", "content": "Say hi."}]
Call = Callable[[], Any]


def _policy(base_url: str, fallback: bool) -> Any:
    from fallgate.fsm import Policy, Target
    from fallgate.fsm.policy.model import Credential

    targets = [Target("fault", PRIMARY, base_url, credentials=[Credential.literal("sk-primary")])]
    if fallback:
        targets.append(
            Target("fault", FALLBACK, base_url, credentials=[Credential.literal("sk-fallback")])
        )
    # Regression scenario 1's policy (docs/design.md): two attempts per target, 1 s per
    # attempt; the rest default.
    return Policy(targets=targets, max_attempts=2, attempt_timeout=CLIENT_TIMEOUT)


def fallgate(base_url: str, fallback: bool) -> tuple[Call, Call]:
    from fallgate.fsm import Policy, Target

    from fallgate import providers

    policy = _policy(base_url, fallback)
    client = providers.Fallgate(policy)
    warm_gate = providers.Fallgate(
        Policy(targets=[Target("fault", WARMUP, base_url, keyless=True)])
    )

    def warm() -> None:
        warm_gate.chat.completions.create(model=WARMUP, messages=MESSAGES)  # code paths
        for t in policy.targets:  # the real clients, and their connections
            for c in t.pool():
                with client.clients.lease(t, c) as sdk_client:
                    sdk_client.chat.completions.create(model=WARMUP, messages=MESSAGES)

    return (lambda: client.chat.completions.create(model=PRIMARY, messages=MESSAGES)), warm


def _sdk(base_url: str, key: str, retries: int) -> Any:
    import openai

    return openai.OpenAI(
        base_url=base_url, api_key=key, max_retries=retries, timeout=CLIENT_TIMEOUT
    )


def _with_fallback(primary: Call, fallback: Call | None) -> Call:
    """What users write around a single-provider client: try, then the fallback."""

    def call() -> Any:
        try:
            return primary()
        except Exception:
            if fallback is None:
                raise
            return fallback()

    return call


def _warm(*clients: Any) -> Call:
    def warm() -> None:
        for c in clients:
            c.chat.completions.create(model=WARMUP, messages=MESSAGES)

    return warm


def sdk(base_url: str, fallback: bool) -> tuple[Call, Call]:
    p, f = _sdk(base_url, "sk-primary", 2), _sdk(base_url, "sk-fallback", 2)
    call = _with_fallback(
        lambda: p.chat.completions.create(model=PRIMARY, messages=MESSAGES),
        (lambda: f.chat.completions.create(model=FALLBACK, messages=MESSAGES))
        if fallback
        else None,
    )
    return call, _warm(p, f)


def tenacity_sdk(base_url: str, fallback: bool) -> tuple[Call, Call]:
    """The OpenAI cookbook's recipe, with the SDK's own retries off so they do not multiply."""
    from tenacity import retry, stop_after_attempt, wait_random_exponential

    p, f = _sdk(base_url, "sk-primary", 0), _sdk(base_url, "sk-fallback", 0)

    @retry(wait=wait_random_exponential(min=1, max=60), stop=stop_after_attempt(6), reraise=True)
    def primary() -> Any:
        return p.chat.completions.create(model=PRIMARY, messages=MESSAGES)

    @retry(wait=wait_random_exponential(min=1, max=60), stop=stop_after_attempt(6), reraise=True)
    def secondary() -> Any:
        return f.chat.completions.create(model=FALLBACK, messages=MESSAGES)

    @retry(wait=wait_random_exponential(min=1, max=60), stop=stop_after_attempt(6), reraise=True)
    def warm() -> Any:
        for c in (p, f):
            c.chat.completions.create(model=WARMUP, messages=MESSAGES)

    return _with_fallback(primary, secondary if fallback else None), warm


def litellm_router(base_url: str, fallback: bool) -> tuple[Call, Call]:
    """LiteLLM's Router as its docs configure fallbacks (loopback only, no telemetry)."""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    os.environ["LITELLM_TELEMETRY"] = "False"
    import litellm
    from litellm import Router

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    model_list = [
        {
            "model_name": "primary",
            "litellm_params": {
                "model": f"openai/{PRIMARY}",
                "api_base": base_url,
                "api_key": "sk-primary",
            },
        }
    ]
    if fallback:
        model_list.append(
            {
                "model_name": "fallback",
                "litellm_params": {
                    "model": f"openai/{FALLBACK}",
                    "api_base": base_url,
                    "api_key": "sk-fallback",
                },
            }
        )
    router = Router(
        model_list=model_list,
        fallbacks=[{"primary": ["fallback"]}] if fallback else [],
        num_retries=2,
        timeout=CLIENT_TIMEOUT,
    )
    # LiteLLM keeps one client per deployment: warm each with a request for a model
    # the scenario does not script (the server answers it; the count leaves it out).
    warmers = [
        Router(
            model_list=[
                {
                    "model_name": "warm",
                    "litellm_params": {**d["litellm_params"], "model": f"openai/{WARMUP}"},
                }
            ],
            num_retries=0,
            timeout=CLIENT_TIMEOUT,
        )
        for d in model_list
    ]

    def warm() -> None:
        for w in warmers:
            w.completion(model="warm", messages=MESSAGES)

    return (lambda: router.completion(model="primary", messages=MESSAGES)), warm


SYSTEMS: dict[str, Callable[[str, bool], tuple[Call, Call]]] = {
    "fallgate": fallgate,
    "openai SDK (max_retries=2)": sdk,
    "tenacity + SDK": tenacity_sdk,
    "LiteLLM Router": litellm_router,
}


def main(argv: list[str]) -> int:
    args = json.loads(argv[1])
    call, warm = SYSTEMS[args["system"]](args["base_url"], bool(args["fallback"]))
    warm()
    print("ready", flush=True)
    t0 = time.perf_counter()
    answered, error = False, ""
    try:
        resp = call()
        answered = bool(resp.choices[0].message.content)
    except Exception as e:  # the outcome is data here: report it
        error = f"{type(e).__name__}: {str(e)[:160]}"
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "answered": answered, "error": error}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
