"""The checker at the scale of real chains: its reductions change nothing it proves.

The search keys configurations without the targets a turn left behind, without which
earlier target was the silent one, a finished turn's health up to its second ready
target, and the unexpanded ends of a next turn coarsely (`fsm.checker.configuration`,
docs/design.md
"The checker at the scale of real chains"). Here the reduced search and the full one
(`reduce=False`) run side by side, on correct machines and on broken ones: the same
properties hold or break, with counterexamples of the same (shortest) length. A check
that runs long says how far it got, on stderr only.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from fallgate.fsm import Policy
from fallgate.fsm.checker import Checker
from fallgate.fsm.checker.progress import Progress
from fallgate.fsm.core.guards import CAN_ROTATE, FALL_BACK, Guard, unreserved
from fallgate.fsm.core.machine import Declaration, Transition, declare
from fallgate.providers.cli.check import check_main
from hypothesis import given, settings
from hypothesis import strategies as st
from test_checker_broken import STALE_NEXT_IS, ExtendingHealth, self_loop_on_429, stream_falls_back

from helpers import SMALL_POLICY, chain, numbered

_ANYWAY = Guard("anyway", lambda s, arg: True, "anyway")


def back_to_the_primary(policy: Policy) -> Declaration:
    """A 503 on the last target goes back to the primary: the ping-pong the reduction
    must not hide (the primary is behind, and dropped from the key)."""
    d = declare(policy)
    last = policy.targets[-1].name
    back = Transition("overloaded", last, policy.targets[0].name, _ANYWAY, FALL_BACK, 0)
    return attrs.evolve(d, transitions=(back, *d.transitions))


POLICIES = {
    "three targets, two keys": chain("m0", "m1", "m2", keys=2, max_attempts=2),
    "an identical target ahead": chain("m0", "m1", "m0", provider="same", max_attempts=2),
    "shrinking then unknown windows": chain("m0@8000", "m1@4000", "m2", "m3@16000", max_attempts=1),
    "round robin keys": chain(
        {"model": "m0", "rotation": "round_robin"}, "m1", keys=3, max_attempts=2
    ),
    # the deadline binds: elapsed is keyed by the gap between its deadline bands
    "a deadline that holds the reserve": chain("m0", "m1", keys=2, attempt_timeout=2, deadline=7),
}

BROKEN: dict[str, tuple[Policy, dict[str, Any]]] = {
    "stale fallback index": (chain("m0", "m1", max_attempts=2), {"guards": STALE_NEXT_IS}),
    # pacing off: its refusals multiply an unbounded loop's configurations (about 3x the
    # time) and have nothing to do with the loop
    "a 429 loops": (
        chain("m0", "m1", max_attempts=1, pacing=False),
        {"declaration": self_loop_on_429},
    ),
    "a replayed stream": (chain("m0", "m1", max_attempts=2), {"declaration": stream_falls_back}),
    "a self-extending cooldown": (
        chain("m0", keys=2, max_attempts=2),
        {"health_factory": ExtendingHealth},
    ),
    "back to the primary": (
        chain("m0", "m1", "m2", max_attempts=1),
        {"declaration": back_to_the_primary},
    ),
    "no reserve, 1 s / 2.5 s": (
        chain("m0", "m1", attempt_timeout=1, deadline=2.5),
        {"guards": unreserved()},
    ),
    "no reserve, the defaults' timings": (
        chain("m0", "m1", keys=2),
        {"guards": unreserved()},
    ),
}


def _verdicts(
    policy: Policy, reduce: bool, **kw: Any
) -> tuple[dict[str, int], tuple[str, ...], int]:
    c = Checker(policy, reduce=reduce, **kw)
    report = c.run()
    assert report.complete
    lengths = {name: v.length for name, v in report.violations.items()}
    return lengths, tuple(sorted(report.unreachable)), report.transitions


# the cases that take two whole searches of tens of seconds each run in `make test-slow`
SLOW_CASES = {
    "round robin keys", "three targets, two keys", "a deadline that holds the reserve",
    "shrinking then unknown windows", "a 429 loops", "back to the primary",
    "no reserve, the defaults' timings",
}  # fmt: skip


def _cases(names: dict[str, Any]) -> list[Any]:
    return [
        pytest.param(n, id=n, marks=[pytest.mark.slow] if n in SLOW_CASES else [])
        for n in sorted(names)
    ]


@pytest.mark.parametrize("name", _cases(POLICIES))
def test_the_reduced_search_proves_what_the_full_one_proves(name):
    policy = POLICIES[name]
    full = _verdicts(policy, reduce=False)
    reduced = _verdicts(policy, reduce=True)
    assert full[0] == {} and reduced[0] == {}
    assert reduced[1] == full[1]  # the same declared edges never taken
    assert reduced[2] <= full[2]


@pytest.mark.timeout(300)  # two whole searches of an unbounded machine each
@pytest.mark.parametrize("name", _cases(BROKEN))
def test_broken_machines_break_the_same_properties_as_short(name):
    policy, kw = BROKEN[name]
    full = _verdicts(policy, reduce=False, **kw)
    reduced = _verdicts(policy, reduce=True, **kw)
    assert full[0], "the broken machine must break something"
    assert reduced[0] == full[0]  # same properties, same shortest lengths


#: Small chains: (targets, keys, max_attempts), both searches of each a few seconds; the
#: fuzz profile (`make fuzz`) adds bigger ones and runs many more examples.
SMALL = [(1, 1, 3), (1, 2, 2), (1, 3, 1), (2, 1, 2), (2, 2, 1), (3, 1, 1)]
BIGGER = [(1, 3, 2), (1, 3, 3), (2, 2, 2), (2, 3, 1), (3, 1, 2), (3, 2, 1)]
#: Examples per property test here: a fiftieth of the profile's (ci: 4, fuzz: 100).
EXAMPLES = max(3, settings().max_examples // 50)


@st.composite
def small_policies(draw: st.DrawFn) -> Policy:
    """A small policy: a chain of 1-3 targets with 1-3 keys each, pacing on or off,
    fill_first or round_robin keys on the primary, the defaults' timings or a deadline
    that binds (2 s attempts, 7 s deadline: elapsed is keyed by region)."""
    shapes = SMALL + BIGGER if EXAMPLES > 10 else SMALL
    targets, keys, attempts = draw(st.sampled_from(shapes))
    models: list[Any] = list(numbered(targets))
    if keys > 1 and draw(st.booleans()):
        models[0] = {"model": models[0], "rotation": "round_robin"}
    fields: dict[str, Any] = {"max_attempts": attempts, "pacing": draw(st.booleans())}
    if draw(st.booleans()):
        fields.update(attempt_timeout=2, deadline=7)
    return chain(*models, keys=keys, **fields)


@settings(max_examples=EXAMPLES, deadline=None)
@given(policy=small_policies())
def test_reduced_and_full_searches_agree_on_small_policies(policy):
    """Every reduction of the key, against none, over random small policies: the same
    properties broken (none, on a correct machine), the same declared edges never taken,
    and never more transitions."""
    full = _verdicts(policy, reduce=False)
    reduced = _verdicts(policy, reduce=True)
    assert reduced[0] == full[0] == {}
    assert reduced[1] == full[1]
    assert reduced[2] <= full[2]


#: Broken machines cheap enough to check twice per example.
MUTANTS: dict[str, dict[str, Any]] = {
    "stale fallback index": {"guards": STALE_NEXT_IS},
    "no reserve": {"guards": unreserved()},
    "a self-extending cooldown": {"health_factory": ExtendingHealth},
}


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    mutant=st.sampled_from(sorted(MUTANTS)),
    shape=st.sampled_from([(1, 2, 2), (2, 1, 2), (2, 2, 1), (3, 1, 1)]),
    pacing=st.booleans(),
)
def test_reduced_and_full_searches_break_the_same_properties_on_mutants(mutant, shape, pacing):
    """A broken machine over random small chains: the reduced search breaks exactly the
    properties the full one breaks, with counterexamples of the same shortest length."""
    targets, keys, attempts = shape
    policy = chain(*numbered(targets), keys=keys, max_attempts=attempts, pacing=pacing)
    kw = MUTANTS[mutant]
    full = _verdicts(policy, reduce=False, **kw)
    reduced = _verdicts(policy, reduce=True, **kw)
    assert reduced[0] == full[0]


def test_a_move_back_up_the_chain_is_still_ping_pong():
    policy, kw = BROKEN["back to the primary"]
    report = Checker(policy, **kw).run()
    v = report.violations["no_ping_pong"]
    assert v.why == "went back from fallback_2 to primary"
    assert [t for t, _ in v.steps if t != "cool_target"] == ["start", "overloaded"]


@pytest.mark.slow  # the full search of a long chain: a minute
def test_a_long_chain_is_reduced_well_below_the_full_search():
    policy = chain("m0", "m1", "m2", "m3", keys=2, max_attempts=2)
    full = Checker(policy, reduce=False).run()
    reduced = Checker(policy).run()
    assert reduced.ok and full.ok
    # the chain behind a turn multiplied the configurations of every later target
    assert reduced.transitions * 3 < full.transitions * 2
    assert reduced.states * 2 < full.states


# -- progress ---------------------------------------------------------------------------------


class Ticks:
    """A clock that moves one second per reading."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_progress_is_quiet_before_its_threshold_then_says_states_and_rate():
    lines: list[str] = []
    p = Progress(lines.append, after=3.0, every=2.0, clock=Ticks())  # t0 = 1
    p.tick(10, 20, 5)  # t = 2: 1 s in
    p.tick(20, 40, 5)  # t = 3
    assert lines == []
    p.tick(40, 80, 5)  # t = 4: 3 s in
    assert lines == [
        "still checking: 40 states, 80 transitions explored in 3.0 s (13 states/s), 5 queued"
    ]
    p.tick(50, 90, 5)  # t = 5: next line due at 6
    p.tick(60, 99, 1)  # t = 6
    assert len(lines) == 2 and lines[1].startswith("still checking: 60 states")


def test_progress_refuses_a_negative_threshold():
    with pytest.raises(ValueError, match="after must be >= 0"):
        Progress(print, after=-1.0)


def test_check_prints_progress_on_stderr_and_keeps_stdout_machine_readable(capsys, tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL_POLICY)
    rc = check_main(str(path), as_json=True, progress_after=0.0)
    out, err = capsys.readouterr()
    assert rc == 0
    data = json.loads(out)  # nothing but the report on stdout
    assert data["states"] > 0
    assert "still checking:" in err and "states/s" in err
    assert err.splitlines()[0].startswith("fallgate check: still checking: ")


def test_a_quick_check_prints_no_progress(capsys, tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL_POLICY)
    rc = check_main(str(path), as_json=False, progress_after=3600.0)
    out, err = capsys.readouterr()
    assert rc == 0 and "explored" in out
    assert err == ""


# -- edges a policy cannot take are not declared for it ---------------------------------------


def test_a_one_key_target_declares_no_rotation_and_the_check_lists_none_as_never_taken():
    policy = chain("m0", "m1", keys=[1, 2], max_attempts=2)
    decl = declare(policy)
    rotations = {(t.source, t.trigger) for t in decl.edges() if t.guard is CAN_ROTATE}
    assert rotations == {("fallback_1", k) for k in ("rate_limited", "quota", "auth")}
    report = Checker(policy).run()
    assert report.ok, report.text()
    assert not [u for u in report.unreachable if "another key free" in u]


@pytest.mark.slow  # two whole searches of a deadline-bound policy
def test_elapsed_is_keyed_by_region_where_the_deadline_binds():
    """On the defaults' timings (60 s attempts, 180 s deadline) elapsed values a few
    seconds of backoff apart fall in one gap between the deadline bands: the search
    merges them, and proves the same (the comparison above)."""
    policy = chain("m0", "m1", keys=2)
    full = Checker(policy, reduce=False).run()
    reduced = Checker(policy).run()
    assert reduced.ok and full.ok
    assert reduced.audit.finding is None and reduced.audit.checked > 0
    assert reduced.states * 3 < full.states * 2


# -- what a configuration's key leaves out ------------------------------------------------------


def _on_third_target(checker: Checker) -> Any:
    """A live configuration of `checker`'s turn with an attempt on its third target."""
    from fallgate.fsm.checker.oracle import Obs
    from fallgate.fsm.checker.search import Live
    from fallgate.fsm.checker.steps import Replay, step

    r = Replay(checker.policy)
    for ev in (step("start"), step("not_found"), step("not_found")):
        r.feed(ev)
    turn = r.turns[-1]
    assert turn.s.action.target.index == 2
    obs = Obs(checker.n, 1)
    obs.cur, obs.tried, obs.attempts = 2, (0, 1, 2), (1, 1, 1)
    return Live(turn, r.clock, obs)


def _silent(live: Any, silent: int) -> Any:
    from fallgate.fsm.checker.search import Live

    o = live.obs.copy()
    o.silent = silent
    return Live(live.turn, live.clock, o)


def test_which_earlier_target_was_the_silent_one_is_not_keyed():
    """Whether a target was silent, and whether it is the current one, is keyed; which
    earlier one it was is not (nothing reads it); the full search keys it."""
    from fallgate.fsm.checker.configuration import key

    policy = chain("m0", "m1", "m2")
    reduced, full = Checker(policy), Checker(policy, reduce=False)
    live = _on_third_target(reduced)
    a, b = _silent(live, 0), _silent(live, 1)
    assert key(reduced, a) == key(reduced, b)
    assert key(full, a) != key(full, b)
    assert len({key(reduced, _silent(live, s)) for s in (-1, 0, 2)}) == 3


def test_a_finished_turns_health_class_stops_at_the_second_ready_target():
    """A next turn followed two events starts on the first ready target and falls back
    at most to the next ready one: a target after that is not in the class (a fallback
    before it is); the full search keys every target."""
    from fallgate.fsm.checker.configuration import health_class
    from fallgate.fsm.health.store import HealthStore

    policy = chain("m0", "m1", "m2", "m3")
    reduced, full = Checker(policy), Checker(policy, reduce=False)
    now = 1000.0

    def cooling(j: int | None) -> HealthStore:
        h = HealthStore()
        if j is not None:
            h.open_target(policy.targets[j].key, now + 30.0, now)
        return h

    free, last, second = cooling(None), cooling(3), cooling(1)
    assert health_class(reduced, free, now) == health_class(reduced, last, now)
    assert health_class(full, free, now) != health_class(full, last, now)
    assert health_class(reduced, free, now) != health_class(reduced, second, now)


def test_a_key_out_of_headroom_is_not_ready_for_the_finished_turns_health_class():
    """With pacing, a target whose only key a reply said is out of requests until a reset
    is cooling for the next turn's engine (`HealthStore.ready_at` with the turn's cost):
    the class then goes on to the target after the next ready one, which that turn may
    fall back to."""
    from fallgate.fsm.checker.configuration import health_class
    from fallgate.fsm.checker.pacing import tell
    from fallgate.fsm.health.store import HealthStore

    policy = chain("m0", "m1", "m2", "m3")
    assert policy.pacing
    reduced = Checker(policy)
    now = 1000.0

    def store(cool_third: bool) -> HealthStore:
        h = HealthStore()
        t0 = policy.targets[0]
        tell(h, t0.key, t0.pool()[0].health_id, 0, 20.0, now)
        if cool_third:
            h.open_target(policy.targets[2].key, now + 30.0, now)
        return h

    assert health_class(reduced, store(False), now) != health_class(reduced, store(True), now)
