"""Hypothesis fuzzing of the fleet properties beyond the exhaustive checker's bounds.

A `RuleBasedStateMachine` builds a random valid policy (1-4 targets, 1-3 keys each, 1-4
attempts, a random breaker and retry budget, a short probe lease), runs 2-5 turn slots
side by side on one health store (a finished turn's slot starts a new turn, so many
turns pass), and lets Hypothesis pick the interleaving: which turn starts, is granted its
attempt, gets which outcome (Retry-After values included), ends its wait; time passes in
between. `fsm.checker.interleave.FleetRun` judges every step with the same checks as the
exhaustive `check_fleet`: at most one half-open probe in flight per target; no retry
without a token (the checker's own ledger); no target unprobeable beyond its bound, nor
lost once every turn has ended; declared transitions, no ping-pong, termination.
"""

from __future__ import annotations

from typing import Any

from fallgate.fsm import Policy
from fallgate.fsm.checker.interleave import OUTCOMES, FleetRun
from fallgate.fsm.health.backend import MemoryBackend
from fallgate.fsm.health.shared_store import SharedHealthStore
from fallgate.fsm.health.store import HealthStore
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule


@st.composite
def fleet_policies(draw: Any) -> Policy:
    n = draw(st.integers(1, 4))
    entries = [
        {
            "provider": f"p{i}",
            "model": f"m{i}",
            "base_url": f"https://p{i}.test/v1",
            "api_keys": [f"sk-fuzz-{i}-{k}-0f1e2d" for k in range(draw(st.integers(1, 3)))],
        }
        for i in range(n)
    ]
    return Policy.from_dict(
        {
            "primary": entries[0],
            "fallback_providers": entries[1:],
            "max_attempts": draw(st.integers(1, 4)),
            "prefer_waiting": draw(st.booleans()),
            "attempt_timeout": draw(st.sampled_from([1.0, 5.0, 30.0])),
            "backoff": {"initial": 0.5, "cap": 2.0},
            "retry_after_cap": 10.0,
            "cooldown": {"initial": draw(st.sampled_from([1.0, 5.0])), "cap": 20.0},
            "breaker": {
                "allowed_failures": draw(st.integers(0, 3)),
                "window": draw(st.sampled_from([1.0, 10.0, 60.0])),
            },
            "retry_budget": {
                "size": draw(st.integers(1, 5)),
                "refill": draw(st.sampled_from([0.0, 0.2, 1.0])),
            },
        }
    )


class ConcurrentTurnsOnOneStore(RuleBasedStateMachine):
    """Any number of turns, interleaved any way, on one store: the fleet properties hold
    after every step."""

    shared = False

    @initialize(policy=fleet_policies(), turns=st.integers(2, 5))
    def build(self, policy: Policy, turns: int) -> None:
        note(f"{turns} turn slots; policy {policy}")
        store = SharedHealthStore(MemoryBackend()) if self.shared else HealthStore()
        self.run = FleetRun(policy, turns, store, OUTCOMES)

    @precondition(lambda self: hasattr(self, "run"))
    @rule(data=st.data())
    def one_step(self, data: st.DataObject) -> None:
        move = data.draw(st.sampled_from(self.run.moves()))
        note(f"turn {move[0] + 1} {move[1]}")
        self.run.step(move)

    @precondition(lambda self: hasattr(self, "run"))
    @rule(seconds=st.sampled_from([0.1, 1.0, 5.0, 30.0]))
    def time_passes(self, seconds: float) -> None:
        self.run.advance(seconds)

    @invariant()
    def every_fleet_property_holds(self) -> None:
        if hasattr(self, "run"):
            assert not self.run.violations, self.run.violations


class ConcurrentTurnsOnOneSharedReplica(ConcurrentTurnsOnOneStore):
    """The same, with the turns' store a `SharedHealthStore` over an in-memory backend
    (its replica and its journal in the loop; the grant goes through the backend)."""

    shared = True


TestConcurrentTurnsOnOneStore = ConcurrentTurnsOnOneStore.TestCase
TestConcurrentTurnsOnOneStore.settings = settings(max_examples=60, stateful_step_count=60)
TestConcurrentTurnsOnOneSharedReplica = ConcurrentTurnsOnOneSharedReplica.TestCase
TestConcurrentTurnsOnOneSharedReplica.settings = settings(max_examples=30, stateful_step_count=60)
