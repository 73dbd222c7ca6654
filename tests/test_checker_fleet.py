"""The checker on concurrent turns: every interleaving of 2 (and 3) turns on one shared
health store; the new properties hold for the real store, and deliberately broken stores
are caught with a shortest interleaving that replays."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from fallgate.fsm.checker.interleave import FLEET_PROPERTIES, check_fleet, replay_fleet
from fallgate.fsm.health import records as fleet
from fallgate.fsm.health.backend import Record
from fallgate.fsm.health.store import HealthStore
from fallgate.fsm.policy.model import Policy

from helpers import chain

SMALL = chain("m0", "m1", max_attempts=2)


def test_two_concurrent_turns_keep_every_fleet_property():
    report = check_fleet(SMALL, turns=2)
    assert report.ok, report.text()
    assert set(report.to_json()["properties"].values()) == {"holds"}
    assert report.states > 500 and report.transitions > report.states
    assert "primary half-open" in report.setups and "primary budget 1 token" in report.setups
    assert "primary half-open after a long outage" in report.setups


@pytest.mark.slow  # every interleaving of three turns (two: test_cli)
def test_three_concurrent_turns_keep_every_fleet_property():
    report = check_fleet(SMALL, turns=3)
    assert report.ok, report.text()
    assert report.turns == 3 and report.states > 10_000


def test_a_turn_refused_by_the_breaker_waits_for_its_verdict_and_every_property_holds():
    """One target: a turn whose attempt another turn's report refused (its breaker open,
    or its probe out) has no fallback, so it waits for the verdict; the interleavings
    take that wait and every fleet property (one probe at a time, the budget) holds."""
    from fallgate.fsm.core import guards

    taken = []
    run = guards.WAIT_VERDICT.run

    def counted(s: Any, arg: int) -> Any:
        taken.append(s.state)
        return run(s, arg)

    object.__setattr__(guards.WAIT_VERDICT, "run", counted)
    try:
        report = check_fleet(chain("m0", max_attempts=2), turns=2)
    finally:
        object.__setattr__(guards.WAIT_VERDICT, "run", run)
    assert report.ok, report.text()
    assert taken and set(taken) == {"primary_cooling"}


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


class DoublesWithoutBound(HealthStore):
    """Broken (the rule before ``breaker.max_open``): each failed probe reopens the
    breaker for the doubling cooldown, up to ``cooldown.cap`` (300 s): a recovered
    backend waits minutes for its next probe."""

    __slots__ = ()

    def failed(self, target: Any, now: float, policy: Policy, *args: Any, **kw: Any) -> Any:
        breaker = attrs.evolve(policy.breaker, max_open=policy.cooldown.cap)
        return super().failed(target, now, attrs.evolve(policy, breaker=breaker), *args, **kw)


def test_a_breaker_whose_span_doubles_without_bound_is_caught():
    """The starting store after a long outage (the primary reopened many times, now
    half-open): one failed probe reopens it for 300 s, past the bound of the longest own
    span (``max_open``, 20 s) and one lease; the real store reopens it for 20 s."""
    report = check_fleet(SMALL, turns=2, health_factory=DoublesWithoutBound)
    why, path = report.violations["probe_within_bound"]
    assert "cannot be probed for 300 s (bound 81 s)" in why, why
    assert path[0][0] == "primary half-open after a long outage"
    assert [m for _, m in path] == [(0, "start"), (0, "grant"), (0, "overloaded")]
    real = replay_fleet(SMALL, path[0][0], [m for _, m in path])
    assert real[0] is not None
    assert real[0].s.health.target_until(SMALL.targets[0].key) - real[0].s.at == 20.0


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


def _one_target_run(turns: int, store: HealthStore | None = None) -> Any:
    from fallgate.fsm.checker.interleave import OUTCOMES, FleetRun

    policy = Policy.from_dict(
        {
            "primary": {
                "provider": "p0",
                "model": "m0",
                "base_url": "https://p0.test/v1",
                "api_key": "sk-test-0000000000000000",
            },
            "max_attempts": 1,
            "attempt_timeout": 1.0,
            "cooldown": {"initial": 1.0, "multiplier": 2.0, "cap": 20.0},
            "breaker": {"allowed_failures": 1, "window": 1.0},
            "retry_budget": {"size": 1, "refill": 0.0},
        }
    )
    return FleetRun(policy, turns, store or HealthStore(), OUTCOMES)


def test_no_wait_ends_after_a_probe_in_flight_would_be_back():
    """A probe in flight comes back by its timeout (the drivers' hard bound), so another
    turn's wait for the probe lease cannot end before it has: the model once let it, and
    reported two probes at once that the engine can only send if an attempt outlives its
    bound."""
    run = _one_target_run(2)
    for move in [(0, "start"), (0, "grant"), (0, "overloaded")] * 2:
        run.step(move)  # two failures: the breaker opens
    for move in [(1, "start"), (1, "waited"), (1, "grant"), (0, "start")]:
        run.step(move)  # turn 2 probes the half-open primary; turn 1 waits for its lease
    assert run.config.inflight[1] and (0, "waited") not in run.moves()
    run.step((1, "success"))
    assert (0, "waited") in run.moves()
    run.step((0, "waited"))
    assert not run.violations


def test_time_stands_still_while_an_attempt_awaits_its_grant():
    """A host asks the store's grant the moment its turn decides an attempt: no time
    passes in between, in the fuzzers' model either."""
    run = _one_target_run(2)
    run.step((0, "start"))
    before = run.config.clock.t
    run.advance(5.0)
    assert run.config.clock.t == before
    run.step((0, "grant"))
    run.advance(5.0)
    assert run.config.clock.t == before + 1.0  # no further than the attempt's timeout
