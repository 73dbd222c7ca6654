"""Time in the proof: attempts take time in the model, and the checker catches a machine
that spends the deadline on a silent target.

A ``transport`` step marked ``silent`` is an attempt that took its whole timeout (a
provider that accepted the request and never answered). Property 11, *the clock never
closes the gate*: a turn that stayed on a target while a fallback was eligible with
time for a whole attempt never ends failed without asking it. With the time reserve
removed (`fsm.core.guards.unreserved`) the checker reports the shortest such path,
replayable, and the real machine fed the same steps is answered by the fallback.
"""

from __future__ import annotations

import json

import pytest
from fallgate.fsm.checker import PROPERTIES, check_policy, replay, step
from fallgate.fsm.checker.steps import Replay
from fallgate.fsm.clock import VirtualClock
from fallgate.fsm.core.guards import unreserved
from fallgate.providers.cli.check import check_main

from helpers import chain

SILENT = step("transport", silent=True)


def test_the_new_property_is_listed_and_named_in_the_report():
    assert PROPERTIES[10] == "clock_never_closes_gate"  # the eleventh; pacing's two follow
    report = check_policy(chain("m0", "m1", attempt_timeout=1, deadline=2.5))
    assert report.ok, report.text()
    assert "clock_never_closes_gate" in report.text()
    assert report.to_json()["properties"]["clock_never_closes_gate"] == "holds"


def test_a_silent_step_takes_the_attempts_whole_timeout_of_the_clock():
    policy = chain("m0", "m1", attempt_timeout=1, deadline=2.5)
    clock = VirtualClock(1000.0)
    r = Replay(policy, clock=clock)
    r.feed(step("start"))
    r.feed(SILENT)
    assert clock.t == pytest.approx(1001.0)
    r.feed(step("transport"))  # an instant fault: no time
    assert clock.t == pytest.approx(1001.0)


@pytest.mark.parametrize(
    ("knobs", "length", "primary_calls"),
    [
        ({"attempt_timeout": 1, "deadline": 2.5}, 4, 1),  # the 1 s / 2.5 s row
        ({}, 6, 2),  # the defaults: 60 s attempts, 180 s deadline (one rebuild fits)
    ],
)
def test_without_the_reserve_the_checker_reports_the_silent_primary(knobs, length, primary_calls):
    policy = chain("m0", "m1", **knobs)
    broken = unreserved()
    report = check_policy(policy, guards=broken)
    v = report.violations["clock_never_closes_gate"]
    assert v.length == length  # breadth-first: the shortest path
    assert v.steps[0] == step("start")
    assert v.steps[1] == SILENT and v.steps[-1] == SILENT
    assert "without asking fallback_1" in v.why
    # replayable: the broken machine fails without the fallback ...
    bad = replay(policy, v.steps, guards=broken)[-1]
    assert bad.state == "failed"
    assert "fallback_1" not in [e.target for e in bad.trace]
    # ... the real one, its primary as silent, is answered by the fallback
    assert _silent_primary(policy) == ["primary"] * primary_calls + ["fallback_1"]


def _silent_primary(policy) -> list[str]:  # type: ignore[no-untyped-def]
    """Drive the real machine as the checker would: every primary attempt silent, the
    fallback answering, every wait and rebuild on time; the targets it called."""
    r = Replay(policy)
    a = r.feed(step("start"))
    called = []
    while type(a).__name__ in ("Attempt", "Wait", "Rebuild"):
        if type(a).__name__ == "Attempt":
            called.append(a.target.name)  # type: ignore[union-attr]
            a = r.feed(SILENT if a.target.index == 0 else step("success"))  # type: ignore[union-attr]
        else:
            a = r.feed(step("waited" if type(a).__name__ == "Wait" else "rebuilt"))
    assert r.turns[-1].state == "done"
    return called


@pytest.mark.slow  # three targets with two keys each and a binding deadline
def test_the_reserve_holds_with_three_targets_and_two_keys():
    report = check_policy(chain("m0", "m1", "m2", keys=2, attempt_timeout=2, deadline=7))
    assert report.ok, report.text()


_POLICY = (
    'max_attempts = 2\n{extra}[primary]\nprovider = "a"\nmodel = "a"\n'
    'api_key = "sk-a-secret-1"\nbase_url = "https://a.test/v1"\n'
    '[[fallback_providers]]\nprovider = "b"\nmodel = "b"\napi_key = "sk-b-secret-1"\n'
    'base_url = "https://b.test/v1"\n'
)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (
            "deadline = 100\n",
            "warning: deadline 100 s is shorter than one attempt on each of primary "
            "(attempt_timeout 60 s) and fallback_1 (60 s)",
        ),
        (
            "deadline = 2.5\nattempt_timeout = 1\n",
            "warning: deadline 2.5 s holds no second attempt on primary after a timeout",
        ),
    ],
)
def test_fallgate_check_warns_when_the_deadline_cannot_hold_the_reserve(
    capsys, tmp_path, extra, words
):
    f = tmp_path / "p.toml"
    f.write_text(_POLICY.format(extra=extra))
    assert check_main(str(f), False) == 0  # a warning, not a broken property
    out = capsys.readouterr().out
    assert words in out
    assert "holds   clock_never_closes_gate" in out
    assert check_main(str(f), True) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["warnings"]) == 1 and "deadline" in data["warnings"][0]


def test_fallgate_check_is_quiet_about_a_deadline_that_holds_the_reserve(capsys, tmp_path):
    f = tmp_path / "p.toml"
    f.write_text(_POLICY.format(extra="deadline = 40\nattempt_timeout = 10\n"))
    assert check_main(str(f), True) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []


def _silent_group_policy():
    members = [
        {"base_url": f"https://r{i}.example/v1", "api_key": f"sk-r{i}-0000000000"} for i in range(2)
    ]
    group = {"provider": "p0", "model": "m0", "members": members}
    return chain(group, "m1", attempt_timeout=1, deadline=2.5)


def test_a_group_whose_members_are_silent_is_checked_with_the_next_entrys_reserve():
    """Two silent members of the primary entry and one fallback, 1 s attempts, 2.5 s: a
    move to the second member would leave the fallback less than its reserve. The machine
    moves to the next entry instead, and every property holds."""
    report = check_policy(_silent_group_policy())
    assert report.ok, report.text()


def test_an_engine_that_moves_on_within_a_silent_group_regardless_is_caught(monkeypatch):
    """The same policy with the rule taken out of the engine (the checker's own reading
    keeps it): the checker reports the move to the second member as a fallback to the
    wrong target, with the silent path that shows it."""
    import fallgate.fsm.core.state as state

    monkeypatch.setattr(state, "member_spends_reserve", lambda s, j: None)
    report = check_policy(_silent_group_policy())
    assert not report.ok
    v = report.violations["fallback_gate"]
    assert "the first eligible fallback was fallback_1" in v.why, v.why
    assert SILENT in v.steps


def test_after_a_context_overflow_the_checker_reads_the_group_rule_as_the_engine_does():
    """A group reached after the primary overflowed, the only target after it of unknown
    context_length: the checker's reading of the next entry is the engine's, so the
    policy checks clean (it was reported as a fallback to the wrong target)."""
    members = [
        {"base_url": f"https://r{i}.example/v1", "api_key": f"sk-r{i}-0000000000"} for i in range(2)
    ]
    group = {"provider": "p1", "model": "g", "members": members, "context_length": 16000}
    report = check_policy(chain("a@4096", group, "u", attempt_timeout=1, deadline=2.5))
    assert report.ok, report.text()
