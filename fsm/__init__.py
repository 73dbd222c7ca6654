"""fallgate's engine: every LLM call as a declared, model-checked state machine.

The tiny public surface::

    from fsm import Policy, run, arun, instant_waits
"""

from __future__ import annotations

from .actions import Action, Attempt, Fail, Finish, Rebuild, Wait
from .classify import classify_exception, classify_status
from .clock import instant_waits, set_instant_waits
from .drivers import TurnResult, adrive, arun, drive, run
from .errors import MissingCredential, PolicyError, TurnFailed
from .health import HealthStore
from .machine import Declaration, State, Transition, declare
from .outcomes import Outcome, OutcomeKind
from .policy import Backoff, Cooldown, Credential, Policy, Secret, Target
from .trace import TraceEvent, from_jsonl, to_jsonl
from .traits import Rule
from .turn import ProtocolError, TransitionsTurn, Turn

__all__ = [
    "Action",
    "Attempt",
    "Backoff",
    "Cooldown",
    "Credential",
    "Declaration",
    "Fail",
    "Finish",
    "HealthStore",
    "MissingCredential",
    "Outcome",
    "OutcomeKind",
    "Policy",
    "PolicyError",
    "ProtocolError",
    "Rebuild",
    "Rule",
    "Secret",
    "State",
    "Target",
    "TraceEvent",
    "Transition",
    "TransitionsTurn",
    "Turn",
    "TurnFailed",
    "TurnResult",
    "Wait",
    "adrive",
    "arun",
    "classify_exception",
    "classify_status",
    "declare",
    "drive",
    "from_jsonl",
    "instant_waits",
    "run",
    "set_instant_waits",
    "to_jsonl",
]
