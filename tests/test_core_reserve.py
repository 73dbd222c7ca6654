"""The time reserve at the core: a silent primary leaves its fallback time to answer.

Scripted outcomes on virtual time (`fsm.host.scripted.play`): ``"silent"`` is an
attempt that takes its whole timeout and ends as a transport fault, the most common
real outage (a provider that accepts the request and never answers).
"""

from __future__ import annotations

import functools

import pytest
from fallgate.fsm.clock import VirtualClock
from fallgate.fsm.core.guards import GUARDS, TRANSPORT_RETRY, unreserved
from fallgate.fsm.core.machine import declare
from fallgate.fsm.core.turn import TransitionsTurn, Turn
from fallgate.fsm.errors import PolicyError
from fallgate.fsm.host.scripted import play
from fallgate.fsm.policy.model import Policy

from helpers import chain

ENGINES = [Turn, TransitionsTurn]


def _elapsed(clock: VirtualClock, start: float) -> float:
    return clock.now() - start


@pytest.mark.parametrize("engine", ENGINES)
def test_a_silent_primary_with_the_default_knobs_is_left_for_the_fallback(engine):
    """Defaults (60 s attempts, 180 s deadline): after the first 60 s timeout a retry's
    worst case (backoff + 60 s) would leave the fallback less than its 60 s, a rebuild's
    (60 s) just leaves it; after the rebuilt client's timeout the fallback is asked
    with its whole 60 s (on main: failed at the deadline, the fallback never asked)."""
    policy = chain("m0", "m1")
    clock = VirtualClock()
    t0 = clock.now()
    played = play(policy, ["silent", "silent", "success"], clock=clock, engine=engine)
    assert played.state == "done"
    assert played.targets == ["primary", "primary", "fallback_1"]
    assert played.rebuilds == ("primary",)
    assert _elapsed(clock, t0) == pytest.approx(120.0)
    assert played.calls[1].timeout == 60.0  # the fallback got a whole attempt


@pytest.mark.parametrize("engine", ENGINES)
def test_a_silent_primary_with_small_knobs_reaches_the_fallback_inside_the_deadline(engine):
    """The issue's 1 s / 2.5 s row (3 primary requests, 0 fallback, 3.22 s on main)."""
    policy = chain("m0", "m1", attempt_timeout=1, deadline=2.5)
    clock = VirtualClock()
    t0 = clock.now()
    played = play(policy, ["silent", "success"], clock=clock, engine=engine)
    assert played.targets == ["primary", "fallback_1"]
    assert played.state == "done"
    assert _elapsed(clock, t0) <= 2.5


@pytest.mark.parametrize(
    ("deadline", "primary_attempts"),
    [(2.5, 1), (3.0, 2), (3.5, 2), (4.0, 2), (4.5, 3), (5.0, 3)],
)
def test_the_primary_is_retried_exactly_while_its_worst_case_leaves_the_fallback_an_attempt(
    deadline, primary_attempts
):
    """1 s attempts, a 0.5 s backoff ceiling (full jitter drawn at its top). After the
    first timeout (t = 1) a retry needs 1 + 0.5 + 1 + 1 (the fallback's attempt) = 3.5 s,
    else the recovery (no wait) 1 + 1 + 1 = 3 s; after the second (t = 2.5) the recovery
    needs 4.5 s; after a recovered attempt the primary is left. The fallback is
    attempted in every row, with a whole attempt's time."""
    policy = chain("m0", "m1", attempt_timeout=1, deadline=deadline)
    played = play(policy, ["silent"] * primary_attempts + ["success"])
    assert played.targets == ["primary"] * primary_attempts + ["fallback_1"], played.path
    assert played.state == "done"
    assert played.calls[-1].timeout == 1.0


def test_without_a_fallback_the_reserve_keeps_nothing_and_the_primary_is_retried():
    policy = chain("m0", attempt_timeout=1, deadline=2.5)
    played = play(policy, ["silent", "success"])
    assert played.targets == ["primary", "primary"]
    assert played.state == "done"


def test_reserve_false_is_the_old_engine_that_spends_the_deadline_on_the_primary():
    policy = chain("m0", "m1", attempt_timeout=1, deadline=2.5, reserve=False)
    played = play(policy, ["silent"] * 2)
    assert played.state == "failed"
    assert played.targets == ["primary", "primary"]
    assert played.error is not None
    assert "the 2.5s deadline had passed" in str(played.error)


def test_the_unreserved_guards_are_the_same_broken_engine():
    """What the checker's mutation proof swaps in: every reserved guard's `base`."""
    swapped = unreserved()
    assert TRANSPORT_RETRY in swapped and swapped[TRANSPORT_RETRY] is TRANSPORT_RETRY.base
    assert {g.name for g in swapped} == {
        "transport_retry",
        "can_recover",
        "server_retry",
        "can_rotate",
        "can_wait",
        "await_verdict",
        "await_verdict_after",
        "continue_here",
        "pace_wait",
    }
    policy = chain("m0", "m1", attempt_timeout=1, deadline=2.5)
    broken = functools.partial(Turn, guards=swapped)
    played = play(policy, ["silent"] * 3 + ["success"], engine=broken)  # type: ignore[arg-type]
    assert played.state == "failed"
    assert "fallback_1" not in played.targets  # the fallback was never asked


@pytest.mark.parametrize("reserve", [5, 0.5, 0, False, "one_attempt"])
def test_the_reserve_knob_takes_seconds_false_or_one_attempt(reserve):
    policy = chain("m0", "m1", attempt_timeout=4, reserve=reserve)
    expected = {False: 0.0, "one_attempt": 4.0}.get(reserve, reserve)  # type: ignore[call-overload]
    assert policy.reserve_for(policy.targets[1]) == expected
    assert policy.attempt_bound(policy.targets[1]) == 4.0


def test_a_reserve_in_seconds_sizes_what_a_retry_must_leave():
    """10 s attempts, 25 s deadline: one attempt (10 s) of reserve allows no retry after
    a 10 s timeout (10 + 0.5 + 10 + 10 > 25); a 2 s reserve does (22.5 <= 25)."""
    big = play(chain("m0", "m1", attempt_timeout=10, deadline=25), ["silent", "success"])
    assert big.targets == ["primary", "fallback_1"]
    small = play(
        chain("m0", "m1", attempt_timeout=10, deadline=25, reserve=2),
        ["silent", "silent", "success"],
    )
    assert small.targets == ["primary", "primary", "fallback_1"]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("two", "reserve = 'two': must be \"one_attempt\", a number of seconds >= 0, or false"),
        (True, 'reserve = True: must be "one_attempt"'),
        (-1, "reserve = -1: must be a finite number of seconds >= 0"),
        (1e9, "reserve = 1000000000.0: must be at most 86400 seconds"),
    ],
)
def test_a_bad_reserve_is_refused_naming_the_field(value, why):
    with pytest.raises(PolicyError) as e:
        chain("m0", "m1", reserve=value)
    assert why in str(e.value)


def test_a_bad_reserve_in_a_file_names_the_line(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text(
        'deadline = 60\nreserve = "lots"\n[primary]\nprovider = "openai"\nmodel = "m"\n'
        'api_key = "sk-test-123456"\n'
    )
    with pytest.raises(PolicyError) as e:
        Policy.from_toml(f)
    assert str(f) in str(e.value)
    assert "line 2: reserve = 'lots': must be" in str(e.value)


def test_every_stay_label_says_what_it_keeps_and_the_fallback_edges_do_not():
    decl = declare(chain("m0", "m1", keys=2, attempt_timeout=20, deadline=90))
    labels = {t.guard.name: t.label(decl.policy) for t in decl.edges() if t.guard is not None}
    words = "then ≤20s more leaves the next target an attempt"
    reserved = [g for g in GUARDS if g.base is not None]
    # continuation's guard is declared only for targets that take an assistant prefix
    assert {g.name for g in reserved} - set(labels) <= {"continue_here"}
    for g in reserved:
        if g.name in labels:
            assert words in labels[g.name], labels[g.name]
    assert words not in labels["next_is"]
    off = declare(chain("m0", "m1", reserve=False))
    assert any("leaves no reserve" in t.label(off.policy) for t in off.edges() if t.guard)
