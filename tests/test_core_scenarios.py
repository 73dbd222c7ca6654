"""The regression scenarios of docs/design.md, on the pure core.

Each test scripts the outcomes an attempt produces and asserts the exact
sequence of targets called and the final state.
"""

from __future__ import annotations

import pytest
from fallgate.fsm import HealthStore, Turn
from fallgate.fsm.clock import VirtualClock
from fallgate.fsm.core.turn import TransitionsTurn
from fallgate.fsm.host.scripted import play

from helpers import chain

ENGINES = [Turn, TransitionsTurn]


@pytest.mark.parametrize("engine", ENGINES)
def test_scenario_1_a_429_after_timeouts_and_recovery_still_reaches_the_fallback(engine):
    """The original bug: after an earlier failed fallback activation, timeouts and a
    successful client rebuild, a 429 must still fall back."""
    policy = chain("glm-5.1", "glm-4.7", max_attempts=2)
    health, clock = HealthStore(), VirtualClock()
    # An earlier turn: the primary was rate limited, the eager fallback's client could
    # not be built (transport faults, then the rebuild failed too).
    earlier = play(
        policy,
        ["rate_limited:1", "transport", "transport"],
        health=health,
        clock=clock,
        rebuild_ok=False,
        engine=engine,
    )
    assert earlier.models == ["glm-5.1", "glm-4.7", "glm-4.7"]
    assert earlier.rebuilds == ("fallback_1",)
    assert earlier.state == "failed"
    clock.advance(60)  # some time later, the primary's rate limit has lifted

    played = play(
        policy,
        ["transport", "transport", "rate_limited", "success"],
        health=health,
        clock=clock,
        engine=engine,
    )

    assert played.models == ["glm-5.1", "glm-5.1", "glm-5.1", "glm-4.7"]
    assert played.rebuilds == ("primary",)
    assert played.path == [
        "idle",
        "primary",
        "primary_transport_backoff",
        "primary",
        "primary_recovering",
        "primary",
        "fallback_1",
        "done",
    ]
    assert played.state == "done"


@pytest.mark.parametrize("engine", ENGINES)
def test_scenario_2_long_retry_after_on_primary_is_answered_by_the_fallback_without_sleeping(
    engine,
):
    played = play(chain("gpt-4o", "claude"), ["rate_limited:171", "success"], engine=engine)
    assert played.models == ["gpt-4o", "claude"]
    assert played.waits == ()
    assert played.state == "done"


@pytest.mark.parametrize("engine", ENGINES)
def test_scenario_3_a_403_on_fallback_1_goes_on_to_fallback_2(engine):
    played = play(chain("a", "b", "c"), ["not_found", "auth", "success"], engine=engine)
    assert played.models == ["a", "b", "c"]
    assert played.state == "done"


@pytest.mark.parametrize("engine", ENGINES)
def test_scenario_4_three_503s_with_three_attempts_fall_back_instead_of_failing(engine):
    # A free fallback is taken at once: no sleeping while one is available now.
    played = play(chain("a", "b", max_attempts=3), ["overloaded", "success"], engine=engine)
    assert played.models == ["a", "b"]
    assert played.waits == ()
    assert played.state == "done"
    # Preferring to wait: every attempt with backoff, and still the fallback, never `failed`.
    patient = play(
        chain("a", "b", max_attempts=3, prefer_waiting=True),
        ["overloaded"] * 3 + ["success"],
        engine=engine,
    )
    assert patient.models == ["a", "a", "a", "b"]
    assert len(patient.waits) == 2  # backoff between the three attempts, none before fallback
    assert patient.state == "done"
    # No fallback free: the same backoff on the only target.
    alone = play(chain("a", max_attempts=3), ["overloaded"] * 3, engine=engine)
    assert alone.models == ["a", "a", "a"]
    assert alone.state == "failed"


@pytest.mark.parametrize("engine", ENGINES)
def test_scenario_5_persistent_401_on_a_one_key_pool_falls_back_after_one_attempt(engine):
    played = play(chain("a", "b"), ["auth", "success"], engine=engine)
    assert played.models == ["a", "b"]
    alone = play(chain("a"), ["auth"] * 50, engine=engine)
    assert alone.models == ["a"]  # never a tight loop
    assert alone.state == "failed"
    assert "auth" in str(alone.error)


@pytest.mark.parametrize("engine", ENGINES)
def test_scenario_5b_persistent_401_rotates_through_each_key_once_then_falls_back(engine):
    played = play(chain("a", "b", keys=3), ["auth"] * 3 + ["success"], engine=engine)
    assert played.targets == ["primary"] * 3 + ["fallback_1"]
    assert played.credentials[:3] == ["key#1", "key#2", "key#3"]


@pytest.mark.parametrize("engine", ENGINES)
def test_scenario_6_context_too_long_skips_the_smaller_fallback(engine):
    policy = chain("big@8192", "small@4096", "huge@128000")
    played = play(policy, ["context_too_long", "success"], engine=engine)
    assert played.models == ["big", "huge"]
    assert played.state == "done"
    failing = play(chain("big@8192", "small@4096"), ["context_too_long"], engine=engine)
    assert failing.state == "failed"
    assert failing.error is not None
    assert "context_length 4096 <= 8192" in failing.error.reasons["fallback_1"]


@pytest.mark.parametrize("engine", ENGINES)
def test_scenario_7_a_stream_broken_after_delivery_fails_with_the_partial_text(engine):
    played = play(chain("a", "b"), ["stream_interrupted", "success"], engine=engine)
    assert played.models == ["a"]  # no retry, no fallback: the stream was committed
    assert played.state == "failed"
    assert played.error is not None and played.error.partial == "partial text"
