"""How the core handles each outcome class, across turns and within one."""

from __future__ import annotations

import pytest
from fallgate.fsm import HealthStore, Outcome, Turn
from fallgate.fsm.clock import VirtualClock
from fallgate.fsm.core.actions import Attempt, Fail
from fallgate.fsm.core.turn import ProtocolError
from fallgate.fsm.host.scripted import play
from fallgate.fsm.kinds import OutcomeKind

from helpers import chain


def test_a_429_rotates_to_the_next_free_key_of_the_same_target_before_falling_back():
    played = play(chain("m0", "m1", keys=2), ["rate_limited:5", "success"])
    assert played.targets == ["primary", "primary"]
    assert played.credentials == ["key#1", "key#2"]
    assert played.waits == ()


def test_next_turn_skips_the_key_still_cooling_from_a_429():
    health, clock = HealthStore(), VirtualClock()
    p = chain("m0", "m1", keys=2)
    play(p, ["rate_limited:30", "success"], health=health, clock=clock)
    clock.advance(5)
    nxt = play(p, ["success"], health=health, clock=clock)
    assert nxt.credentials == ["key#2"]
    clock.advance(30)
    later = play(p, ["success"], health=health, clock=clock)
    assert later.credentials == ["key#1"]  # fill_first comes back once the cooldown ends


def test_round_robin_pools_start_each_turn_on_the_next_key():
    p = chain({"model": "m", "rotation": "round_robin"}, keys=3)
    health = HealthStore()
    firsts = [play(p, ["success"], health=health).credentials[0] for _ in range(4)]
    assert firsts == ["key#1", "key#2", "key#3", "key#1"]


def test_a_rate_limit_on_a_fallback_never_benches_the_primarys_keys():
    health, clock = HealthStore(), VirtualClock()
    p = chain("m0", "m1", "m2")
    played = play(
        p,
        ["not_found", "rate_limited:100", "success"],
        health=health,
        clock=clock,
    )
    assert played.targets == ["primary", "fallback_1", "fallback_2"]
    # Exactly one credential is benched: fallback_1's only key, for its Retry-After.
    fb_key = p.targets[1].credentials[0].health_id
    assert health.snapshot()["credentials"] == {(p.targets[1].key, fb_key): clock() + 100.0}
    assert health.credential_until(p.targets[1].key, fb_key) == clock() + 100.0
    assert health.credential_until(p.targets[0].key, p.targets[0].credentials[0].health_id) == 0.0


def test_the_primary_is_restored_at_every_turn_start_once_its_cooldown_ends():
    health, clock = HealthStore(), VirtualClock()
    p = chain("m0", "m1")
    first = play(p, ["not_found", "success"], health=health, clock=clock)
    assert first.targets == ["primary", "fallback_1"]
    benched = play(p, ["success"], health=health, clock=clock)
    assert benched.targets == ["fallback_1"]
    clock.advance(p.cooldown.cap + 1)
    restored = play(p, ["success"], health=health, clock=clock)
    assert restored.targets == ["primary"]


def test_a_cooldown_never_extends_itself_while_active():
    h = HealthStore()
    assert h.open_target("t", 110.0, now=100.0) == 110.0
    assert h.open_target("t", 500.0, now=105.0) == 110.0  # still active: unchanged
    assert h.open_target("t", 500.0, now=111.0) == 500.0  # expired: a fresh cooldown
    assert h.cool_credential("t", "k", 50.0, now=0.0) == 50.0
    assert h.cool_credential("t", "k", 90.0, now=10.0) == 50.0


def test_a_short_retry_after_on_the_only_target_is_honoured_then_retried():
    played = play(chain("m0"), ["rate_limited:2", "success"], random=0.0)
    assert played.waits == (2.0,)
    assert played.targets == ["primary", "primary"]
    assert played.state == "done"


def test_a_retry_after_beyond_the_cap_fails_at_once_instead_of_sleeping():
    played = play(chain("m0", retry_after_cap=30), ["rate_limited:171"])
    assert played.waits == ()
    assert played.state == "failed"


def test_prefer_waiting_sleeps_out_a_short_retry_after_instead_of_falling_back():
    played = play(chain("m0", "m1", prefer_waiting=True), ["rate_limited:3", "success"], random=0.0)
    assert played.waits == (3.0,)
    assert played.targets == ["primary", "primary"]


def test_total_waiting_never_exceeds_the_deadline():
    p = chain("m0", deadline=5, max_attempts=10, retry_after_cap=100)
    played = play(p, ["rate_limited:3"] * 10)
    assert sum(played.waits) <= 5
    assert played.state == "failed"


def test_transport_faults_retry_then_recover_once_then_fall_back():
    played = play(chain("m0", "m1", max_attempts=5), ["transport"] * 3 + ["success"])
    # two faults -> rebuild -> one more fault after recovery -> fall back
    assert played.targets == ["primary"] * 3 + ["fallback_1"]
    assert played.rebuilds == ("primary",)


def test_a_failed_rebuild_falls_back_at_once():
    played = play(chain("m0", "m1"), ["transport", "transport", "success"], rebuild_ok=False)
    assert played.targets == ["primary", "primary", "fallback_1"]


def test_bad_request_fails_fast_without_retry_or_fallback():
    played = play(chain("m0", "m1", "m2"), ["bad_request"])
    assert played.targets == ["primary"]
    assert played.error is not None
    assert set(played.error.reasons) == {"primary", "fallback_1", "fallback_2"}
    assert "does not fall back" in played.error.reasons["fallback_1"]


def test_content_filtered_falls_back_only_when_the_policy_says_so():
    assert play(chain("m0", "m1"), ["content_filtered"]).state == "failed"
    p = chain("m0", "m1", rules={"content_filtered": {"fall_back": True}})
    assert play(p, ["content_filtered", "success"]).targets == ["primary", "fallback_1"]


def test_quota_is_never_retried_on_the_same_credential():
    played = play(chain("m0", keys=2), ["quota", "quota", "quota"])
    assert played.credentials == ["key#1", "key#2"]
    assert played.state == "failed"


def test_an_identical_chain_entry_is_skipped():
    p = chain(
        {"model": "gpt-4o", "provider": "openai"},
        {"model": "gpt-4o", "provider": "openai"},  # same provider and model as the primary
        {"model": "gpt-4o-mini", "provider": "azure"},
    )
    played = play(p, ["not_found", "success"])
    assert played.targets == ["primary", "fallback_2"]


def test_every_target_cooling_waits_for_the_soonest_when_within_the_cap():
    health, clock = HealthStore(), VirtualClock()
    p = chain("m0")
    play(p, ["rate_limited:3", "rate_limited:3", "rate_limited:3"], health=health, clock=clock)
    clock.advance(1)
    nxt = play(p, ["success"], health=health, clock=clock)
    assert nxt.path[:3] == ["idle", "primary_cooling", "primary"]
    assert nxt.waits and nxt.waits[0] <= 3


def test_feeding_an_event_the_state_does_not_declare_is_a_clear_protocol_error():
    turn = Turn(chain("m0", "m1"), health=HealthStore(), clock=VirtualClock())
    turn.start()
    with pytest.raises(ProtocolError, match="'waited' is not declared in state 'primary'"):
        turn.waited()
    assert turn.feed(Outcome.success("x")).result == "x"  # the turn is still usable


def test_cancel_from_any_live_state_ends_aborted_and_names_every_target():
    turn = Turn(chain("m0", "m1"), health=HealthStore(), clock=VirtualClock())
    turn.start()
    turn.feed(Outcome.of("transport"))
    action = turn.cancel()
    assert turn.state == "aborted"
    assert action.error.state == "aborted"
    assert set(action.error.reasons) == {"primary", "fallback_1"}


def test_a_broken_stream_is_continued_on_a_target_that_takes_a_prefix_and_never_replayed():
    """The same target when it can continue, else the next one that can; one that cannot
    (m1) is never called with the stream: no replay."""
    p = chain(
        {"model": "m0", "assistant_prefix": True},
        "m1",
        {"model": "m2", "assistant_prefix": True},
    )
    resumed = play(p, ["stream_interrupted", "success"])
    assert resumed.path == ["idle", "primary", "primary_continuing", "done"]
    moved = play(p, ["stream_interrupted", "transport", "success"])
    assert moved.targets == ["primary", "primary", "fallback_2"]  # m1 cannot continue
    assert moved.path[-2:] == ["fallback_2_continuing", "done"]
    broken = play(p, ["stream_interrupted", "transport", "bad_request"])
    assert broken.state == "failed"
    assert broken.error is not None and broken.error.partial == "partial text"
    assert broken.error.last_outcome is not None
    assert broken.error.last_outcome.kind == "stream_interrupted"  # not the last 400
    assert broken.error.reasons["fallback_1"] == "not tried: it cannot continue a broken stream"
    off = play(chain("m0", "m1", continue_streams=False), ["stream_interrupted"])
    assert off.targets == ["primary"] and off.state == "failed"


def test_a_turn_may_start_further_down_the_chain_and_says_why_earlier_entries_were_not_used():
    policy = chain("m0", "m1", "m2")
    turn = Turn(policy, health=HealthStore(), first=1)
    a = turn.start()
    assert isinstance(a, Attempt) and a.target.name == "fallback_1"
    turn.feed(Outcome(OutcomeKind.NOT_FOUND))
    action = turn.feed(Outcome(OutcomeKind.BAD_REQUEST))
    assert isinstance(action, Fail)
    assert action.error.reasons["primary"] == "not in this turn's chain (it starts at fallback_1)"
    assert [e.target for e in turn.trace if e.target] == ["fallback_1", "fallback_2", "fallback_2"]
    with pytest.raises(ValueError, match=r"first must be a chain position 0\.\.2, got 3"):
        Turn(policy, first=3)
