"""A transport fault while the target answered other attempts is the connection's.

Under a burst (1,000 concurrent turns against a server whose accept queue overflows)
most attempts are answered and some time out in the connect. The engine used to read
every such timeout as the target failing: each retry took a token from the target's
retry budget (10), each turn left on it counted toward the breaker (open after 3), and
the second fault of a turn rebuilt its clients and called again at once. So the
budget ran dry within milliseconds of the first timeouts, the turns after it failed
without a retry, three of those opened the breaker, and the breaker refused every
other turn: on the overload bench fallgate answered 185, 273 and 239 of 1,000 turns
where the bare SDK (no budget, no breaker, a backoff before each retry) answered all.

The host marks such a fault (`Outcome.client_side`: the pool saw the target answer
another attempt while this one was out); the engine then retries it after a jittered
backoff, never a recovery (the client works), without a token, and reports no failure
to the breaker. A fault with no such evidence is handled as before. Each test here
fails on the engine before this rule (no `client_side`; tokens, breaker reports
and a recovery with an immediate call after every second transport fault).
"""

from __future__ import annotations

import random

import pytest
from fallgate.fsm import HealthStore, Turn, VirtualClock
from fallgate.fsm.core.actions import Attempt, Fail, Finish, Rebuild, Wait
from fallgate.fsm.kinds import Outcome

from helpers import chain

TURNS = 1000


def _client_side_fault() -> Outcome:
    return Outcome.of("transport", detail="timeout (ConnectTimeout)", client_side=True)


def _drain_budget(health: HealthStore, p, now: float) -> None:
    """Empty the primary's retry bucket (as a burst of earlier retries would)."""
    from fallgate.fsm.health import records as fleet

    key = p.targets[0].key
    for _ in range(int(p.retry_budget.size)):
        health._apply(key, lambda r, t: fleet.spend(r, p), now)
    assert health.retry_tokens(key, p) < 1.0


def test_a_connection_fault_is_retried_after_a_jittered_backoff_never_a_recovery():
    """Two client-side faults in a row: two backoffs (each the draw times the backoff
    ceiling of its retry), no Rebuild, and the third attempt answers."""
    p = chain("m0")
    clock = VirtualClock(start=50.0)
    turn = Turn(p, health=HealthStore(), clock=clock.now, random=lambda: 0.5)
    actions = [turn.start()]
    for _ in range(2):
        actions.append(turn.feed(_client_side_fault()))
        assert isinstance(actions[-1], Wait), actions
        clock.advance(actions[-1].seconds)
        actions.append(turn.waited())
        assert isinstance(actions[-1], Attempt), actions
    assert not any(isinstance(a, Rebuild) for a in actions)
    waits = [a.seconds for a in actions if isinstance(a, Wait)]
    assert waits == [
        pytest.approx(0.5 * p.backoff.initial),
        pytest.approx(0.5 * 2 * p.backoff.initial),
    ]
    assert isinstance(turn.feed(Outcome.success("hi")), Finish)


def test_without_evidence_the_second_transport_fault_still_rebuilds_the_client():
    """The old rule stands for a target that answered nobody: backoff, then recovery."""
    p = chain("m0")
    turn = Turn(p, health=HealthStore(), clock=VirtualClock().now, random=lambda: 0.5)
    turn.start()
    assert isinstance(turn.feed(Outcome.of("transport")), Wait)
    assert isinstance(turn.waited(), Attempt)
    assert isinstance(turn.feed(Outcome.of("transport")), Rebuild)


def test_a_connection_fault_is_retried_with_the_retry_budget_empty():
    """The budget stops retries against a target that is down; one that answers other
    attempts is not: the retry goes out, takes no token and needs no grant."""
    p = chain("m0")
    clock = VirtualClock(start=10.0)
    health = HealthStore()
    _drain_budget(health, p, clock.now())
    turn = Turn(p, health=health, clock=clock.now, random=lambda: 0.0)
    turn.start()
    wait = turn.feed(_client_side_fault())
    assert isinstance(wait, Wait)
    retry = turn.waited()
    assert isinstance(retry, Attempt) and not retry.retry  # spends nothing
    assert health.grant(turn.s, retry) is None
    # ... while a plain transport fault on the same empty budget is not retried: with no
    # fallback the refusal trips the breaker and the turn waits for its verdict, then
    # makes a first attempt (its probe), spending nothing either
    other = Turn(p, health=health, clock=clock.now, random=lambda: 0.0)
    other.start()
    tripped = other.feed(Outcome.of("transport"))
    assert isinstance(tripped, Wait) and "retry budget empty" in tripped.reason
    assert health.target_until(p.targets[0].key) > clock.now()
    clock.advance(tripped.seconds)
    probe = other.waited()
    assert isinstance(probe, Attempt) and probe.probe and not probe.retry


def test_turns_failing_on_connection_faults_do_not_open_the_breaker():
    """Ten turns in a row use up their attempts on client-side faults: the breaker (more
    than 2 failed turns a minute open it) stays closed and the next turn calls the
    target; the same ten turns on plain transport faults open it."""
    p = chain("m0", max_attempts=1, recover_transport=False)
    clock = VirtualClock(start=10.0)
    health = HealthStore()
    for _ in range(10):
        turn = Turn(p, health=health, clock=clock.now, random=lambda: 0.0)
        turn.start()
        assert isinstance(turn.feed(_client_side_fault()), Fail)
    assert health.target_until(p.targets[0].key) <= clock.now()
    assert isinstance(Turn(p, health=health, clock=clock.now).start(), Attempt)
    for _ in range(10):
        turn = Turn(p, health=health, clock=clock.now, random=lambda: 0.0)
        first = turn.start()
        if not isinstance(first, Attempt):
            break
        turn.feed(Outcome.of("transport"))
    assert health.target_until(p.targets[0].key) > clock.now()


def test_a_thousand_turns_retrying_connection_faults_spread_their_third_attempts():
    """1,000 turns see the same two client-side faults at the same instants: the wait
    before each one's third attempt is its own draw over the second backoff (where a
    recovery called again at once: 1,000 calls at one instant into the queue that had
    just overflowed)."""
    p = chain("m0")
    rng = random.Random(3)
    health = HealthStore()
    clock = VirtualClock(start=100.0)
    turns = [Turn(p, health=health, clock=clock.now, random=rng.random) for _ in range(TURNS)]
    assert all(isinstance(t.start(), Attempt) for t in turns)
    for t in turns:
        assert isinstance(t.feed(_client_side_fault()), Wait)
    clock.advance(p.backoff.initial)
    assert all(isinstance(t.waited(), Attempt) for t in turns)
    waits = []
    for t in turns:
        action = t.feed(_client_side_fault())
        assert isinstance(action, Wait), action
        waits.append(action.seconds)
    ceiling = p.backoff.initial * p.backoff.multiplier
    assert all(0.0 <= w <= ceiling for w in waits)
    assert len(set(waits)) == TURNS
    busiest = max(sum(lo <= w < lo + 0.05 for w in waits) for lo in (i / 100 for i in range(100)))
    assert busiest < TURNS * 0.1  # uniform over 1 s: about 5 % in any 50 ms
