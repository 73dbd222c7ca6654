"""The model checker on correct machines: the default policy, the CLI entry point, the
equivalence of the compiled executor and the `transitions` machine, and a grid of
policies (the thirteen properties of docs/design.md).

Grid bounds: chain length 0-4 fallbacks x 1-3 keys x 1-3 attempts, two turns on one
health store per path; for the big corners (3 keys and 3-4 fallbacks) the initial
configurations are reduced to "all free" and "all cooling" (max_cooling=0) to keep the
whole grid near a minute on two cores.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from fallgate.fsm import Turn
from fallgate.fsm.checker import PROPERTIES, Checker, check_policy, default_policy, replay, step
from fallgate.fsm.core.actions import Attempt
from fallgate.fsm.core.turn import TransitionsTurn
from fallgate.providers.cli import check_main

from helpers import SMALL_POLICY, chain, numbered


def test_every_property_holds_for_the_default_policy():
    report = check_policy(default_policy())
    assert report.ok, report.text()
    assert report.complete
    data = report.to_json()
    assert set(data) == {
        "states",
        "transitions",
        "seconds",
        "properties",
        "unreachable",
        "untaken",
        "key_audit",
    }
    assert data["key_audit"]["finding"] is None and data["key_audit"]["checked"] > 0
    assert list(data["properties"]) == list(PROPERTIES)
    assert set(data["properties"].values()) == {"holds"}
    assert data["states"] > 1000 and data["transitions"] > data["states"]
    # The default chain's context lengths shrink (1M, 200k, 128k, 128k): a
    # context_too_long can never fall back, so no such edge is declared. A wait for the
    # breaker's verdict needs another turn to open it mid-turn: the fleet checker's
    # (test_checker_fleet.py), not one turn's, and each untaken edge says so. A wait for a
    # key's reset after a refusal for headroom is checked on the last target (no fallback
    # left): an earlier target's refusal falls back (the same guard; fsm/checker/initial.py).
    assert data["unreachable"]
    assert not [u for u in data["unreachable"] if "--context_too_long [next eligible" in u]
    headroom = [u for u in data["unreachable"] if "refused for headroom" in u]
    assert not [u for u in headroom if u.startswith("fallback_3 ")]
    assert all(
        "the breaker open or another turn probing" in u
        for u in data["unreachable"]
        if u not in headroom
    )
    assert {u["finding"] for u in data["untaken"]} <= {"other turns", "gap"}


def _small_policy(tmp_path: Path) -> str:
    """A two-target policy file: the CLI's report is the same shape whatever the size
    (the default policy's own check is `test_every_property_holds_for_the_default_policy`)."""
    path = tmp_path / "small.toml"
    path.write_text(SMALL_POLICY)
    return str(path)


def test_check_main_prints_one_json_object_and_exits_zero(capsys, tmp_path):
    assert check_main(_small_policy(tmp_path), True) == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    assert data["properties"]["fallback_gate"] == "holds"
    assert isinstance(data["states"], int) and isinstance(data["seconds"], float)


def test_check_main_text_lists_states_and_every_property(capsys, tmp_path):
    assert check_main(_small_policy(tmp_path), False) == 0
    out = capsys.readouterr().out
    assert "explored" in out and "states/s" in out
    for name in PROPERTIES:
        assert f"holds   {name}" in out


def test_check_main_refuses_an_invalid_policy_in_one_line(capsys, tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text('max_attempts = 0\n[primary]\nprovider = "x"\nmodel = "y"\n')
    assert check_main(str(bad), False) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert "max_attempts" in captured.err and "Traceback" not in captured.err


def test_check_main_reads_a_policy_file(capsys, tmp_path):
    good = tmp_path / "p.toml"
    good.write_text(
        'max_attempts = 2\n[primary]\nprovider = "a"\nmodel = "a"\nkey_env = "A_KEY"\n'
        'base_url = "https://a.test/v1"\n'
        '[[fallback_providers]]\nprovider = "b"\nmodel = "b"\napi_key = "sk-b-secret-1"\n'
        'base_url = "https://b.test/v1"\n'
    )
    assert check_main(str(good), True) == 0
    out = capsys.readouterr().out
    assert "sk-b-secret-1" not in out
    assert json.loads(out)["properties"]["secrets_never_leak"] == "holds"


def test_a_counterexample_step_list_replays_on_a_fresh_turn():
    policy = chain("m0", "m1", max_attempts=2)
    steps = [step("start"), step("rate_limited", retry_after=171.0), step("success")]
    turn = replay(policy, steps)[-1]
    assert turn.state == "done"
    assert [e.target for e in turn.trace] == ["primary", "fallback_1", "fallback_1"]
    assert all(e.wait is None for e in turn.trace)  # no 171 s sleep (scenario 2)


def test_a_committed_stream_is_continued_or_failed_never_replayed():
    """Property 8 on a chain where the middle target cannot continue a stream: the
    checker proves every call after a commit continues it (on the target it broke on,
    else the first eligible one that takes a prefix) and every failure carries the
    delivered text. (Regression: a continuation that failed with a fallback-triggering
    outcome once fell back to the next target, replaying the delivered output there.)"""
    policy = chain(
        {"model": "m0", "assistant_prefix": True},
        "m1",
        {"model": "m2", "assistant_prefix": True},
        keys=2,
        max_attempts=3,
    )
    report = check_policy(policy)
    assert report.holds("committed_streams_not_replayed"), report.text()
    assert report.ok, report.text()
    turn = replay(
        policy,
        [
            step("start"),
            step("stream_interrupted", partial="Hello, wor"),
            step("overloaded", retry_after=600.0),
        ],
    )[-1]
    assert turn.state == "fallback_2_continuing"  # m1 skipped: it cannot continue
    assert isinstance(turn.s.action, Attempt) and turn.s.action.prefix == "Hello, wor"
    failed = replay(
        policy,
        [
            step("start"),
            step("stream_interrupted", partial="Hello, wor"),
            step("overloaded", retry_after=600.0),
            step("bad_request"),
        ],
    )[-1]
    assert failed.state == "failed"
    assert failed.s.action is not None and failed.s.action.error.partial == "Hello, wor"


def _prefix_chain():
    return chain(
        {"model": "m0", "assistant_prefix": True},
        {"model": "m1", "assistant_prefix": True},
        keys=2,
        max_attempts=3,
    )


def test_a_stream_no_prefix_can_carry_fails_at_its_break_and_the_checker_explores_it():
    """A break the host marks `uncontinuable` (tool calls, several choices) is in the
    alphabet: the checker proves no continuation follows it, on the target it broke on or
    any other, and the turn fails there with the delivered text."""
    policy = _prefix_chain()
    report = check_policy(policy)
    assert report.ok, report.text()
    broke = step("stream_interrupted", partial="Hello, wor", uncontinuable=True)
    turn = replay(policy, [step("start"), broke])[-1]
    assert turn.state == "failed"
    assert turn.s.action is not None and turn.s.action.error.partial == "Hello, wor"
    assert turn.attempts == 1


def test_an_engine_that_continues_a_stream_its_break_said_cannot_be_is_caught(monkeypatch):
    """The engine with its reading of the break's mark taken out (`uncontinuable` never
    says no): the checker reports the continuation it then asks for, with the path."""
    import fallgate.fsm.core.state as state

    monkeypatch.setattr(state.TurnState, "uncontinuable", lambda self: None)
    report = check_policy(_prefix_chain())
    assert not report.ok
    v = report.violations["committed_streams_not_replayed"]
    assert "no text prefix can carry it" in v.why, v.why
    assert any(dict(args).get("uncontinuable") for _, args in v.steps), v.steps


def test_a_non_retryable_429_key_is_never_rotated_back_to_in_the_same_turn():
    """Regression for what the fuzzer (then the checker) found in the core: with
    rules.rate_limited.retry = false and three keys, key#1's 429 (Retry-After 0) rotated
    to key#2, whose 429 rotated straight back to key#1 -- a non-retryable key retried."""
    policy = chain("m0", keys=3, max_attempts=1, rules={"rate_limited": {"retry": False}})
    report = check_policy(policy)
    assert report.ok, report.text()
    turn = replay(
        policy,
        [step("start"), step("rate_limited", retry_after=0.0), step("rate_limited")],
    )[-1]
    assert [e.credential for e in turn.trace] == ["key#1", "key#2", "key#3"]


def test_a_failed_rebuild_falls_back_only_when_transport_faults_do():
    """Regression for what the fuzzer found in the declaration: with
    rules.transport.fall_back = false, a failed client rebuild still fell back."""
    policy = chain("m0", "m1", max_attempts=1, rules={"transport": {"fall_back": False}})
    report = check_policy(policy)
    assert report.ok, report.text()
    turn = replay(policy, [step("start"), step("transport"), step("rebuild_failed")])[-1]
    assert turn.state == "failed"
    assert [e.target for e in turn.trace] == ["primary"] * 3


SLOW = pytest.mark.slow  # a minute of two whole searches each
POLICIES_FOR_EQUIVALENCE = [
    pytest.param(chain("m0", max_attempts=1), id="0"),
    pytest.param(chain("m0", "m1", keys=2, max_attempts=2), id="1", marks=SLOW),
    pytest.param(chain("m0", "m1", "m2", max_attempts=3, prefer_waiting=True), id="2", marks=SLOW),
    pytest.param(
        chain("m0", "m1", keys=2, max_attempts=2, recover_transport=False, retry_after_cap=0),
        id="3",
    ),
]


@pytest.mark.parametrize("policy", POLICIES_FOR_EQUIVALENCE)
def test_compiled_and_transitions_executors_take_the_same_transitions(policy):
    """One declaration, two executors: on every reachable configuration, for every
    event, the compiled table and the real `transitions` machine take the same
    transition (same source, event, destination, action, target, credential, wait) to
    the same configuration."""
    runs = {}
    for executor in (Turn, TransitionsTurn):
        c = Checker(policy, executor=executor, record=True, turns=2)
        report = c.run()
        assert report.ok, report.text()
        runs[executor] = (report, c.edge_log)
    (fast, fast_log), (slow, slow_log) = runs[Turn], runs[TransitionsTurn]
    assert (fast.states, fast.transitions) == (slow.states, slow.transitions)
    assert len(fast_log) > fast.states  # every edge was recorded (not just the tree)
    assert fast_log == slow_log


GRID = list(itertools.product(range(5), range(1, 4), range(1, 4)))


def _grid_case(fallbacks: int, keys: int, attempts: int) -> object:
    """One policy of the grid: up to 2 keys and 2 attempts in the default run (every
    chain length), the larger ones (up to minutes each) in `make test-slow`."""
    marks = [pytest.mark.slow] if keys == 3 or attempts == 3 else []
    return pytest.param(
        fallbacks, keys, attempts, marks=marks, id=f"{fallbacks}fb-{keys}keys-{attempts}att"
    )


@pytest.mark.parametrize(("fallbacks", "keys", "attempts"), [_grid_case(*g) for g in GRID])
def test_every_property_holds_across_the_policy_grid(fallbacks, keys, attempts):
    big_corner = keys == 3 and fallbacks >= 3
    policy = chain(*numbered(fallbacks + 1), keys=keys, max_attempts=attempts)
    report = check_policy(policy, max_cooling=0 if big_corner else 1)
    assert report.ok, report.text()
    assert report.states > 10
