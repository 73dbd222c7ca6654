"""Test aids for code that uses fallgate, in one place.

- The fault server: `FaultServer` (a real OpenAI-compatible HTTP server on
  loopback, scripted per model), its `Script`, `load_script` for JSON / TOML
  script files, and `ScriptError` for a bad script.
- The pure core without HTTP: `play(policy, ["transport", "rate_limited:171",
  "success"])` runs a turn against scripted outcomes on a `VirtualClock` and
  returns what was `Played`; `ScriptExhausted` when the outcomes run out.

- A real `redis-server` on loopback (`RedisServer`, from PATH), for tests of the
  Redis health store.

In pytest, the ``fault_server`` and ``redis_server`` fixtures (installed with
fallgate, from `providers.testing.plugin`) give a started `FaultServer` or
`RedisServer` per test.
"""

from __future__ import annotations

from ...fsm.clock import VirtualClock
from ...fsm.host.scripted import Played, ScriptExhausted, play
from .fault_server import FaultServer, Script, ScriptError, load_script
from .redis_server import RedisServer, RedisServerMissing

__all__ = [
    "FaultServer",
    "Played",
    "RedisServer",
    "RedisServerMissing",
    "Script",
    "ScriptError",
    "ScriptExhausted",
    "VirtualClock",
    "load_script",
    "play",
]
