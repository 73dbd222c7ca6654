"""Bad input is named, never crashes, hangs or eats the machine (issue 14, findings 9, 10).

Every bad policy, fault script, trace or request below gets one message naming the
problem (the file and line where there is one): `PolicyError` / `ScriptError` from the
API, exit status 2 and a message from the CLI, a 400 from the fault server. Never an
"internal error", a raw exception from inside the engine, or a hang. A chain is at most
`MAX_TARGETS` long, and its declaration grows linearly with it.
"""

from __future__ import annotations

import functools
import http.client
import itertools
import json
import os
import resource
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from fallgate.fsm import HealthStore, Policy, PolicyError, Turn
from fallgate.fsm.catalogue.retry_after import parse_retry_after
from fallgate.fsm.clock import VirtualClock
from fallgate.fsm.core.machine import FanOut, declare
from fallgate.fsm.host.scripted import ScriptExhausted, play
from fallgate.fsm.kinds import MAX_RETRY_AFTER
from fallgate.fsm.policy.model import MAX_SECONDS, MAX_TARGETS, Credential, Target
from fallgate.providers import Fallgate
from fallgate.providers.cli import main
from fallgate.providers.testing.fault_server import (
    FaultServer,
    ScriptError,
    load_script,
    parse_script,
)
from hypothesis import given
from hypothesis import strategies as st

from helpers import chain, numbered

PRIMARY = '[primary]\nprovider = "openai"\nmodel = "gpt-4.1"\nkey_env = "OPENAI_API_KEY"\n'


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return code, err


def finishes(fn: Callable[[], Any], seconds: float = 10.0) -> Any:
    """fn() run in a thread: its result (or the exception it raised); fails if it is
    still running after `seconds` (a read blocked on a named pipe, say)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:
            box.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert box, f"still running after {seconds} s: it hangs"
    return box[0]


def _capped(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`argv` run with its memory capped at 2 GB (a runaway input must not take the
    machine with it), killed after `timeout` seconds."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=cap,
        env={**os.environ, "FALLGATE_DEBUG": ""},
    )


def cli_process(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The CLI in its own, memory-capped process."""
    return _capped([sys.executable, "-m", "fallgate.providers.cli", *argv], timeout)


def in_process_of_its_own(code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Python `code` in its own, memory-capped process."""
    return _capped([sys.executable, "-c", code], timeout)


# -- policy files that are not policies --------------------------------------------------------

#: name -> (file content, words the message must hold)
BAD_FILES: dict[str, tuple[bytes, tuple[str, ...]]] = {
    "binary": (bytes(range(256)) * 8, ("not UTF-8", "binary")),
    "a 400-digit number": (
        f"attempt_timeout = {'9' * 400}\n{PRIMARY}".encode(),
        ("line 1", "attempt_timeout", "at most 86400 seconds"),
    ),
    "a 5000-digit number": (f"deadline = {'9' * 5000}\n{PRIMARY}".encode(), ("not valid TOML",)),
    "arrays nested 3000 deep": (
        f"{PRIMARY}x = {'[' * 3000}{']' * 3000}\n".encode(),
        ("nested too deeply",),
    ),
    "larger than 1 MiB": (
        f"{PRIMARY}# {'x' * (1 << 20)}\n".encode(),
        ("larger than 1 MiB",),
    ),
}


@pytest.mark.parametrize("command", ["check", "diagram"])
@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_file_that_is_no_policy_is_named_with_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, name: str
) -> None:
    content, words = BAD_FILES[name]
    path = tmp_path / "policy.toml"
    path.write_bytes(content)
    code, err = cli(capsys, command, str(path))
    assert code == 2
    assert str(path) in err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_the_api_raises_policy_error_for_a_file_that_is_no_policy(
    tmp_path: Path, name: str
) -> None:
    content, words = BAD_FILES[name]
    path = tmp_path / "policy.toml"
    path.write_bytes(content)
    with pytest.raises(PolicyError) as e:
        Policy.from_toml(path)
    assert len(e.value.problems) == 1
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_a_named_pipe_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "policy.toml"
    os.mkfifo(fifo)
    try:
        raised = finishes(lambda: Policy.from_toml(fifo))
        assert isinstance(raised, PolicyError), raised
        assert "a named pipe, not a regular file" in str(raised)
        proc = cli_process("check", str(fifo), timeout=30)
        assert proc.returncode == 2
        assert "a named pipe" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        # release a reader that did block (the old behaviour), so no thread is left behind
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK) if _has_reader(fifo) else None
        if fd is not None:
            os.close(fd)


def _has_reader(fifo: Path) -> bool:
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("command", ["check", "diagram"])
def test_dev_zero_is_refused_at_once_not_read_until_memory_runs_out(command: str) -> None:
    proc = cli_process(command, "/dev/zero", timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert "/dev/zero" in proc.stderr and "a character device" in proc.stderr
    assert "MemoryError" not in proc.stderr and "internal error" not in proc.stderr


def test_the_api_refuses_dev_zero_with_a_policy_error() -> None:
    code = (
        "from fallgate.fsm import Policy, PolicyError\n"
        "try:\n    Policy.from_toml('/dev/zero')\n"
        "except PolicyError as e:\n    print(e)\n"
    )
    proc = in_process_of_its_own(code)
    assert proc.returncode == 0, proc.stderr[-300:]
    assert "/dev/zero: cannot read policy file: a character device" in proc.stdout


def test_a_trace_that_is_a_named_pipe_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fifo = tmp_path / "turn.jsonl"
    os.mkfifo(fifo)
    code, err = finishes(lambda: cli(capsys, "diagram", "--trace", str(fifo)))
    assert code == 2
    assert "cannot read trace file" in err and "a named pipe" in err


def test_a_trace_nested_too_deeply_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "turn.jsonl"
    trace.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    code, err = cli(capsys, "diagram", "--trace", str(trace))
    assert code == 2
    assert f"{trace}:1: nested too deeply to be a trace" in err


def test_the_api_names_a_huge_number_and_deep_nesting_given_as_data() -> None:
    with pytest.raises(PolicyError) as e:
        chain("m", attempt_timeout=10**400, cooldown={"cap": 10**400}, max_attempts=10**400)
    assert {p.path for p in e.value.problems} == {"attempt_timeout", "cooldown.cap", "max_attempts"}
    nested: list[Any] = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(PolicyError, match="nested too deeply"):
        Policy.from_dict({"primary": {"provider": "openai", "model": "m", "rotation": nested}})


# -- the chain's length ---------------------------------------------------------------------------


def test_a_chain_of_the_limit_is_accepted_and_one_more_is_refused_with_one_problem() -> None:
    assert len(chain(*numbered(MAX_TARGETS)).targets) == MAX_TARGETS
    with pytest.raises(PolicyError) as e:
        chain(*numbered(MAX_TARGETS + 1))
    (problem,) = e.value.problems
    assert problem.path == "fallback_providers"
    assert f"{MAX_TARGETS + 1} targets" in problem.message
    assert f"at most {MAX_TARGETS}" in problem.message and "square" in problem.message
    many = [Target("p", f"m{i}", "https://p.test/v1", keyless=True) for i in range(10_000)]
    with pytest.raises(PolicyError) as e:
        Policy(targets=many)
    assert [p.path for p in e.value.problems] == ["targets"]


def test_ten_thousand_fallbacks_are_one_line_of_error_not_an_out_of_memory(tmp_path: Path) -> None:
    fallback = '[[fallback_providers]]\nprovider = "openai"\nmodel = "m{}"\n'
    text = PRIMARY + "".join(fallback.format(i) for i in range(10_000))
    path = tmp_path / "long.toml"
    path.write_text(text)
    for command in ("check", "diagram"):
        proc = cli_process(command, str(path), timeout=60)
        assert proc.returncode == 2, proc.stderr[-500:]
        assert "line 5: fallback_providers: 10001 targets" in proc.stderr
        assert f"at most {MAX_TARGETS}" in proc.stderr


def test_the_declaration_grows_linearly_with_the_chain() -> None:
    """Declared items per chain length: the differences are constant (linear), while
    the edges they stand for still give every target an edge to every later one."""
    declared = [len(declare(chain(*numbered(n))).transitions) for n in range(2, 9)]
    steps = {b - a for a, b in itertools.pairwise(declared)}
    assert len(steps) == 1, declared
    # the worst case for moves back after an overflow: known and unknown lengths alternate
    mixed = [f"m{i}@{8000 + i}" if i % 2 == 0 else f"u{i}" for i in range(40)]
    pairs = [len(declare(chain(*mixed[:n])).transitions) for n in range(4, 41, 2)]
    assert len({b - a for a, b in itertools.pairwise(pairs)}) == 1, pairs
    edges = [sum(1 for _ in declare(chain(*numbered(n))).edges()) for n in range(2, 9)]
    growth = [b - a for a, b in itertools.pairwise(edges)]
    assert len({b - a for a, b in itertools.pairwise(growth)}) == 1  # quadratic
    assert growth[-1] > growth[0]


OUTCOMES = [
    "transport",
    "rate_limited",
    "rate_limited:3",
    "quota",
    "overloaded",
    "overloaded:2",
    "context_too_long",
    "auth",
    "not_found",
    "bad_request",
    "stream_interrupted",
    "success",
]


def _played(
    policy: Policy, outcomes: list[str], expanded: bool, cooling: dict[int, float] | None = None
) -> list[Any]:
    """Two turns on one health store (the second starts with targets cooling);
    `cooling`: target index -> seconds it is benched for before the first turn."""
    decl = declare(policy)
    if expanded:
        decl = attrs.evolve(decl, transitions=tuple(decl.edges()))
    engine = functools.partial(Turn, declaration=decl)
    health, clock = HealthStore(), VirtualClock()
    for j, seconds in (cooling or {}).items():
        health.open_target(policy.targets[j].key, clock.now() + seconds, clock.now())
    out: list[Any] = []
    for _ in range(2):
        try:
            p = play(policy, outcomes, health=health, clock=clock, engine=engine)  # type: ignore[arg-type]
            out.append((p.state, p.targets, p.credentials, p.waits, p.trace))
        except ScriptExhausted as e:
            out.append(str(e))
        clock.advance(1)
    return out


FAN_POLICY = chain("m0@8000", "m1@4000", "m2@16000", "m3@4000", "m4@32000", keys=2, max_attempts=2)
#: Unknown context lengths after known ones: after an overflow the turn may move back
#: up the chain to one passed over (the back fan-outs).
BACK_POLICY = chain("m0@8000", "m1", "m2@16000", "m3", "m4@4000", "m5", max_attempts=2)


@pytest.mark.parametrize("policy", [FAN_POLICY, BACK_POLICY], ids=["known", "unknown"])
@given(outcomes=st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=14))
def test_a_fan_out_takes_the_edge_its_edges_tried_one_by_one_would(
    policy: Policy, outcomes: list[str]
) -> None:
    """For any outcome sequence, the compiled executor asking each fan-out's guard for
    its target once takes the same path (states, targets, keys, waits, trace) as the
    same machine with every fan-out listed edge by edge."""
    assert _played(policy, outcomes, False) == _played(policy, outcomes, True)


def test_a_move_back_up_the_chain_after_an_overflow_is_one_fan_out() -> None:
    """m4 (4000) overflows with m1 and m3 (unknown) passed over for m2 (16000): the turn
    may move back to them, declared as one fan-out per (state, event), not per edge."""
    played = play(BACK_POLICY, ["context_too_long", "context_too_long", "success"])
    assert played.models == ["m0", "m2", "m1"]  # m2 known larger first, then back to m1
    decl = declare(BACK_POLICY)
    back = [
        t
        for t in decl.transitions
        if isinstance(t, FanOut) and t.source == "fallback_4" and t.trigger == "quota"
    ]
    assert [[e.dest for e in f.edges()] for f in back] == [
        ["fallback_5"],
        ["fallback_1", "fallback_3"],
    ]


@pytest.mark.parametrize(
    ("cooling", "first"),
    [
        ({0: 60, 1: 60}, "fallback_2"),  # the first not cooling
        ({0: 60, 1: 9, 2: 60, 3: 5, 4: 60}, "fallback_3_cooling"),  # all cooling: the soonest
        ({0: 60, 1: 90, 2: 60, 3: 45, 4: 60}, "failed"),  # soonest beyond the Retry-After cap
    ],
)
def test_turn_start_fan_outs_pick_what_their_edges_would(
    cooling: dict[int, float], first: str
) -> None:
    compiled = _played(FAN_POLICY, ["success"], False, cooling)
    assert compiled == _played(FAN_POLICY, ["success"], True, cooling)
    assert compiled[0][4][0].dest == first


# -- names and URLs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        ({"model": "gpt\n4"}, "primary.model", "control characters (found '\\n' at position 3)"),
        ({"model": "gpt\x004"}, "primary.model", "control characters (found '\\x00'"),
        ({"model": "gpt\u202e4"}, "primary.model", "control characters (found '\\u202e'"),
        ({"provider": "open\rai", "base_url": "https://h/v1"}, "primary.provider", "control"),
        ({"base_url": "http://a b"}, "primary.base_url", "found a space at position 8"),
        ({"base_url": "http://a\tb/v1"}, "primary.base_url", "found '\\t'"),
        ({"base_url": "ftp://host/v1"}, "primary.base_url", "http:// or https:// URL"),
        ({"base_url": "https:///v1"}, "primary.base_url", "with a host"),
        ({"base_url": "http://h:99999/v1"}, "primary.base_url", "Port out of range"),
        ({"base_url": "http://h:port/v1"}, "primary.base_url", "URL"),
    ],
)
def test_a_name_or_url_that_would_break_a_line_or_a_request_is_refused(
    entry: dict[str, Any], field: str, words: str
) -> None:
    data = {"provider": "openai", "model": "m", "key_env": "OPENAI_API_KEY", **entry}
    with pytest.raises(PolicyError) as e:
        Policy.from_dict({"primary": data})
    assert [p.path for p in e.value.problems] == [field]
    assert words in str(e.value)


def test_a_provider_table_name_or_credential_id_with_a_control_character_is_refused() -> None:
    with pytest.raises(PolicyError) as e:
        chain("m", providers={"loc\nal": {"base_url": "http://127.0.0.1:1/v1"}})
    (problem,) = e.value.problems
    assert "provider name must not hold control characters" in problem.message
    assert "\n" not in str(problem)  # shown as 'loc\nal': the message stays one line
    with pytest.raises(PolicyError, match="id = 'key\\\\n1': must not hold control"):
        Credential(id="key\n1", env="OPENAI_API_KEY")


def test_a_newline_in_a_model_is_named_with_its_line_by_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[primary]\nprovider = "openai"\nkey_env = "K"\nmodel = "a\\nb"\n')
    code, err = cli(capsys, "diagram", str(path))
    assert code == 2
    assert "line 4: primary.model = 'a\\nb': must not hold control characters" in err


def test_printable_odd_names_are_kept_and_still_draw_a_valid_dot_diagram() -> None:
    from fallgate.fsm.diagram import render as diagram
    from fallgate.providers.cli.gallery import have_dot

    odd = 'a"b\\c<d>{e}|f#g;h%x'
    policy = chain({"model": odd, "provider": 'we"ird<p>'}, "-->end", provider=None)
    assert policy.targets[0].model == odd
    if not have_dot():
        pytest.skip("Graphviz's dot is not installed: the DOT source is not rendered")
    proc = subprocess.run(
        ["dot", "-Tsvg"], input=diagram.to_dot(declare(policy)), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


# -- durations ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"attempt_timeout": 1e10},
        {"deadline": 1e10},
        {"attempt_timeout": 10**400},
        {"retry_after_cap": 1e12},
        {"backoff": {"cap": 1e12}},
        {"cooldown": {"initial": 10**400, "cap": 10**400}},
    ],
)
def test_a_duration_beyond_one_day_is_refused_at_validation(fields: dict[str, Any]) -> None:
    with pytest.raises(PolicyError) as e:
        chain("m", **fields)
    assert "must be at most 86400 seconds (one day)" in str(e.value)
    assert "OverflowError" not in str(e.value)


def test_the_longest_timeouts_allowed_answer_a_real_sync_call(fault_server: FaultServer) -> None:
    """One day, the most a policy may give, is a timeout the OS and the SDK accept
    (1e10 s, once accepted, failed every sync attempt: "timestamp out of range")."""
    policy = chain("m", server=fault_server, attempt_timeout=MAX_SECONDS, deadline=MAX_SECONDS)
    with Fallgate(policy) as gate:
        result = gate.run(messages=[{"role": "user", "content": "hi"}])
    assert result.value.choices[0].message.content == "ok"


@pytest.mark.parametrize("value", ["1e308", "1e400", "86400001", "9" * 400])
def test_a_huge_retry_after_ms_is_converted_before_it_is_clamped(value: str) -> None:
    assert parse_retry_after({"retry-after-ms": value}) == MAX_RETRY_AFTER
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5


# -- fault-server scripts -------------------------------------------------------------------------


def _one_step(**step: Any) -> dict[str, Any]:
    return {"models": {"m": [step]}}


@pytest.mark.parametrize(
    ("step", "field", "words"),
    [
        ({"kind": "status", "status": 429, "headers": {"x-n": "€"}}, "x-n", "is not Latin-1"),
        ({"kind": "status", "status": 429, "headers": {"x-n": "a\x00b"}}, "x-n", "'\\x00' is"),
        ({"kind": "answer", "headers": {"x-n": "a\rb"}}, "x-n", "line breaks are not allowed"),
        ({"kind": "answer", "headers": {"x-n": float("inf")}}, "x-n", "a finite number"),
        ({"kind": "answer", "headers": {"x-n": 10**400}}, "x-n", "a finite number"),
        ({"kind": "status", "status": 400, "content_type": "text/\x00"}, "content_type", "'\\x00'"),
        ({"kind": "answer", "delay": 10**400}, "delay", "between 0 and 3600"),
        ({"kind": "hang", "seconds": float("nan")}, "seconds", "between 0 and 3600"),
        ({"kind": "answer", "text": "a\ud800b"}, "text", "lone surrogate"),
    ],
)
def test_a_script_value_the_server_could_not_send_is_a_script_error(
    step: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ScriptError) as e:
        parse_script(_one_step(**step))
    assert e.value.path[-1] == field
    assert words in str(e.value)
    with pytest.raises(ScriptError):
        FaultServer(_one_step(**step))


def test_a_script_file_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "faults.toml"
    path.write_text(
        '[[models.m]]\nkind = "status"\nstatus = 429\n'
        f'headers = {{ retry-after = "1", x-price = "5 €" }}\n'
        f'[[models.m]]\nkind = "answer"\ndelay = {10**400}\n'
    )
    with pytest.raises(ScriptError) as e:
        load_script(path)
    assert str(e.value).startswith(f'fault script {path}:4: models["m"][0].headers.x-price:')
    path.write_text(f'[[models.m]]\nkind = "answer"\ndelay = {10**400}\n')
    with pytest.raises(ScriptError) as e:
        load_script(path)
    assert str(e.value).startswith(f'fault script {path}:3: models["m"][0].delay:')


def test_a_script_that_is_a_named_pipe_or_binary_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "faults.toml"
    os.mkfifo(fifo)
    raised = finishes(lambda: load_script(fifo))
    assert isinstance(raised, ScriptError) and "a named pipe" in str(raised)
    binary = tmp_path / "faults.json"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(ScriptError, match="not UTF-8 text"):
        load_script(binary)
    deep = tmp_path / "deep.json"
    deep.write_text('{"models": {"m": ' + "[" * 100_000 + "]" * 100_000 + "}}")
    with pytest.raises(ScriptError, match="nested too deeply"):
        load_script(deep)


def test_a_request_body_nested_100000_deep_gets_a_400_and_the_server_keeps_serving(
    fault_server: FaultServer,
) -> None:
    body = '{"model": "m", "messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    conn = http.client.HTTPConnection("127.0.0.1", fault_server.port, timeout=10)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        data = json.loads(reply.read())
        assert reply.status == 400
        assert "nested too deeply" in data["error"]["message"]
        ok = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        conn.request("POST", "/v1/chat/completions", ok, {"Content-Type": "application/json"})
        again = conn.getresponse()
        assert again.status == 200 and json.loads(again.read())["choices"]
    finally:
        conn.close()


def test_the_declaration_bench_runs_and_counts_a_linear_declaration(tmp_path: Path) -> None:
    """`python -m bench --only declare` really declares and measures (not timed: only
    the counts, which are exact, are asserted)."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "declare", "--out", str(out)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    small, large = json.loads(out.read_text())["declare"]["rows"]
    assert (small["targets"], large["targets"]) == (10, 100)
    assert large["declared"] < 11 * small["declared"]  # linear: ~10x for a tenfold chain
    assert large["edges"] > 50 * small["edges"]  # the edges it stands for: quadratic
    assert large["held_mb"] > 0 and large["first_turn_s"] > 0


def test_replay_given_bytes_or_no_policy_says_what_it_wanted() -> None:
    from fallgate.fsm.replay.player import replay

    policy = Policy.from_dict(
        {"primary": {"provider": "p", "model": "m", "base_url": "http://h/v1", "api_key": "k"}}
    )
    with pytest.raises(TypeError, match="not bytes"):
        replay(b'{"v": 1}\n', policy)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="policy must be a fallgate Policy, not NoneType"):
        replay("", None)  # type: ignore[arg-type]


def test_enable_otel_with_something_that_is_not_a_provider_names_the_argument() -> None:
    import fallgate

    with pytest.raises(TypeError, match="tracer_provider must be an OpenTelemetry"):
        fallgate.enable_otel(tracer_provider="x")
    with pytest.raises(TypeError, match="meter_provider must be an OpenTelemetry"):
        fallgate.enable_otel(meter_provider=42)
