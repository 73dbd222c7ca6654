"""Test aids for users: the fault server, a virtual clock, scripted turns.

    from fallgate.testing import FaultServer, VirtualClock, play

    with FaultServer(script) as srv:   # a real OpenAI-compatible server on loopback
        ...                              # point a policy's base_url at srv.base_url

    played = play(policy, ["transport", "transport", "rate_limited:171", "success"])

`instant_waits()` (also `fallgate.instant_waits`) makes every wait instant while
keeping cooldowns honest; `RedisServer` runs a real `redis-server` (from PATH) on
loopback for tests of the Redis health store. The pytest plugin gives the
`fault_server` and `redis_server` fixtures.
"""

from __future__ import annotations

from .fsm.clock import VirtualClock, instant_waits
from .providers.testing import (
    FaultServer,
    Played,
    RedisServer,
    RedisServerMissing,
    Script,
    ScriptError,
    ScriptExhausted,
    load_script,
    play,
)

__all__ = [
    "FaultServer",
    "Played",
    "RedisServer",
    "RedisServerMissing",
    "Script",
    "ScriptError",
    "ScriptExhausted",
    "VirtualClock",
    "instant_waits",
    "load_script",
    "play",
]
