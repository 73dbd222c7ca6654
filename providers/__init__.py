"""fallgate's providers: everything that talks to a real API.

The openai-compatible wrappers (`Fallgate`, `AsyncFallgate`; their turns'
`GateResult` and token `Usage`), the classifier
for what the `openai` SDK raises (`classify_openai`), the per-(target,
credential) client pools, and the fault-injecting server for tests
(`providers.testing.fault_server.FaultServer`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .openai.client import AsyncFallgate, Fallgate
    from .openai.exceptions import (
        ClientUnavailable,
        MalformedReply,
        StreamInterrupted,
        classify_openai,
    )
    from .openai.http.pools import (
        AsyncClientPool,
        ClientPool,
        async_openai_factory,
        openai_factory,
    )
    from .openai.streaming import AsyncFallgateStream, FallgateStream
    from .openai.usage import AttemptUsage, GateResult, Usage

# Imported lazily: `providers.testing.fault_server` and the pytest plugin must not pay
# for importing the openai SDK (about a second) when they do not need it.
_LAZY = {
    "ClientUnavailable": "openai.exceptions",
    "MalformedReply": "openai.exceptions",
    "StreamInterrupted": "openai.exceptions",
    "classify_openai": "openai.exceptions",
    "AsyncFallgate": "openai.client",
    "Fallgate": "openai.client",
    "AsyncClientPool": "openai.http.pools",
    "ClientPool": "openai.http.pools",
    "async_openai_factory": "openai.http.pools",
    "openai_factory": "openai.http.pools",
    "AsyncFallgateStream": "openai.streaming",
    "FallgateStream": "openai.streaming",
    "AttemptUsage": "openai.usage",
    "GateResult": "openai.usage",
    "Usage": "openai.usage",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'providers' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "AsyncClientPool",
    "AsyncFallgate",
    "AsyncFallgateStream",
    "AttemptUsage",
    "ClientPool",
    "ClientUnavailable",
    "Fallgate",
    "FallgateStream",
    "GateResult",
    "MalformedReply",
    "StreamInterrupted",
    "Usage",
    "async_openai_factory",
    "classify_openai",
    "openai_factory",
]
