"""The checker's per-transition checks along one run, fed step by step.

For fuzzing beyond the search's bounds: Hypothesis drives a `Monitor` with random
policies, random outcomes and any Retry-After, and asserts that no property broke.
"""

from __future__ import annotations

from typing import Any

from ..clock import VirtualClock
from ..core.actions import Rebuild, Wait
from ..core.machine import TERMINALS
from ..core.turn import TurnBase
from ..policy.model import Policy
from .configuration import Live
from .oracle import Obs
from .search import Checker
from .steps import ADVANCE, START_TIME, Step, step
from .transition import Before


class Monitor(Checker):
    """`feed(step)` applies one step (any trigger, any Retry-After, ``next_turn``) and
    checks it; `violations` holds what broke, each with the steps so far. Time is kept
    exactly (no abstraction: a run has no graph to merge)."""

    def __init__(self, policy: Policy, **kw: Any) -> None:
        super().__init__(policy, abstract_time=False, **kw)
        self.clock = VirtualClock(START_TIME)
        self.health = self.health_factory()
        self.steps: list[Step] = []
        self.live = {0: Live(self._new_turn(self.health, self.clock), self.clock, Obs(self.n, 1))}

    @property
    def turn(self) -> TurnBase:
        return self.live[0].turn

    @property
    def obs_events(self) -> int:
        return self.live[0].obs.events

    def allowed(self) -> str:
        """What the host may feed now: "start", "outcome", "waited", "rebuilt" or "end"."""
        s = self.turn.s
        if s.state in TERMINALS:
            return "end"
        a = s.action
        if a is None:
            return "start"
        if isinstance(a, Wait):
            return "waited"
        if isinstance(a, Rebuild):
            return "rebuilt"
        return "outcome"

    def feed(self, st: Step) -> None:
        live = self.live[0]
        h = live.turn.s.health
        pre = Before.of(h)
        self.transitions += 1
        self._fire(-1, live, st, pre)
        self.steps.append(st)

    def advance(self, seconds: float) -> None:
        """Let time pass between turns (cooldowns run out)."""
        self.clock.advance(seconds)
        self.steps.append(step(ADVANCE, seconds=seconds))

    def path(self, nid: int, *extra: Step) -> tuple[Step, ...]:
        return (*self.steps, *extra)
