"""An empty retry budget trips the breaker instead of failing a turn that has time.

The budget sheds load before the breaker has opened. A turn whose retry it refuses, with
no eligible fallback and time left, opens the breaker for its first span and waits for
its verdict, as a turn refused by the breaker does; then it makes a first attempt (the
probe, if it is the first to wake). On the code before, such a turn failed at once
("the retry budget of primary is empty") with most of its deadline left: the blip's
three lost turns (`tests/test_e2e_breaker_blip.py`).
"""

from __future__ import annotations

from fallgate.fsm import HealthStore, Outcome, OutcomeKind, Turn, VirtualClock
from fallgate.fsm.core.actions import Attempt, Wait
from fallgate.fsm.host.scripted import play

from helpers import chain


def _empty_budget(key: object, health: HealthStore) -> None:
    """The primary's bucket emptied by other turns' retries (its breaker still closed)."""
    health._apply(key, lambda r, now: {**r, "tokens": 0.0}, 0.0)


def test_a_retry_refused_by_the_empty_budget_waits_for_the_probe_and_is_answered() -> None:
    policy = chain("primary")
    health, clock = HealthStore(), VirtualClock(0.0)
    _empty_budget(policy.targets[0].key, health)
    played = play(policy, ["transport", "success"], health=health, clock=clock)
    assert played.error is None, played.error
    assert played.path == ["idle", "primary", "primary_cooling", "primary", "done"]
    first_span = policy.cooldown.initial
    assert len(played.waits) == 1 and first_span <= played.waits[0] <= first_span + 0.5
    second = played.calls[1]
    assert second.probe and not second.retry  # the first attempt after the verdict: free
    assert health.record(policy.targets[0].key).get("opens") is None  # closed by it


def test_the_trip_opens_the_breaker_for_every_turn_until_its_probe() -> None:
    """The trip is the backend's state, not the turn's: a turn starting during the span
    sends nothing to the primary (it waits for the breaker, or is refused), and the one
    probe after the span closes it for everybody."""
    policy = chain("primary")
    health, clock = HealthStore(), VirtualClock(0.0)
    key = policy.targets[0].key
    _empty_budget(key, health)
    # the trip: a turn whose retry the empty budget refuses opens the breaker
    first = Turn(policy, health=health, clock=clock.now)
    a = first.start()
    assert isinstance(a, Attempt)
    w = first.feed(Outcome(OutcomeKind.OVERLOADED, status=503))
    assert isinstance(w, Wait) and "retry budget empty" in w.reason
    assert health.target_until(key) == policy.cooldown.initial
    clock.advance(1.0)
    other = Turn(policy, health=health, clock=clock.now)
    assert isinstance(other.start(), Wait)  # waits for the breaker: sends nothing now


def test_with_a_fallback_eligible_the_refusal_falls_back_and_trips_nothing() -> None:
    policy = chain("primary", "fallback")
    health = HealthStore()
    _empty_budget(policy.targets[0].key, health)
    played = play(policy, ["transport", "success"], health=health)
    assert played.targets == ["primary", "fallback_1"]
    assert not played.waits
    assert health.record(policy.targets[0].key).get("opens") is None


def test_a_keys_fault_does_not_trip_the_backends_breaker() -> None:
    """A rate limit is the key's: an empty budget refusing its wait trips no breaker."""
    policy = chain("primary", retry_after_cap=30)
    health = HealthStore()
    _empty_budget(policy.targets[0].key, health)
    played = play(policy, ["rate_limited:2"], health=health)
    assert played.error is not None
    assert health.record(policy.targets[0].key).get("opens") is None


def test_a_retry_refused_at_its_grant_trips_even_if_a_token_came_back_since() -> None:
    """The store refused the retry for an empty bucket; before the turn heard of it,
    other turns' successes put a token back (an asyncio host lets them run in between).
    The refusal stands: the turn trips the breaker and waits for its verdict, instead of
    failing "the retry budget of primary is empty" with its deadline left (seen in the
    blip test, 197 of 200, before this rule)."""
    policy = chain("primary")
    health, clock = HealthStore(), VirtualClock(0.0)
    key = policy.targets[0].key
    turn = Turn(policy, health=health, clock=clock.now)
    turn.start()
    wait = turn.feed(Outcome(OutcomeKind.TRANSPORT, detail="reset"))
    assert isinstance(wait, Wait)
    clock.advance(wait.seconds)
    _empty_budget(key, health)
    retry = turn.waited()
    assert isinstance(retry, Attempt) and retry.retry
    why = health.grant(turn.s, retry)
    assert why is not None and "retry budget" in why
    health._apply(key, lambda r, now: {**r, "tokens": 1.0}, 0.0)  # another turn's success
    after = turn.deny(why)
    assert isinstance(after, Wait) and "retry budget empty" in after.reason, after
