"""fallgate's engine: every LLM call as a declared, model-checked state machine.

Pure: fed outcomes, returning actions; no I/O, no wall clock, no global
randomness. The names most hosts need are here; the rest live in the modules
that say what they hold: `actions` (what the core asks its host to do),
`traits` (what each outcome kind means), `machine` (the one declaration),
`guards` (what its edges check and do), `state`, `turn` (the executors),
`host` and `drivers` (the host loops), `clock`, `health`, `trace`, `diagram`,
`checker` (the model checker), `record` and `replay` (recorded turns replayed under
another policy) and `testing` (a fake clock, scripted turns).
"""

from __future__ import annotations

from .clock import VirtualClock, instant_waits
from .drivers import TurnResult, adrive, arun, drive, run
from .errors import PolicyError, TurnFailed
from .health import HealthStore
from .outcomes import Outcome, OutcomeKind
from .policy import Policy, Target
from .turn import Turn

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
