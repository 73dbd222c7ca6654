"""Time never runs backwards for the engine: a clock that steps back is read as no time
passing (`fsm.clock.steady`), so it can neither stretch a cooldown nor a deadline."""

from __future__ import annotations

import math

import pytest
from fallgate.fsm import HealthStore, TurnFailed, drive, run
from fallgate.fsm.clock import SYSTEM, SteadyClock, VirtualClock, steady

from helpers import chain


class JumpyClock:
    """A clock of the caller's own whose time can be set, backwards too (an NTP step, a
    wall clock, a container restored from a snapshot). Sleeps advance it."""

    def __init__(self, t: float = 10_000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    async def asleep(self, seconds: float) -> None:
        self.t += seconds


class HTTPError(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code
        self.headers: dict[str, str] = {}


def test_a_clock_stepping_back_an_hour_does_not_stretch_a_5s_cooldown():
    """The primary fails hard (503) and its breaker opens on the first hard failure
    (allowed_failures 0): it cools for 5 s (cooldown.initial). The clock then
    steps back an hour: the next turn still sees 5 s of cooling, not 3,605 s, and once
    5 s have passed the primary is used again."""
    policy = chain(
        "a",
        "b",
        cooldown={"initial": 5, "multiplier": 2, "cap": 300},
        breaker={"allowed_failures": 0},
    )
    health, clock = HealthStore(), JumpyClock()
    broken = {"a"}

    def call(target, credential):
        if target.model in broken:
            raise HTTPError(503)
        return target.model

    first = run(policy, call, health=health, clock=clock)
    assert first.value == "b"
    clock.t -= 3600
    second = run(policy, call, health=health, clock=clock)
    assert second.value == "b"
    assert next(e for e in second.trace if e.event == "start").dest == "fallback_1"
    broken.clear()  # the primary is healthy again; 5 s pass
    clock.t += 5
    third = run(policy, call, health=health, clock=clock)
    assert third.value == "a", "the 5 s cooldown outlasted 5 s of forward time"


def test_the_reason_for_a_cooling_target_counts_forward_time_only():
    policy = chain(
        "a",
        "b",
        max_attempts=1,
        cooldown={"initial": 5, "multiplier": 2, "cap": 300},
        breaker={"allowed_failures": 0},
    )
    health, clock = HealthStore(), JumpyClock()

    def fail_a(target, credential):
        if target.model == "a":
            raise HTTPError(503)
        raise HTTPError(400)

    with pytest.raises(TurnFailed):
        run(policy, fail_a, health=health, clock=clock)
    clock.t -= 3600
    with pytest.raises(TurnFailed) as err:
        run(policy, fail_a, health=health, clock=clock)
    assert err.value.reasons["primary"].startswith("skipped at turn start: cooling for 5.0s")


def test_a_clock_stepping_back_mid_turn_does_not_lengthen_the_deadline():
    """Deadline 10 s, attempts of 8 s that each run 6 s (or to their timeout). The first
    takes 6 s; while the second runs the clock steps back 40 s: that interval counts as
    no time, so the third attempt still gets only the 4 s the deadline leaves (the old
    core read -30 s elapsed and gave it 8), and the turn then ends."""
    policy = chain("a", deadline=10, attempt_timeout=8, backoff={"initial": 0.0})
    clock = JumpyClock()
    timeouts: list[float] = []

    def attempt(a):
        timeouts.append(a.timeout)
        if len(timeouts) == 2:
            clock.t -= 40
        clock.t += min(6.0, a.timeout)
        raise TimeoutError("cut at the attempt's timeout")

    with pytest.raises(TurnFailed) as err:
        drive(policy, attempt, clock=clock, health=HealthStore())
    assert timeouts == [8, pytest.approx(4.0), pytest.approx(4.0)]
    assert "deadline" in str(err.value)


def test_steady_reads_forward_steps_and_ignores_steps_back():
    clock = JumpyClock(100.0)
    s = SteadyClock(clock)
    seen = []
    for t in (100.0, 50.0, 60.0, 200.0, math.nan, 210.0, -math.inf, 215.0):
        clock.t = t
        seen.append(s.now())
    assert seen == [100.0, 100.0, 110.0, 250.0, 250.0, 260.0, 260.0, 265.0]


def test_steady_shares_one_view_per_clock_and_leaves_monotonic_clocks_alone():
    """Every turn on one clock must agree on the time (cooldowns cross turns)."""
    jumpy = JumpyClock()
    assert steady(jumpy) is steady(jumpy)
    assert isinstance(steady(jumpy), SteadyClock)
    assert steady(SYSTEM) is SYSTEM
    v = VirtualClock()
    assert steady(v) is v
