"""fallgate: every LLM API call as a declared, model-checked state machine.

The small public surface::

    import fallgate

    policy = fallgate.Policy.from_toml("fallgate.toml")
    client = fallgate.Fallgate(policy)            # openai-compatible wrapper
    client = openai.OpenAI(api_key="unused", http_client=fallgate.http_client(policy))
    reply = client.chat.completions.create(messages=[...])

    result = fallgate.run(policy, call)           # your own transport, sync
    result = await fallgate.arun(policy, acall)   # ... or asyncio

    fallgate.enable_otel()                        # OpenTelemetry spans and metrics (fallgate[otel])

    fallgate.record_traces("turns.jsonl")         # every turn, replayable (trace format 1)
    report = fallgate.replay(open("turns.jsonl").read(), fallgate.Policy.from_toml("new.toml"))

    health = fallgate.RedisHealthStore("redis://cache:6379/0")    # a fleet shares health
    health = fallgate.SQLiteHealthStore("/var/tmp/fallgate.db")   # ... or one host's processes
    client = fallgate.Fallgate(policy, health=health)

The engine is `fallgate.fsm` (pure, no I/O), everything that talks to a real
API is `fallgate.providers`, and test aids are in `fallgate.testing`. The
openai wrappers are imported on first use, so `import fallgate.fsm` never
imports the openai SDK.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# In a checkout, fsm/ and providers/ sit beside this folder (a wheel installs them inside
# it): run from the repository root, this folder shadows the installed package, so its
# subpackages are looked up beside it too.
if not os.path.isdir(os.path.join(os.path.dirname(__file__), "fsm")):
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(_root, "fsm", "__init__.py")):
        __path__.append(_root)

from .fsm.clock import VirtualClock, instant_waits
from .fsm.errors import PolicyError, TurnFailed
from .fsm.health.store import HealthStore
from .fsm.host.drivers import TurnResult, arun, run
from .fsm.host.recorder import record_traces, stop_recording
from .fsm.kinds import Outcome, OutcomeKind
from .fsm.policy.model import Policy
from .fsm.replay.player import ReplayReport, replay
from .fsm.telemetry.otel import disable as disable_otel
from .fsm.telemetry.otel import enable as enable_otel

if TYPE_CHECKING:
    from .fsm.checker import check_policy
    from .providers.openai.client import AsyncFallgate, Fallgate
    from .providers.openai.http.embedded import async_http_client, http_client
    from .providers.stores.shared import RedisHealthStore, SQLiteHealthStore

__all__ = [
    "AsyncFallgate",
    "Fallgate",
    "HealthStore",
    "Outcome",
    "OutcomeKind",
    "Policy",
    "PolicyError",
    "RedisHealthStore",
    "ReplayReport",
    "SQLiteHealthStore",
    "TurnFailed",
    "TurnResult",
    "VirtualClock",
    "arun",
    "async_http_client",
    "check_policy",
    "disable_otel",
    "enable_otel",
    "http_client",
    "instant_waits",
    "record_traces",
    "replay",
    "run",
    "stop_recording",
]

#: Loaded on first use: the openai wrappers import the SDK, the checker is large, the
#: shared stores are network code (the Redis one needs the optional redis package).
_LAZY = {
    "Fallgate": ".providers.openai.client",
    "AsyncFallgate": ".providers.openai.client",
    "http_client": ".providers.openai.http.embedded",
    "async_http_client": ".providers.openai.http.embedded",
    "check_policy": ".fsm.checker",
    "SQLiteHealthStore": ".providers.stores.shared",
    "RedisHealthStore": ".providers.stores.shared",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fallgate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
