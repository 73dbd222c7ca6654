"""Proof that the model checker can fail: deliberately broken machines, each caught
with a short, replayable counterexample naming the broken property.

Every broken machine below is the real executor with one piece swapped (a guard, a
declaration, an effect, a health store); the same policy with nothing swapped passes.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest
from fallgate.fsm import HealthStore, Policy
from fallgate.fsm.checker import Checker, check_policy, replay, step
from fallgate.fsm.core.guards import ATTEMPT, BACK_OFF, FALL_BACK, NEXT_IS, VERDICT_WAITS
from fallgate.fsm.core.machine import Declaration, Transition, declare
from fallgate.fsm.core.turn import TurnState
from fallgate.fsm.core.visit import Visit

from helpers import KEY_PREFIX, chain


@pytest.mark.parametrize(
    "policy",
    [
        chain("m0", "m1", max_attempts=2),
        chain("m0", keys=2, max_attempts=2),
        chain("m0", "m1", "m2", keys=2, max_attempts=2),
    ],
)
def test_the_unmodified_machine_passes_on_the_policies_used_below(policy):
    report = check_policy(policy)
    assert report.ok, report.text()


# (a) The original bug: a stale "fallback exhausted" fact survives a successful transport
# recovery, so the next fallback-triggering outcome ends the turn instead of falling back.
def _stale_next_is(s: TurnState, arg: int) -> bool:
    return not s.visit.recovered and s.next_eligible() == arg


STALE_NEXT_IS = {NEXT_IS: attrs.evolve(NEXT_IS, check=_stale_next_is)}


def test_a_stale_fallback_index_after_recovery_breaks_the_fallback_gate():
    policy = chain("m0", "m1", max_attempts=2)
    report = check_policy(policy, guards=STALE_NEXT_IS)
    v = report.violations["fallback_gate"]
    assert not report.holds("fallback_gate")
    # a silent timeout (its 60 s leave no backed-off retry and the fallback's reserve) ->
    # recovery -> rebuilt -> one more fault: 4 events, the minimum
    assert v.length == 4
    assert v.steps[:3] == (step("start"), step("transport", silent=True), step("rebuilt"))
    assert v.steps[3][0] in {"transport", "rate_limited", "quota", "overloaded", "auth"}
    assert "fallback_1 was eligible" in v.why
    # The counterexample replays on a fresh turn and reproduces the failure ...
    turn = replay(policy, v.steps, guards=STALE_NEXT_IS)[-1]
    assert turn.state == "failed"
    assert "fallback_1" not in [e.target for e in turn.trace]
    # ... while the real machine, fed the same events, falls back.
    good = replay(policy, v.steps)[-1]
    assert good.state == "fallback_1"


# (b) A declaration where a 429 loops on the same target and never reaches a fallback.
def self_loop_on_429(policy: Policy) -> Declaration:
    d = declare(policy)
    names = {t.name for t in policy.targets}
    kept = [t for t in d.transitions if not (t.trigger == "rate_limited" and t.source in names)]
    loops = [Transition("rate_limited", n, n, None, ATTEMPT) for n in sorted(names)]
    return attrs.evolve(d, transitions=(*kept, *loops))


@pytest.mark.slow  # the search of a machine that never ends a turn: a minute
def test_a_self_loop_on_429_is_caught_as_non_termination_and_a_closed_gate():
    policy = chain("m0", "m1", max_attempts=1)
    report = check_policy(policy, declaration=self_loop_on_429)
    term = report.violations["termination"]
    # bound per target: max_attempts 1 + recovery 1 + the attempts after the breaker's
    # verdict waits (VERDICT_WAITS) = 4; the fifth attempt breaks it
    bound = 2 + VERDICT_WAITS
    assert term.length == bound + 1
    assert [t for t, _ in term.steps] == ["start"] + ["rate_limited"] * bound
    assert f"{bound + 1} attempts on primary" in term.why
    gate = report.violations["fallback_gate"]
    assert "never reaches a fallback" in gate.why
    assert gate.length <= bound + 3
    assert all(t == "rate_limited" for t, _ in gate.steps[1:])
    # and the loop ignores Retry-After too
    assert not report.holds("honest_waits")


# (c) A health store whose cooldowns extend themselves: every new failure it observes on
# a target pushes that target's running cooldowns forward.
class ExtendingHealth(HealthStore):
    __slots__ = ()

    def cool_credential(
        self, target: Any, cred: str, until: float, now: float, cause: str | None = None
    ) -> float:
        with self._lock:
            for k, v in list(self._cred_until.items()):
                if k[0] == target and v > now:
                    self._cred_until[k] = max(v, until)
        return super().cool_credential(target, cred, until, now, cause)


def test_a_cooldown_that_extends_itself_is_caught():
    policy = chain("m0", keys=2, max_attempts=2)
    report = check_policy(policy, health_factory=ExtendingHealth)
    v = report.violations["honest_waits"]
    assert "extended" in v.why and "key#1" in v.why
    assert v.length == 2  # a 429 on key#2 while key#1 cools (set up at turn start)
    assert [t for t, _ in v.steps if t != "cool_credential"] == ["start", "rate_limited"]
    # the same store also breaks attribution: key#2's 429 changed key#1's health
    assert "changed the health of credential key#1" in report.violations["bounded_rotation"].why


# (d) A committed stream replayed on the next target.
def stream_falls_back(policy: Policy) -> Declaration:
    d = declare(policy)
    names = [t.name for t in policy.targets]
    out: list[Transition] = []
    for t in d.transitions:
        if t.trigger == "stream_interrupted" and t.source in names:
            i = names.index(t.source)
            out += [
                Transition("stream_interrupted", t.source, names[j], NEXT_IS, FALL_BACK, j)
                for j in range(i + 1, len(names))
            ]
        out.append(t)
    return attrs.evolve(d, transitions=tuple(out))


def test_a_committed_stream_replayed_on_a_fallback_is_caught():
    policy = chain("m0", "m1", max_attempts=2)
    report = check_policy(policy, declaration=stream_falls_back)
    v = report.violations["committed_streams_not_replayed"]
    assert v.length == 2
    assert [t for t, _ in v.steps] == ["start", "stream_interrupted"]
    assert "fallback_1" in v.why
    # a broken stream may move on (to a target that continues it): judging where it goes
    # is property 8's alone, so the gate does not report it a second time
    assert set(report.violations) == {"committed_streams_not_replayed"}


def test_a_leaking_effect_is_caught_by_the_secrets_property():
    from fallgate.fsm.core.actions import Wait

    def chatty_back_off(s: TurnState, arg: int) -> Wait:
        w = BACK_OFF.run(s, arg)
        assert isinstance(w, Wait)
        cred = s.visit.credential
        assert cred is not None and cred.key is not None
        return Wait(w.seconds, f"backing off {cred.key.reveal()}")

    report = check_policy(
        chain("m0", max_attempts=2), effects={BACK_OFF: attrs.evolve(BACK_OFF, run=chatty_back_off)}
    )
    v = report.violations["secrets_never_leak"]
    assert v.length == 2 and v.steps[1][0] in ("transport", "overloaded")
    assert KEY_PREFIX not in v.why  # the report itself never prints the key
    assert "***" in v.why


def test_counterexamples_round_trip_through_json():
    from fallgate.fsm.checker import steps_from_json

    report = check_policy(chain("m0", "m1", max_attempts=2), guards=STALE_NEXT_IS)
    data = report.to_json()["properties"]["fallback_gate"]["counterexample"]
    assert steps_from_json(data) == list(report.violations["fallback_gate"].steps)
    assert steps_from_json([["rate_limited", {"retry_after": 5}]]) == [
        step("rate_limited", retry_after=5)
    ]


# (f) A key that forgets a field a guard reads: `transport_retry` and `can_recover` read
# `visit.recovered`, so a visit that used its recovery and one that did not must never be
# merged; a key without it merges them and the search would silently lose soundness.
def test_a_field_left_out_of_the_key_is_caught_by_the_key_audit(monkeypatch):
    policy = chain("m0", "m1", max_attempts=3)
    # silent attempts add merges the audit spends its budget on: give it room
    sound = Checker(policy, audit_budget=5000).run()
    assert sound.ok and sound.audit.checked > 0 and sound.audit.finding is None

    keyed = Visit.key

    def forgetful(self: Visit, now: float, horizon: float = math.inf) -> tuple:
        k = keyed(self, now, horizon)
        assert k[4] is self.recovered
        return (*k[:4], None, *k[5:])

    monkeypatch.setattr(Visit, "key", forgetful)
    report = Checker(policy, audit_budget=5000).run()
    assert not report.ok
    assert report.audit.finding is not None
    assert "visit.recovered alone makes the difference" in report.audit.finding
    assert "KEY UNSOUND" in report.text()
    assert report.to_json()["key_audit"]["finding"] == report.audit.finding
