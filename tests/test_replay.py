"""Recording turns (trace format 1) and replaying them under a policy (`fsm.replay.player`)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from fallgate.fsm import Policy
from fallgate.fsm.clock import VirtualClock
from fallgate.fsm.core.actions import Attempt
from fallgate.fsm.core.turn import Turn
from fallgate.fsm.health.store import HealthStore
from fallgate.fsm.host.loop import host_loop
from fallgate.fsm.host.recorder import record_traces
from fallgate.fsm.host.scripted import play
from fallgate.fsm.kinds import Outcome, OutcomeKind
from fallgate.fsm.policy.model import Target
from fallgate.fsm.replay.player import Assume, ReplayError, replay
from fallgate.fsm.trace import TraceError, from_jsonl, read_turns
from hypothesis import given, note
from hypothesis import strategies as st
from test_properties_fleet import fleet_policies
from test_properties_stateful import policies

from helpers import KEY_PREFIX, chain

KINDS = [k.value for k in OutcomeKind if k is not OutcomeKind.CANCELLED]

#: One scripted request: outcome kind, Retry-After (None: none), latency.
request = st.tuples(
    st.sampled_from(KINDS),
    st.sampled_from([None, 0.0, 1.0, 2.5, 20.0, 400.0]),
    st.sampled_from([0.0, 0.01, 0.2, 1.0, 3.5, 40.0]),
)
#: One turn: the pause before it, its requests, whether its client rebuilds fail.
turn_script = st.tuples(
    st.sampled_from([0.0, 0.5, 3.0, 30.0]),
    st.lists(request, max_size=12),
    st.booleans(),
)


class Oversleeping(VirtualClock):
    """A virtual clock whose sleeps last `extra` seconds longer (as a busy host's do)."""

    __slots__ = ("extra",)

    def __init__(self, extra: float) -> None:
        super().__init__()
        self.extra = extra

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds + self.extra)


def record(policy: Policy, turns: list[Any], seed: int, host: float = 0.0) -> str:
    """Run `turns` one after another on one virtual clock and health store, with a seeded
    random source, recording them; the trace file's text. `host` > 0: every sleep
    oversleeps and every client rebuild takes that long."""
    lines: list[str] = []
    clock = Oversleeping(host) if host else VirtualClock()
    health = HealthStore()
    rnd = random.Random(seed).random
    with record_traces(lines.append):
        for pause, script, rebuild_fails in turns:
            clock.advance(pause)
            todo = list(script)

            def attempt(a: Attempt, todo: list[Any] = todo) -> Outcome:
                kind, ra, latency = todo.pop(0) if todo else ("success", None, 0.1)
                if latency > a.timeout:  # as a real client: cut at the attempt's timeout
                    clock.advance(a.timeout)
                    return Outcome("transport", detail="timed out")
                clock.advance(latency)
                status = 429 if kind == "rate_limited" else None
                partial = "half an answer" if kind == "stream_interrupted" else None
                return Outcome(kind, status=status, retry_after=ra, detail=kind, partial=partial)

            def rebuild(t: Target, fails: bool = rebuild_fails) -> None:
                clock.advance(host)
                if fails:
                    raise ConnectionError("the client could not be rebuilt")

            turn = Turn(policy, health=health, clock=clock.now, random=rnd)
            for _ in host_loop(turn, clock=clock, rebuild=rebuild, attempt=attempt):
                pass
    return "".join(lines)


def steps(trace: Any) -> list[tuple[Any, ...]]:
    """What must be reproduced of each transition: the move, its time and its wait."""
    return [
        (
            e.seq,
            e.source,
            e.event,
            e.dest,
            e.action,
            e.target,
            e.model,
            e.credential,
            e.wait,
            round(e.time, 6),
        )
        for e in trace
    ]


@given(
    policy=policies() | fleet_policies(),
    turns=st.lists(turn_script, min_size=1, max_size=4),
    seed=st.integers(0, 2**32),
    replay_seed=st.integers(0, 2**32),
)
def test_replaying_under_the_recording_policy_reproduces_the_recording(
    policy: Policy, turns: list[Any], seed: int, replay_seed: int
) -> None:
    """Property: turns recorded on a virtual clock (any policy, fleet health rules included;
    any outcomes, Retry-After values and latencies; pauses between turns), written as JSON
    lines and read back, replay under the recording policy with exactly the recorded
    transitions, times, waits, requests and end states, and no assumption, whatever the
    replay's seed."""
    text = record(policy, turns, seed)
    note(text)
    report = replay(text, policy, seed=replay_seed)
    recorded = read_turns(text)
    assert [t.turn for t in report.turns] == [t.id for t in recorded]
    for rec, t in zip(recorded, report.turns, strict=True):
        assert steps(t.replayed.trace) == steps(rec.events)
        assert t.same_path
        assert t.replayed.waits == t.recorded.waits
        assert t.replayed.requests == t.recorded.requests
        assert t.replayed.end == t.recorded.end
        assert t.replayed.seconds == t.recorded.seconds
        assert t.assumptions == () and t.stopped is None
    assert report.replayed == report.recorded


@given(
    policy=policies() | fleet_policies(),
    turns=st.lists(turn_script, min_size=1, max_size=4),
    seed=st.integers(0, 2**32),
    host=st.sampled_from([0.003, 0.05, 0.25]),
)
def test_a_hosts_own_time_replays_as_recorded(
    policy: Policy, turns: list[Any], seed: int, host: float
) -> None:
    """Property: when the recording host overslept its waits and took time to rebuild its
    clients (as a real host on the system clock does), a replay under the recording
    policy still takes the recorded path, with the recorded times to the microsecond."""
    text = record(policy, turns, seed, host)
    note(text)
    for rec, t in zip(read_turns(text), replay(text, policy).turns, strict=True):
        assert [s[:-1] for s in steps(t.replayed.trace)] == [s[:-1] for s in steps(rec.events)]
        for a, b in zip(t.replayed.trace, rec.events, strict=True):
            assert abs(a.time - b.time) <= 1e-5
        assert t.assumptions == ()


@given(
    recording=policies() | fleet_policies(),
    other=policies() | fleet_policies(),
    turns=st.lists(turn_script, min_size=1, max_size=3),
    seed=st.integers(0, 2**32),
)
def test_a_replay_under_another_policy_is_deterministic_given_its_seed(
    recording: Policy, other: Policy, turns: list[Any], seed: int
) -> None:
    """Property: replaying the same recording under any policy twice with one seed gives the
    same report (the seeded jitter and outcome-mix draws), assumptions included; each
    request a replayed turn made off its recorded path is listed as an assumption."""
    text = record(recording, turns, seed)
    try:
        first = replay(text, other, seed=seed)
    except ReplayError as e:
        assert "match no recorded target" in str(e)
        return
    assert replay(text, other, seed=seed).to_json() == first.to_json()
    for t in first.turns:
        if t.same_path:
            continue
        made = sum(t.replayed.requests.values())
        assert len(t.assumptions) >= 1 or made <= sum(t.recorded.requests.values())


# -- scenarios -----------------------------------------------------------------------------------


def two_targets(**kw: Any) -> Policy:
    return chain("a", "b", **kw)


def recorded(policy: Policy, *scripts: list[str], pause: float = 3.0, latency: float = 0.3) -> str:
    lines: list[str] = []
    clock = VirtualClock()
    health = HealthStore()
    with record_traces(lines.append):
        for script in scripts:
            play(policy, script, clock=clock, health=health, attempt_seconds=latency, random=0.5)
            clock.advance(pause)
    return "".join(lines)


def test_a_recording_names_its_turn_on_every_line_and_never_a_key() -> None:
    policy = two_targets(keys=2)
    text = recorded(policy, ["rate_limited:20", "success"], ["success"])
    objs = [json.loads(line) for line in text.splitlines()]
    heads = [o for o in objs if "v" in o]
    assert len(heads) == 2 and {h["v"] for h in heads} == {1}
    ids = {h["turn"] for h in heads}
    assert all(o["turn"] in ids for o in objs)
    assert heads[0]["targets"][0]["credentials"] == ["key#1", "key#2"]
    assert KEY_PREFIX not in text
    first_request = next(o for o in objs if "latency" in o)
    assert first_request["event"] == "rate_limited"
    assert first_request["retry_after"] == 20.0 and first_request["latency"] == pytest.approx(0.3)


def test_waiting_out_a_retry_after_replays_faster_with_a_fallback_assumed() -> None:
    waiting = two_targets(prefer_waiting=True, retry_after_cap=30)
    text = recorded(waiting, ["rate_limited:20", "success"])
    report = replay(text, two_targets(), assume={"b": "success:0.4"})
    (t,) = report.turns
    assert t.recorded.requests == {"a": 2} and t.recorded.seconds > 20
    assert t.replayed.requests == {"a": 1, "b": 1}
    assert t.replayed.seconds == pytest.approx(0.7)
    assert [a.what for a in t.assumptions] == ["assumed success:0.4 (given)"]
    assert t.assumptions[0].target == "fallback_1" and t.assumptions[0].at == pytest.approx(0.3)


def test_a_target_never_recorded_stops_the_turn_unless_an_assumption_is_given() -> None:
    text = recorded(two_targets(prefer_waiting=True), ["rate_limited:20", "success"])
    (t,) = replay(text, two_targets()).turns
    assert t.replayed.end == "unknown" and t.saved is None
    assert t.replayed.requests == {"a": 1}
    assert "never recorded" in (t.stopped or "")


def test_off_the_recorded_path_a_backend_answers_as_it_last_did_with_retry_after_shortened() -> (
    None
):
    # recorded with one key: a 429 with Retry-After 20, waited out. With a second key the
    # policy rotates at 0.3 s, off the recorded path: the backend's latest answer then is
    # that 429, with 19.7 s left of its Retry-After.
    text = recorded(two_targets(prefer_waiting=True), ["rate_limited:20", "success"])
    (t,) = replay(text, two_targets(prefer_waiting=True, keys=2)).turns
    assert t.replayed.trace[1].credential == "key#2"
    first = t.assumptions[0]
    assert (first.target, first.at) == ("primary", 0.3)
    assert "answered as a answered turn" in first.what and "Retry-After 19.7s" in first.what


def test_health_carries_across_turns_in_a_replay() -> None:
    # Two turns 3 s apart; the first saw a quota error (a cooldown on a). Replayed under
    # the same policy, the second skips a exactly as recorded.
    policy = two_targets()
    text = recorded(policy, ["quota", "success"], ["success"])
    rep = replay(text, policy)
    assert [t.replayed.requests for t in rep.turns] == [{"a": 1, "b": 1}, {"b": 1}]
    assert all(t.same_path for t in rep.turns)
    # replayed without the first turn, the second asks a (which that recording never
    # saw answer): the skip came from the health the first turn left
    alone = replay(read_turns(text)[1:], policy).turns[0]
    assert alone.assumptions[0].target == "primary" and alone.replayed.end == "unknown"


def test_a_request_slower_than_the_new_attempt_timeout_times_out() -> None:
    text = recorded(two_targets(), ["success"], latency=8.0)
    (t,) = replay(text, two_targets(attempt_timeout=5), assume={"b": "success:1"}).turns
    assert t.replayed.trace[1].event == "transport"
    # each retry is answered as a last answered (8 s): every one times out, then b
    assert t.replayed.requests == {"a": 3, "b": 1}


def test_assumptions_parse_and_refuse_nonsense() -> None:
    assert Assume.parse("success:0.4") == Assume("success", 0.4)
    assert Assume.parse("rate_limited:0.1:20") == Assume("rate_limited", 0.1, 20.0)
    assert str(Assume.parse("unknown")) == "unknown"
    for bad in ("succes:1", "success", "success:-1", "success:x", "unknown:3", "cancelled:1"):
        with pytest.raises(ValueError):
            Assume.parse(bad)


def test_old_traces_read_for_diagrams_but_replay_refuses_them() -> None:
    played = play(two_targets(), ["transport", "success"])
    old = "".join(e.to_json() + "\n" for e in played.trace)
    assert from_jsonl(old) == list(played.trace)
    with pytest.raises(ReplayError, match="without turn lines") as info:
        replay(old, two_targets())
    assert info.value.line == 1


def test_a_multi_turn_file_gives_one_turn_to_a_diagram() -> None:
    text = recorded(two_targets(), ["transport", "success"], ["success"])
    ids = [t.id for t in read_turns(text)]
    assert [e.seq for e in from_jsonl(text)] == [1, 2, 3, 4]
    assert [e.seq for e in from_jsonl(text, ids[1])] == [1, 2]
    with pytest.raises(TraceError, match="no turn 'nope'"):
        from_jsonl(text, "nope")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"v": 2, "turn": "x"}', "version 2 is not supported"),
        ('{"v": 1, "turn": "x"}', "turn line: missing start"),
        (
            '{"v": 1, "turn": "x", "start": NaN, "clock": 0, "domain": "d", "first": 0, '
            '"targets": []}',
            "turn line: start must be a finite number",
        ),
        (
            '{"seq": 1, "time": 0, "source": "idle", "event": "start", "dest": "a", '
            '"action": "Attempt", "turn": "ghost"}',
            "whose turn line has not come",
        ),
        (
            '{"seq": "1", "time": 0, "source": "idle", "event": "s", "dest": "a", "action": "A"}',
            "seq must be an integer",
        ),
        ("[1, 2]", "expected an object"),
        ("{nope", "not JSON"),
        (
            '{"v": 1, "turn": "x", "start": 0, "clock": 0, "domain": "d", "first": 2, '
            '"targets": [{"name": "primary", "provider": "p", "model": "m", "endpoint": "e"}]}',
            "turn line: first = 2 is not a position of its 1 targets",
        ),
        (
            '{"seq": 1, "time": 0, "source": "idle", "event": "s", "dest": "a", "action": "A", '
            '"draws": [NaN]}',
            r"draws must be numbers in \[0, 1\)",
        ),
        (
            '{"seq": 1, "time": 0, "source": "idle", "event": "s", "dest": "a", "action": "A", '
            '"draws": [5.0]}',
            r"draws must be numbers in \[0, 1\)",
        ),
        (
            '{"seq": 1, "time": 0, "source": "a", "event": "s", "dest": "a", "action": "Wait", '
            '"wait": -1}',
            "wait must be seconds >= 0",
        ),
    ],
)
def test_a_bad_trace_line_is_named(line: str, message: str) -> None:
    good = recorded(two_targets(), ["success"])
    text = good + line + "\n"
    with pytest.raises(TraceError, match=message) as info:
        read_turns(text)
    assert info.value.line == len(good.splitlines()) + 1


def test_a_policy_matching_no_recorded_target_is_refused() -> None:
    text = recorded(two_targets(), ["success"])
    with pytest.raises(ReplayError, match="match no recorded target"):
        replay(text, chain("x", "y"))


def _shift_turn(text: str, n: int, clock: float) -> str:
    """The trace with turn `n`'s (0-based) start moved to clock reading `clock`."""
    out = []
    seen = -1
    for line in text.splitlines():
        obj = json.loads(line)
        if "v" in obj:
            seen += 1
            if seen == n:
                obj["clock"] = clock
                line = json.dumps(obj)
        out.append(line)
    return "\n".join(out) + "\n"


def test_overlapping_turns_replay_in_time_order_with_health_shared_as_it_happens() -> None:
    # turn 2 starts 5 s into turn 1 (as two workers would): under the default rules turn
    # 1 falls back at 0.3 s and leaves a's Retry-After cooldown, which turn 2 meets at 5 s
    # although turn 1's recording ran until 21 s.
    waiting = two_targets(prefer_waiting=True)
    text = recorded(waiting, ["rate_limited:20", "success"], ["success"])
    start = read_turns(text)[0].header
    assert start is not None
    overlapping = _shift_turn(text, 1, start.clock + 5.0)
    rules = {"b": "success:0.4"}
    turns = replay(overlapping, two_targets(), assume=rules).turns
    assert [t.start for t in turns] == [0.0, 5.0]
    assert [t.replayed.requests for t in turns] == [{"a": 1, "b": 1}, {"b": 1}]
    # the same turns far apart: the cooldown is over when turn 2 starts
    apart = replay(_shift_turn(text, 1, start.clock + 60.0), two_targets(), assume=rules).turns
    assert [t.replayed.requests for t in apart] == [{"a": 1, "b": 1}, {"a": 1}]


def test_turns_interleaved_line_by_line_read_as_their_turns() -> None:
    text = recorded(two_targets(), ["transport", "success"], ["overloaded", "success"])
    turns = read_turns(text)
    a = [ln for ln in text.splitlines() if turns[0].id in ln]
    b = [ln for ln in text.splitlines() if turns[1].id in ln]
    mixed = [x for pair in zip(a, b, strict=False) for x in pair] + a[len(b) :] + b[len(a) :]
    again = read_turns("\n".join(mixed) + "\n")
    assert [(t.id, t.events) for t in again] == [(t.id, t.events) for t in turns]
    mixed_report = replay("\n".join(mixed) + "\n", two_targets())
    assert mixed_report.to_json() == replay(text, two_targets()).to_json()


def test_a_sink_that_fails_never_fails_the_turn(caplog: pytest.LogCaptureFixture) -> None:
    def broken(text: str) -> None:
        raise OSError("disk full")

    with record_traces(broken) as rec:
        for _ in range(2):
            assert play(two_targets(), ["success"]).state == "done"
    assert rec.turns == 0
    assert [r.message for r in caplog.records].count(
        "fallgate: cannot record a turn to " + repr(broken) + ": disk full"
    ) == 1


def test_recording_to_a_directory_is_refused_at_once_naming_it(tmp_path: Any) -> None:
    with pytest.raises(IsADirectoryError, match=f"cannot record turns to {tmp_path}: it is a"):
        record_traces(tmp_path)


def test_failed_and_async_turns_are_recorded_too(tmp_path: Any) -> None:
    import asyncio

    from fallgate.fsm import arun

    out = tmp_path / "turns.jsonl"
    with record_traces(out):
        assert play(two_targets(), ["bad_request"]).state == "failed"

        async def call(target: Target, cred: Any) -> str:
            return "ok"

        asyncio.run(arun(two_targets(), call, clock=VirtualClock(), health=HealthStore()))
    turns = read_turns(out.read_text())
    assert [t.events[-1].dest for t in turns] == ["failed", "done"]
    assert [t.header.first for t in turns if t.header] == [0, 0]


@pytest.mark.parametrize("pause", [0.0, 0.5, 3.0, 30.0])
def test_an_answer_that_ends_at_the_deadline_replays_as_an_answer(pause: float) -> None:
    """The primary's 1 s attempt times out, then the fallback's 0.1 s answer ends at the
    1.1 s deadline: on the clock, after a pause, that is a hair past it (float dust), and
    the replay read the recorded latency as past its attempt's bound (a timeout)."""
    policy = Policy.from_dict(
        {
            "primary": {"provider": "p0", "model": "m0", "base_url": "https://p0.test/v1",
                        "api_key": "k0-0123456789"},
            "fallback_providers": [{"provider": "p1", "model": "m1",
                                    "base_url": "https://p1.test/v1", "api_key": "k1-0123456789"}],
            "max_attempts": 1,
            "deadline": 1.1,
            "attempt_timeout": 1,
            "backoff": {"initial": 0, "cap": 0, "jitter": False},
        }
    )  # fmt: skip
    text = record(policy, [(pause, [("transport", None, 3.5), ("success", None, 0.1)], False)], 1)
    report = replay(text, policy, seed=1)
    (turn,) = report.turns
    assert turn.recorded.end == "done"
    assert turn.same_path and turn.replayed.end == "done"


@pytest.mark.parametrize("shared", [False, True], ids=["a-store-each", "one-store"])
def test_turns_recorded_on_two_stores_replay_on_two_stores(shared: bool) -> None:
    """Two workers, each with its own health store, one recording: worker A's 429 benched
    the primary for A only, and worker B's turn 3 s later was answered by the primary.
    Under the recording policy both replay their recorded paths; had the workers shared
    one store, B would have skipped the primary, and so it does in the replay."""
    policy = two_targets()
    lines: list[str] = []
    clock = VirtualClock()
    a, b = HealthStore(), HealthStore()
    with record_traces(lines.append):
        play(policy, ["quota", "success"], clock=clock, health=a, attempt_seconds=0.3)
        clock.advance(3.0)
        play(policy, ["success"], clock=clock, health=a if shared else b, attempt_seconds=0.3)
    text = "".join(lines)
    stores = {h["store"] for h in map(json.loads, text.splitlines()) if "v" in h}
    assert len(stores) == (1 if shared else 2)
    turns = replay(text, policy).turns
    assert all(t.same_path for t in turns), [t.replayed.requests for t in turns]
    assert turns[1].replayed.requests == ({"b": 1} if shared else {"a": 1})


def test_a_recording_that_names_no_store_replays_on_one() -> None:
    """Recordings made before turn lines named their store: every turn on one store."""
    policy = two_targets()
    lines: list[str] = []
    clock = VirtualClock()
    with record_traces(lines.append):
        play(policy, ["quota", "success"], clock=clock, health=HealthStore(), attempt_seconds=0.3)
        clock.advance(3.0)
        play(policy, ["success"], clock=clock, health=HealthStore(), attempt_seconds=0.3)
    heads_without_store = []
    for line in "".join(lines).splitlines():
        obj = json.loads(line)
        obj.pop("store", None)
        heads_without_store.append(json.dumps(obj))
    turns = replay("\n".join(heads_without_store) + "\n", policy).turns
    assert turns[1].replayed.requests == {"b": 1}  # the first turn's cooldown, as before


def test_a_boolean_is_not_a_trace_format_version() -> None:
    head = json.loads(recorded(two_targets(), ["success"]).splitlines()[0])
    head["v"] = True
    with pytest.raises(TraceError, match="version True is not supported"):
        read_turns(json.dumps(head) + "\n")


def test_a_timeout_recorded_a_little_past_its_bound_replays_as_recorded_not_as_time_saved() -> (
    None
):
    """A real client notices its timeout a little late (the bound's lag, some ms): the
    recorded attempt took 0.546 s on a 0.5 s bound. Under the recording policy it is the
    same timeout at the same instant: nothing saved, every time as recorded."""
    policy = two_targets(attempt_timeout=0.5)
    lines: list[str] = []
    clock = VirtualClock()

    def attempt(a: Attempt) -> Outcome:
        if a.target.model == "a":
            clock.advance(a.timeout + 0.046)
            return Outcome("transport", detail="timed out")
        clock.advance(0.2)
        return Outcome("success", value="ok")

    with record_traces(lines.append):
        turn = Turn(policy, health=HealthStore(), clock=clock.now, random=lambda: 0.5)
        for _ in host_loop(turn, clock=clock, attempt=attempt):
            pass
    (t,) = replay("".join(lines), policy).turns
    assert t.same_path
    assert t.replayed.seconds == pytest.approx(t.recorded.seconds, abs=1e-6)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda lines: [lines[0], lines[2], lines[1], *lines[3:]], "seq 2 of turn .* where seq 1"),
        (lambda lines: [lines[0], lines[1], lines[1], *lines[2:]], "seq 1 of turn .* where seq 2"),
        (lambda lines: [lines[0], *lines[2:]], "seq 2 of turn .* where seq 1"),
    ],
    ids=["swapped", "repeated", "missing"],
)
def test_a_reordered_or_edited_recording_is_refused_naming_the_line(edit: Any, says: str) -> None:
    text = recorded(two_targets(), ["rate_limited:20", "success"])
    lines = text.splitlines()
    with pytest.raises(ReplayError, match=says):
        replay("\n".join(edit(lines)) + "\n", two_targets())


def test_a_transition_that_leaves_another_state_than_the_last_entered_is_refused() -> None:
    lines = recorded(two_targets(), ["rate_limited:20", "success"]).splitlines()
    second = json.loads(lines[2])
    second["source"] = "fallback_1"
    lines[2] = json.dumps(second)
    with pytest.raises(ReplayError, match="leaves 'fallback_1', but the one before it entered"):
        replay("\n".join(lines) + "\n", two_targets())
