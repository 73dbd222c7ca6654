"""fallgate's providers: everything that talks to a real API.

The openai-compatible wrappers (`Fallgate`, `AsyncFallgate`), the classifier
for what the `openai` SDK raises (`classify_openai`), the per-(target,
credential) client pools, and the fault-injecting server for tests
(`providers.fault_server.FaultServer`).
"""

from __future__ import annotations

from .classify import ClientUnavailable, MalformedReply, StreamInterrupted, classify_openai
from .openai_adapter import AsyncFallgate, Fallgate
from .pools import AsyncClientPool, ClientPool, async_openai_factory, openai_factory
from .streaming import AsyncFallgateStream, FallgateStream

__all__ = [
    "AsyncClientPool",
    "AsyncFallgate",
    "AsyncFallgateStream",
    "ClientPool",
    "ClientUnavailable",
    "Fallgate",
    "FallgateStream",
    "MalformedReply",
    "StreamInterrupted",
    "async_openai_factory",
    "classify_openai",
    "openai_factory",
]
