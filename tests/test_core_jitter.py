"""Jitter survives: retries after a fault, and turns waiting on one cooldown, spread out;
a target whose network path keeps failing is benched.

Each test here failed on the engine before these rules: transport backoff counted
from the start of the failed attempt (an attempt that took longer than the backoff
ceiling retried after exactly 0 s: with the default policy and a 0.5 s timeout,
every retry of a burst of turns went out at the same instant), a wait for a cooldown
or Retry-After ended exactly at its end for every turn waiting on it, and transport
faults never benched a target (each turn of a sustained outage paid for it again).
"""

from __future__ import annotations

import random

import pytest
from fallgate.fsm import HealthStore, Turn, VirtualClock
from fallgate.fsm.core.actions import Attempt, Wait
from fallgate.fsm.host.scripted import play
from fallgate.fsm.kinds import Outcome
from fallgate.fsm.policy.backoff import exp_cap, wake_spread

from helpers import chain

TURNS = 1000


@pytest.mark.parametrize("attempt_seconds", [0.0, 0.2, 0.5, 1.0, 10.0])
@pytest.mark.parametrize("draw", [0.0, 0.3, 0.999])
def test_a_transport_retry_waits_the_drawn_share_of_the_backoff_however_long_the_attempt_took(
    attempt_seconds, draw
):
    """The wait after a failed attempt is the injected draw times the backoff ceiling,
    counted from the fault: how long the attempt took does not erase it."""
    p = chain("m0", "m1")
    played = play(p, ["transport", "success"], random=draw, attempt_seconds=attempt_seconds)
    assert played.waits == (pytest.approx(draw * p.backoff.initial),)
    assert [a.target.name for a in played.calls] == ["primary", "primary"]


def test_a_burst_of_timeouts_retries_spread_out_not_at_one_instant():
    """1,000 turns time out together (0.5 s attempts, the default policy): their retries
    leave at 1,000 different instants over the first backoff, none at the fault's
    instant (the engine draws from the injected source, it never draws itself)."""
    p = chain("m0", attempt_timeout=0.5)
    rng = random.Random(14)
    health = HealthStore()
    clock = VirtualClock(start=100.0)
    turns = [Turn(p, health=health, clock=clock.now, random=rng.random) for _ in range(TURNS)]
    assert all(isinstance(t.start(), Attempt) for t in turns)
    clock.advance(0.5)  # every attempt timed out
    waits = []
    for turn in turns:
        action = turn.feed(Outcome.of("transport"))
        assert isinstance(action, Wait)
        waits.append(action.seconds)
    assert len(set(waits)) == TURNS
    assert all(0.0 < w <= p.backoff.initial for w in waits)
    within_126ms = sum(w <= 0.126 for w in waits)
    assert within_126ms < TURNS * 0.35  # uniform over 0.5 s: about a quarter


@pytest.mark.parametrize("how", ["turn start, every target cooling", "a rate-limited key"])
def test_turns_waiting_on_one_cooldown_wake_spread_out_never_before_its_end(how):
    """1,000 turns wait for the same cooldown end: each wakes at or after it, within the
    documented spread (a tenth of the wait, at least backoff.initial, at most
    backoff.cap), and they do not wake together."""
    p = chain("m0", retry_after_cap=30)
    rng = random.Random(4)
    health = HealthStore()
    clock = VirtualClock(start=1000.0)
    end = clock.now() + 20.0
    if how.startswith("turn start"):
        health.open_target(p.targets[0].key, end, clock.now())
    wakes = []
    for _ in range(TURNS):
        if how == "a rate-limited key":  # each turn got the same 429 at the same instant
            health = HealthStore()
        turn = Turn(p, health=health, clock=clock.now, random=rng.random)
        action = turn.start()
        if how == "a rate-limited key":
            assert isinstance(action, Attempt)
            action = turn.feed(Outcome.of("rate_limited", retry_after=20.0))
        assert isinstance(action, Wait), action
        wakes.append(clock.now() + action.seconds)
    spread = wake_spread(p.backoff, 20.0)
    assert spread == 2.0
    assert all(end <= w <= end + spread + 1e-9 for w in wakes)
    assert sum(w <= end + 0.126 for w in wakes) < TURNS * 0.15  # was every one of them
    assert max(wakes) - min(wakes) > spread * 0.9


def test_the_wake_spread_never_breaks_the_cap_or_the_deadline():
    """A Retry-After just under the cap is waited out, spread within the cap; near the
    deadline the spread shrinks to what is left."""
    p = chain("m0", retry_after_cap=30)
    assert play(p, ["rate_limited:29.9", "success"]).waits == (pytest.approx(30.0),)
    tight = chain("m0", retry_after_cap=30, deadline=21)
    assert play(tight, ["rate_limited:20", "success"]).waits == (pytest.approx(21.0),)
    off = chain("m0", retry_after_cap=30, backoff={"jitter": False})
    assert play(off, ["rate_limited:20", "success"]).waits == (20.0,)


def test_a_primary_whose_network_keeps_failing_is_benched_after_two_turns():
    """A sustained transport outage of the primary: the first two turns pay for it
    (3 attempts each, then the fallback answers); from the third on, turns skip the
    benched primary and ask the fallback at once, until its cooldown ends (a breaker that
    allows one failed turn: the default allows two)."""
    p = chain("m0", "m1", breaker={"allowed_failures": 1})
    health = HealthStore()
    clock = VirtualClock(start=0.0)
    down = ["transport", "transport", "transport", "success"]
    for _ in range(2):
        played = play(p, down, health=health, clock=clock, random=0.0)
        assert [a.target.name for a in played.calls] == ["primary"] * 3 + ["fallback_1"]
        clock.advance(1.0)
    for _ in range(3):  # the breaker opened at t=1 for 5 s: turns at 2, 3, 4 skip it
        played = play(p, ["success"], health=health, clock=clock, random=0.0)
        assert [a.target.name for a in played.calls] == ["fallback_1"]
        clock.advance(1.0)
    bench = exp_cap(p.cooldown.initial, p.cooldown.multiplier, p.cooldown.cap, 0)  # 1st opening
    clock.advance(bench)
    played = play(p, down, health=health, clock=clock, random=0.0)
    assert played.calls[0].target.name == "primary"  # probed again once the bench ends


def test_one_turn_of_transport_faults_does_not_bench_the_target():
    """Regression scenario 1: a client that could not be built for a moment must not
    bench its target; only a second turn in a row does."""
    p = chain("m0", "m1")
    health = HealthStore()
    clock = VirtualClock(start=0.0)
    play(p, ["transport", "transport", "transport", "success"], health=health, clock=clock)
    assert health.target_until(p.targets[0].key) == 0.0
    played = play(p, ["success"], health=health, clock=clock)
    assert played.calls[0].target.name == "primary"


def test_transport_cooldown_off_keeps_calling_the_target():
    p = chain("m0", "m1", rules={"transport": {"cooldown": False}})
    health = HealthStore()
    for _ in range(3):
        played = play(p, ["transport"] * 3 + ["success"], health=health)
        assert played.calls[0].target.name == "primary"
    assert health.target_until(p.targets[0].key) == 0.0
