"""fallgate's engine: every LLM call as a declared, model-checked state machine.

The tiny public surface::

    from fsm import Policy, run, arun, instant_waits

Time is injected as a `Clock` (`SystemClock` by default, `VirtualClock` for
tests); `fsm.host` holds the one host loop (sync and asyncio) every driver
runs on; `fsm.health.DEFAULT` is the health store of turns given none.
"""

from __future__ import annotations

from .actions import Action, Attempt, Fail, Finish, Rebuild, Wait
from .classify import classify_exception, classify_status
from .clock import Clock, SystemClock, VirtualClock, instant_waits
from .drivers import TurnResult, adrive, arun, drive, run
from .errors import MissingCredential, PolicyError, TurnFailed
from .health import HealthStore
from .host import ahost_loop, host_loop
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
    "Clock",
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
    "SystemClock",
    "Target",
    "TraceEvent",
    "Transition",
    "TransitionsTurn",
    "Turn",
    "TurnFailed",
    "TurnResult",
    "VirtualClock",
    "Wait",
    "adrive",
    "ahost_loop",
    "arun",
    "classify_exception",
    "classify_status",
    "declare",
    "drive",
    "from_jsonl",
    "host_loop",
    "instant_waits",
    "run",
    "to_jsonl",
]
