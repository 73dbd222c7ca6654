"""The checker on concurrent turns: every interleaving of 2 (and 3) turns on one shared
health store; the new properties hold for the real store, and deliberately broken stores
are caught with a shortest interleaving that replays."""

from __future__ import annotations

from typing import Any

import pytest
from fallgate.fsm import fleet
from fallgate.fsm.checker.fleet import FLEET_PROPERTIES, check_fleet, replay_fleet
from fallgate.fsm.health import HealthStore
from fallgate.fsm.policy import Policy
from fallgate.fsm.store import Record

from helpers import chain

SMALL = chain("m0", "m1", max_attempts=2)


def test_two_concurrent_turns_keep_every_fleet_property():
    report = check_fleet(SMALL, turns=2)
    assert report.ok, report.text()
    assert set(report.to_json()["properties"].values()) == {"holds"}
    assert report.states > 500 and report.transitions > report.states
    assert "primary half-open" in report.setups and "primary budget 1 token" in report.setups


def test_three_concurrent_turns_keep_every_fleet_property():
    report = check_fleet(SMALL, turns=3)
    assert report.ok, report.text()
    assert report.turns == 3 and report.states > 10_000


def test_three_targets_keep_every_fleet_property():
    report = check_fleet(chain("m0", "m1", "m2", max_attempts=2), turns=2)
    assert report.ok, report.text()


class LeaseIgnored(HealthStore):
    """Broken: the grant hands out the probe lease whoever holds it."""

    __slots__ = ()

    def permit(self, s: Any, a: Any) -> Any:
        policy = s.policy

        def take(r: Record, now: float) -> Record | None:
            out = dict(r)
            if a.probe:
                out["lease"], out["owner"] = now + fleet.lease_for(policy), self.owner(s)
            if a.retry:
                return fleet.spend(out, policy)
            return out

        return take


def test_a_breaker_that_lets_two_probes_out_is_caught_with_a_shortest_interleaving():
    report = check_fleet(SMALL, turns=2, health_factory=LeaseIgnored)
    why, path = report.violations["one_probe_in_flight"]
    assert "both probe primary" in why
    setup = path[0][0]
    moves = [m for _, m in path]
    assert setup == "primary half-open"
    # both turns start while it is half-open, then both are let out: four steps, no fewer
    assert moves == [(0, "start"), (1, "start"), (0, "grant"), (1, "grant")]
    turns = replay_fleet(SMALL, setup, moves, health_factory=LeaseIgnored)
    probes = [t.s.action for t in turns if t is not None]
    assert all(getattr(a, "probe", False) for a in probes)
    assert {getattr(a, "target", None).name for a in probes} == {"primary"}  # type: ignore[union-attr]
    # the real store refuses the second grant on the same interleaving
    real = replay_fleet(SMALL, setup, moves)
    assert real[1] is not None and real[1].trace[-1].event == "denied"


class EndlessBudget(HealthStore):
    """Broken: a retry goes out even when the bucket is empty."""

    __slots__ = ()

    def permit(self, s: Any, a: Any) -> Any:
        policy, owner = s.policy, self.owner(s) if a.probe else ""

        def take(r: Record, now: float) -> Record | None:
            out = fleet.acquire(r, now, owner, fleet.lease_for(policy)) if a.probe else dict(r)
            if out is not None and a.retry:
                out["tokens"] = fleet.tokens(out, policy.retry_budget.size) - 1
            return out

        return take


def test_retries_beyond_the_budget_are_caught():
    policy = chain("m0", "m1", max_attempts=2, prefer_waiting=True)
    report = check_fleet(policy, turns=2, health_factory=EndlessBudget)
    why, path = report.violations["retry_budget"]
    assert "no token left" in why
    assert path[0][0] == "primary budget 1 token"
    assert check_fleet(policy, turns=2).ok


class NeverReleases(HealthStore):
    """Broken: a probe's outcome never gives its lease back (nor closes the breaker), and
    the lease never expires: the primary is lost for good."""

    __slots__ = ()

    def released(self, target: Any, owner: str, now: float = 0.0) -> None:
        pass

    def succeeded(self, target: Any, cred: str, policy: Policy, now: float = 0.0) -> None:
        pass

    def permit(self, s: Any, a: Any) -> Any:
        inner = super().permit(s, a)

        def take(r: Record, now: float) -> Record | None:
            out = inner(r, now)
            if out is not None and a.probe:
                out = {**out, "lease": 1e18}
            return out

        return take


def test_a_target_lost_for_good_is_caught():
    report = check_fleet(SMALL, turns=2, health_factory=NeverReleases)
    why, _ = report.violations["probe_within_bound"]
    assert "primary" in why


def test_the_report_states_configurations_and_seconds():
    report = check_fleet(SMALL, turns=2)
    text = report.text()
    assert "2 concurrent turns" in text and " s" in text and "configurations" in text
    for p in FLEET_PROPERTIES:
        assert f"{p}: holds" in text
    data = report.to_json()
    assert data["turns"] == 2 and data["seconds"] >= 0 and data["complete"] is True


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="turns"):
        check_fleet(SMALL, turns=9)
    with pytest.raises(ValueError, match="outcomes"):
        check_fleet(SMALL, outcomes=("sucess",))
