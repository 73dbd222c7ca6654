"""fallgate's engine: every LLM call as a declared, model-checked state machine.

Pure: fed outcomes, returning actions; no I/O, no wall clock, no global randomness. The
names most hosts need are here; the rest live in the subpackages, lowest layer first:

- `kinds` (what an outcome is and what each kind means), `catalogue` (what a provider's
  status, headers and body mean), `clock` (injected time), `errors`, `redact`, `trace`;
- `policy` (the chain, its keys and rules, loading and checks);
- `health` (what outlives a turn: breakers, budgets, cooldowns, the shared store);
- `core` (the one declaration, its guards and effects, the turn's state, the turn);
- `host` (the sync / asyncio host loops and their observer hook, recording, scripted turns);
- `diagram`, `replay`, `telemetry` (tools that read the declaration and the traces);
- `checker` (the exhaustive model checker).
"""

from __future__ import annotations

from .clock import VirtualClock, instant_waits
from .core.turn import Turn
from .errors import PolicyError, TurnFailed
from .health.store import HealthStore
from .host.drivers import TurnResult, adrive, arun, drive, run
from .kinds import Outcome, OutcomeKind
from .policy.model import Policy, Target

__all__ = [
    "HealthStore",
    "Outcome",
    "OutcomeKind",
    "Policy",
    "PolicyError",
    "Target",
    "Turn",
    "TurnFailed",
    "TurnResult",
    "VirtualClock",
    "adrive",
    "arun",
    "drive",
    "instant_waits",
    "run",
]
