"""Why a target did not answer: a failure report names each cooldown's real cause.

A turn that sends nothing because every target is cooling used to say "not tried:
turn start does not fall back (policy)" for each; the health store now remembers a
short safe cause (outcome kind and HTTP status, never the provider's words) with each
cooldown, and every reason for a cooling target says for how long and after what.
"""

from __future__ import annotations

import re

import openai
import pytest
from fallgate.fsm import HealthStore, Outcome, VirtualClock
from fallgate.fsm.host.scripted import play
from fallgate.fsm.kinds import OutcomeKind

from fallgate import Fallgate, TurnFailed

from helpers import KEY_PREFIX, chain


def _quota_402() -> Outcome:
    return Outcome(
        OutcomeKind.QUOTA,
        status=402,
        retry_after=170,
        detail="insufficient credits for sk-live-secret-words",
    )


def _rate_limited(seconds: float) -> Outcome:
    return Outcome(OutcomeKind.RATE_LIMITED, status=429, retry_after=seconds)


def test_a_turn_that_sends_nothing_names_each_targets_cooldown_and_what_started_it():
    health, clock = HealthStore(), VirtualClock()
    p = chain("m0", "m1")
    first = play(p, [_quota_402(), _rate_limited(200)], health=health, clock=clock)
    assert first.state == "failed"
    clock.advance(10)
    second = play(p, [], health=health, clock=clock)
    assert second.calls == ()
    assert second.error is not None
    reasons = second.error.reasons
    assert reasons["primary"] == (
        "skipped at turn start: cooling for 160.0s after quota (HTTP 402) on key#1"
    )
    assert reasons["fallback_1"] == (
        "skipped at turn start: cooling for 190.0s after rate_limited (HTTP 429) on key#1"
    )
    assert "does not fall back" not in str(second.error)


def test_a_cause_holds_the_outcome_kind_and_status_never_the_providers_words():
    health, clock = HealthStore(), VirtualClock()
    p = chain("m0")
    play(p, [_quota_402()], health=health, clock=clock)
    cause = health.cause(p.targets[0].key, p.targets[0].credentials[0].health_id)
    assert cause == "quota (HTTP 402)"
    again = play(p, [], health=health, clock=clock)
    assert again.error is not None
    assert "insufficient credits" not in str(again.error.reasons)
    assert "sk-live" not in str(again.error)


def test_a_benched_target_names_the_hard_failure_that_benched_it():
    health, clock = HealthStore(), VirtualClock()
    p = chain("m0", "m1", retry_after_cap=10)
    busy = Outcome(OutcomeKind.OVERLOADED, status=503, retry_after=100)
    play(p, [busy, _rate_limited(60)], health=health, clock=clock)
    again = play(p, [], health=health, clock=clock)
    assert again.error is not None
    assert again.error.reasons["primary"] == (
        "skipped at turn start: cooling for 100.0s after overloaded (HTTP 503)"
    )


def test_a_fallback_skipped_mid_turn_says_why_it_is_cooling():
    health, clock = HealthStore(), VirtualClock()
    p = chain("m0", "m1", "m2")
    play(p, [Outcome.of("not_found"), _rate_limited(50), Outcome.success("x")], health=health,
         clock=clock)  # fmt: skip
    clock.advance(6)  # the primary's 5 s cooldown is over, fallback_1's key is not
    later = play(p, [Outcome.of("not_found", status=404), Outcome.of("bad_request")],
                 health=health, clock=clock)  # fmt: skip
    assert later.targets == ["primary", "fallback_2"]
    assert later.error is not None
    assert later.error.reasons["fallback_1"] == (
        "skipped: cooling for 44.0s after rate_limited (HTTP 429) on key#1"
    )


def test_with_several_keys_the_reason_names_the_first_key_to_free_up():
    health, clock = HealthStore(), VirtualClock()
    p = chain("m0", keys=2)
    play(p, [_rate_limited(300), _rate_limited(200)], health=health, clock=clock)
    again = play(p, [], health=health, clock=clock)
    assert again.error is not None
    assert again.error.reasons["primary"] == (
        "skipped at turn start: cooling for 200.0s after rate_limited (HTTP 429) "
        "on key#2, the first of its 2 keys to free up"
    )


def test_a_running_cooldown_keeps_its_first_cause_and_a_success_forgets_it():
    health = HealthStore()
    health.open_target("t", 100.0, 0.0)
    health.note_cause("t", "overloaded (HTTP 503)", 100.0)
    health.open_target("t", 500.0, 1.0)  # never extended...
    health.note_cause("t", "not_found (HTTP 404)", 500.0)  # ...nor given another cause
    assert (health.target_until("t"), health.cause("t")) == (100.0, "overloaded (HTTP 503)")
    health.cool_credential("t", "key#1", 50.0, 0.0)
    health.note_cause("t", "auth (HTTP 401)", 50.0, "key#1")
    assert health.cause("t", "key#1") == "auth (HTTP 401)"
    health.succeeded("t", "key#1", chain("m0"))
    assert health.cause("t") is None and health.cause("t", "key#1") is None
    health.open_target("t", 900.0, 200.0)  # a later cooldown noted without a cause...
    assert health.cause("t") is None  # ...never borrows an old one


def test_the_real_sdk_turn_that_sends_nothing_reports_the_402_and_the_429(fault_server):
    fault_server.script(
        {
            "models": {
                "m0": [{"kind": "status", "status": 402, "headers": {"retry-after": "170"},
                        "body": {"error": {"message": "Insufficient credits", "code": 402}}}],
                "m1": [{"kind": "status", "status": 429, "headers": {"retry-after": "200"}}],
            }
        }
    )  # fmt: skip
    policy = chain("m0", "m1", server=fault_server)
    clock = VirtualClock()
    with Fallgate(policy, clock=clock) as client:
        with pytest.raises(TurnFailed):
            client.chat.completions.create(messages=[{"role": "user", "content": "hi"}])
        requests = len(fault_server.requests)
        clock.advance(20)
        with pytest.raises(TurnFailed) as failed:
            client.chat.completions.create(messages=[{"role": "user", "content": "hi"}])
    assert len(fault_server.requests) == requests  # nothing was sent
    text = str(failed.value)
    assert re.search(
        r"primary: skipped at turn start: cooling for \d+\.\ds after quota \(HTTP 402\)", text
    )
    assert (
        "fallback_1: skipped at turn start: cooling for 180.0s after rate_limited (HTTP 429)"
        in text
    )
    assert "does not fall back" not in text
    assert KEY_PREFIX not in text
    assert not isinstance(failed.value.last_error, openai.APIError)  # nothing was tried
