"""Test aids for code that uses fallgate, in one place.

- The fault server: `FaultServer` (a real OpenAI-compatible HTTP server on
  loopback, scripted per model), its `Script`, `load_script` for JSON / TOML
  script files, and `ScriptError` for a bad script.
- The pure core without HTTP: `play(policy, ["transport", "rate_limited:171",
  "success"])` runs a turn against scripted outcomes on a `FakeClock` and
  returns what was `Played`; `ScriptExhausted` when the outcomes run out.

In pytest, the ``fault_server`` fixture (installed with fallgate, from
`providers.testing_plugin`) gives a started `FaultServer` per test.
"""

from __future__ import annotations

from ..fsm.testing import FakeClock, Played, ScriptExhausted, play
from .fault_server import FaultServer, Script, ScriptError, load_script

__all__ = [
    "FakeClock",
    "FaultServer",
    "Played",
    "Script",
    "ScriptError",
    "ScriptExhausted",
    "load_script",
    "play",
]
