"""The model checker sees pacing: the correct machine keeps the three pacing properties, and
each deliberately broken one below (one piece swapped: a declaration, a health store) is
caught with a shortest, replayable counterexample naming the property it breaks.

The three properties: the fallback gate with pacing on (a target out of headroom never
keeps the turn from an eligible fallback that has some), no attempt on a key its provider
said is empty before its reset (`no_call_on_an_empty_key`), and every reservation released
on every path (`reservations_released`).
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from fallgate.fsm import HealthStore, Policy
from fallgate.fsm.checker import check_policy, replay, step
from fallgate.fsm.checker.pacing import HEADROOM, NO_HEADROOM, brief_reset, held
from fallgate.fsm.checker.steps import Replay
from fallgate.fsm.core.actions import Wait
from fallgate.fsm.core.machine import Declaration, declare
from fallgate.fsm.core.pacing import PACE_WAIT, SETTLE

from helpers import chain


def said(target: str, credential: str, left: int, seconds: float) -> tuple[str, Any]:
    return step(NO_HEADROOM, target=target, credential=credential, left=left, seconds=seconds)


def brief(policy: Policy, report: Any) -> float:
    """The reset the checker's headroom setups and refusals speak of."""
    return brief_reset(policy, report.bounds.small)


def setup_of(steps: tuple[Any, ...]) -> list[Any]:
    return [st for st in steps if st[0] == NO_HEADROOM]


def events_of(steps: tuple[Any, ...]) -> list[str]:
    return [t for t, _ in steps if t != NO_HEADROOM]


@pytest.mark.parametrize(
    "policy",
    [
        chain("m0", keys=2, max_attempts=2),
        chain("m0", "m1", max_attempts=2),
        chain("m0", "m1", keys=2, max_attempts=2),
    ],
    ids=["1x2keys", "2x1key", "2x2keys"],
)
def test_the_pacing_properties_hold_and_every_pacing_edge_is_taken(policy):
    """With pacing on, the checker starts turns from keys out of headroom and keys with one
    request of it, feeds grants refused for headroom, and every property holds; every
    target's pace_wait edge (a refusal with no fallback left: wait for the reset) is taken
    (an earlier target's where the later ones are cooling)."""
    report = check_policy(policy)
    assert report.ok, report.text()
    assert report.holds("no_call_on_an_empty_key") and report.holds("reservations_released")
    assert not [u for u in report.unreachable if "refused for headroom" in u]
    assert any("refused for headroom" in d for d in _declared(policy))


def test_without_pacing_no_headroom_is_modelled():
    """Pacing off: no headroom setups, no headroom refusals, the same search as before."""
    policy = chain("m0", "m1", keys=2, max_attempts=2, pacing=False)
    on = check_policy(attrs.evolve(policy, pacing=True))
    off = check_policy(policy)
    assert off.ok, off.text()
    assert off.initial < on.initial and off.states < on.states


# (a) A release left out on one path: the declaration's `transport` observations without
# `SETTLE` (the compiled executor follows the declaration: it releases only where declared).
def settle_forgotten_on_transport(policy: Policy) -> Declaration:
    d = declare(policy)
    observes = dict(d.observes)
    observes["transport"] = tuple(ob for ob in observes["transport"] if ob is not SETTLE)
    return attrs.evolve(d, observes=observes)


def test_a_reservation_not_released_on_a_transport_fault_is_caught():
    policy = chain("m0", max_attempts=2)
    report = check_policy(policy, declaration=settle_forgotten_on_transport)
    v = report.violations["reservations_released"]
    # the shortest: the key has a request of headroom, the attempt reserves it, a transport
    # fault ends the attempt, and its reservation is still held
    assert v.length == 2
    assert setup_of(v.steps) == [said("primary", "key#1", 1, brief(policy, report))]
    assert events_of(v.steps) == ["start", "transport"]
    assert "key#1 of primary is still held" in v.why
    # the counterexample replays: the broken machine holds the reservation, the real one not
    broken = replay(policy, v.steps, declaration=settle_forgotten_on_transport(policy))[-1]
    assert list(held(broken.s.health, broken.s.clock()))
    good = replay(policy, v.steps)[-1]
    assert not list(held(good.s.health, good.s.clock()))


# (b) A store that does not read what the providers said when it says which key is free.
class BlindHealth(HealthStore):
    __slots__ = ()

    def paced_until(self, target: Any, cred: str, cost: float, now: float) -> float:
        return 0.0

    def ready_at(self, target: Any, pool: Any, owner: str, cost: Any = None, now: float = 0.0):
        return super().ready_at(target, pool, owner)


def test_an_attempt_on_a_key_its_provider_said_is_empty_is_caught():
    policy = chain("m0", keys=2, max_attempts=2)
    report = check_policy(policy, health_factory=BlindHealth)
    v = report.violations["no_call_on_an_empty_key"]
    assert v.length == 1  # both keys said empty until a reset: the first attempt is one
    assert events_of(v.steps) == ["start"]
    small = brief(policy, report)
    assert setup_of(v.steps) == [said("primary", c, 0, small) for c in ("key#1", "key#2")]
    assert "called primary with key#1" in v.why and "no requests left (reset in" in v.why
    turn = replay(policy, v.steps, health=BlindHealth())[-1]
    assert turn.s.action.credential.id == "key#1"
    good = replay(policy, v.steps)[-1]
    assert isinstance(good.s.action, Wait)  # the real machine waits for the reset
    assert good.s.action.seconds >= small


# (c) The gate: a grant refused for headroom waits for the key's reset before the
# fallbacks are considered (the pace_wait edge moved ahead of the fall-back edges).
def waits_before_falling_back(policy: Policy) -> Declaration:
    d = declare(policy)
    paced = [t for t in d.transitions if t.trigger == "denied" and t.guard is PACE_WAIT]
    rest = [t for t in d.transitions if t not in paced]
    first = min(i for i, t in enumerate(rest) if t.trigger == "denied")
    return attrs.evolve(d, transitions=(*rest[:first], *paced, *rest[first:]))


def test_a_target_out_of_headroom_that_keeps_the_turn_from_its_fallback_is_caught():
    policy = chain("m0", "m1", max_attempts=2)
    report = check_policy(policy, declaration=waits_before_falling_back)
    v = report.violations["fallback_gate"]
    # the primary had a request of headroom; another turn took it before the grant
    assert v.length == 2
    assert events_of(v.steps) == ["start", "denied"]
    assert v.steps[-1] == step("denied", **{HEADROOM: brief(policy, report)})
    assert "after the store refused primary although fallback_1 was eligible" in v.why
    turn = replay(policy, v.steps, declaration=waits_before_falling_back(policy))[-1]
    assert turn.state == "primary_cooling"
    good = replay(policy, v.steps)[-1]
    assert good.state == "fallback_1"  # the real machine falls back at once


def test_a_turn_start_that_waits_for_the_primarys_reset_instead_of_falling_back_is_caught():
    """The gate at turn start: a target out of headroom is cooling, and the turn starts on
    the first target that is not (`clean_turn_start`). A store that reads no headroom for
    eligibility, but does when it picks the key, starts on the primary."""

    class HalfBlind(HealthStore):
        __slots__ = ()

        def ready_at(self, target: Any, pool: Any, owner: str, cost: Any = None, now: float = 0.0):
            return super().ready_at(target, pool, owner)

    policy = chain("m0", "m1", max_attempts=2)
    report = check_policy(policy, health_factory=HalfBlind)
    assert not report.ok
    v = report.violations["clean_turn_start"]
    assert v.length == 1 and events_of(v.steps) == ["start"]
    assert "not on fallback_1" in v.why


def test_a_refused_grant_is_not_counted_as_a_key_rotation():
    """A grant refused for headroom on key#2 (after key#1's 429), a wait for the soonest
    reset, then key#1: the turn never used key#2, so this is no rotation after nothing."""
    policy = chain("m0", keys=2, max_attempts=2)
    large = check_policy(policy).bounds.large
    steps = [
        said("primary", "key#1", 1, large),
        said("primary", "key#2", 1, large),
        step("start"),
        step("rate_limited", retry_after=None),
        step("denied", **{HEADROOM: 7.5}),
        step("waited"),
    ]
    turn = replay(policy, steps)[-1]
    assert [e.event for e in turn.trace][-2:] == ["denied", "waited"]
    assert turn.s.action.credential.id == "key#1"
    assert not list(held(turn.s.health, turn.s.clock()))  # the grant reserved nothing


def test_every_reservation_is_released_on_a_replayed_turn():
    """Replay reserves as a host does (the grant before each attempt on a key a reply
    spoke of) and each way the attempt ends releases it."""
    policy = chain("m0", "m1", max_attempts=2)
    large = check_policy(policy).bounds.large
    setup = [said("primary", "key#1", 1, large), step("start")]
    r = Replay(policy)
    for st in setup:
        r.feed(st)
    assert r.ask_grant(r.turns[-1]) is None
    key1 = policy.targets[0].pool()[0].health_id
    assert [h for _t, h, _rid in held(r.health, r.clock())] == [key1]  # reserved at grant
    for ending in ("success", "auth", "transport", "overloaded", "cancelled"):
        t = replay(policy, [*setup, step(ending)])[-1]
        assert not list(held(t.s.health, t.s.clock())), ending


def _declared(policy: Policy) -> list[str]:
    from fallgate.fsm.checker.report import describe

    return [describe(t, policy) for t in declare(policy).edges()]
