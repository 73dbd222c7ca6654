"""An exhaustive model checker for the turn machine.

The checker does not model the machine: it drives the real executor (`fsm.Turn`,
the same guards and effects users run, or `TransitionsTurn`) breadth-first over
every reachable configuration of a bounded policy, and checks thirteen properties on
every transition with its own bookkeeping (it does not ask the engine whether the
engine is right). A violation comes with a shortest event sequence that breaks it,
as steps that `replay` feeds to a fresh turn.

A configuration is the machine state, the per-turn counters, the health store's
facts relative to the clock, and the credential states. The event alphabet is
finite (every outcome class, Retry-After in {none, 0, below the cap, above the
cap}, the host's replies to Wait and Rebuild). The clock is virtual (advanced by
each Wait), the random source fixed (worst-case jitter), the health store fresh
per initial configuration: all targets free, the primary (or one of its keys)
cooling briefly, any one target or runs of targets cooling for good, everything
cooling. A turn's end continues into a next turn on the same health store, checked
from its start for a few events.

Modules: `search` (the breadth-first search), `initial` (the starting health),
`alphabet` (the events fed), `configuration` (when two configurations are the same,
and how to copy one), `oracle` (the checker's own reading of the rules), `record`
(one transition as the properties see it), `properties` (the thirteen properties, one
pure function each), `graph` (termination and the fallback gate over the whole
graph), `steps` (counterexamples and `replay`), `report`, `monitor` (the same
checks along one run, for fuzzing), `context` (what is fixed for a whole check).
"""

from .context import default_policy
from .monitor import Monitor
from .properties import PROPERTIES
from .report import CheckReport, Violation
from .search import Checker, check_policy
from .steps import Replay, Step, format_steps, replay, step, steps_from_json, steps_to_json

__all__ = [
    "PROPERTIES",
    "CheckReport",
    "Checker",
    "Monitor",
    "Replay",
    "Step",
    "Violation",
    "check_policy",
    "default_policy",
    "format_steps",
    "replay",
    "step",
    "steps_from_json",
    "steps_to_json",
]
