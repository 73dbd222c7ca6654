"""`fallgate replay`: the documented incident replayed (text and JSON), and one clear line
naming file:line for every bad input, never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fallgate.providers.cli import inputs, main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "replay"
INCIDENT = EXAMPLE / "incident.jsonl"
WAITING = EXAMPLE / "waiting.toml"
DEFAULT = EXAMPLE / "default.toml"
REPLAY_DOC = ROOT / "docs" / "replay.md"


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_the_incident_replayed_under_the_default_policy_is_faster_with_its_assumption_listed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "replay", INCIDENT, "--policy", DEFAULT, "--json")
    assert code == 0, err
    data = json.loads(out)
    rec, rep = data["recorded"], data["replayed"]
    assert rec["requests"] == {"glm-5.1": 3, "glm-4.7": 1}
    assert rep["requests"] == {"glm-5.1": 2, "glm-4.7": 2}
    assert rec["ends"] == rep["ends"] == {"done": 2}
    assert rec["seconds"] > 21 and rep["seconds"] < 1.5
    (assumed,) = rep["assumptions"]
    assert assumed["target"] == "fallback_1" and "recorded mix" in assumed["what"]
    first = data["turns"][0]
    assert first["recorded"]["waits"] and first["replayed"]["waits"] == []
    assert first["saved_seconds"] > 20 and not first["same_path"]


def test_the_incident_replayed_under_its_own_policy_takes_the_recorded_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "replay", INCIDENT, "--policy", WAITING, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert all(t["same_path"] for t in data["turns"])
    assert data["replayed"]["requests"] == data["recorded"]["requests"]
    assert data["replayed"]["assumptions"] == []
    for t in data["turns"]:
        assert t["replayed"]["waits"] == t["recorded"]["waits"]
        # a system clock's recording, oversleeping and all: to the microsecond
        assert t["replayed"]["seconds"] == pytest.approx(t["recorded"]["seconds"], abs=2e-6)


def test_the_documented_example_is_what_the_command_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/replay.md's table comes from the shipped recording, as its command prints it."""
    text = REPLAY_DOC.read_text(encoding="utf-8")
    section = text[text.index("**Worked example.**") :]
    block = re.search(r"```text\n\$ (fallgate replay [^\n]*)\n(.*?)```", section, re.S)
    assert block is not None, "no ```text block with a $ fallgate replay command"
    monkeypatch.chdir(ROOT)
    code, out, _ = run(capsys, *block.group(1).split()[1:])
    assert code == 0
    assert block.group(2) == out


def test_text_output_shows_the_table_waits_and_assumptions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(
        capsys, "replay", INCIDENT, "--policy", DEFAULT, "--assume", "fallback_1=success:0.4"
    )
    assert code == 0
    assert re.search(r"^total\s+2\d\.\d{3}s 2 done\s+\d\.\d{3}s 2 done\s+2\d\.\d{3}s", out, re.M)
    assert "assumed success:0.4 (given)" in out
    assert "waits (seconds):" in out


def test_unknown_stops_the_turn_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "replay", INCIDENT, "--policy", DEFAULT, "--assume", "unknown")
    assert code == 0
    assert "1 done, 1 unknown" in out and "the turn stopped here" in out


def test_the_seed_makes_the_replay_repeatable(capsys: pytest.CaptureFixture[str]) -> None:
    outs = {
        run(capsys, "replay", INCIDENT, "--policy", DEFAULT, "--seed", "7", "--json")[1]
        for _ in range(2)
    }
    assert len(outs) == 1


OLD = (
    '{"seq": 1, "time": 0.0, "source": "idle", "event": "start", "dest": "primary", '
    '"action": "Attempt"}\n'
)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (OLD, ":1: a trace without turn lines"),
        ('{"v": 7, "turn": "x"}\n', ":1: trace format version 7 is not supported"),
        ("not json at all\n", ":1: not JSON"),
        (
            '{"v": 1, "turn": "t", "start": 0, "clock": 0, "domain": "d", "first": 0, '
            '"targets": []}\n',
            ":1: turn line: targets is empty",
        ),
        ("", "the trace holds no turn"),
        (b"\xff\xfe binary", "not UTF-8 text"),
    ],
)
def test_a_bad_trace_is_one_line_naming_file_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | bytes, message: str
) -> None:
    f = tmp_path / "bad.jsonl"
    if isinstance(content, bytes):
        f.write_bytes(content)
    else:
        f.write_text(content)
    code, out, err = run(capsys, "replay", f, "--policy", DEFAULT)
    assert code == 2 and out == ""
    assert str(f) in err and message in err
    assert len(err.strip().splitlines()) == 1


def test_a_bad_line_deep_in_a_recording_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = INCIDENT.read_text().splitlines()
    lines[3] = lines[3].replace('"seq": 3', '"seq": "three"')
    f = tmp_path / "edited.jsonl"
    f.write_text("\n".join(lines) + "\n")
    code, _, err = run(capsys, "replay", f, "--policy", DEFAULT)
    assert code == 2 and f"{f}:4: seq must be an integer" in err


def test_a_policy_matching_no_recorded_target_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    other = tmp_path / "other.toml"
    other.write_text(DEFAULT.read_text().replace("glm-5.1", "gpt-x").replace("glm-4.7", "gpt-y"))
    code, _, err = run(capsys, "replay", INCIDENT, "--policy", other)
    assert code == 2 and "match no recorded target" in err and "glm-5.1@" in err


def test_a_huge_trace_is_refused_before_it_is_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inputs, "MAX_TRACE_BYTES", 1024)
    big = tmp_path / "big.jsonl"
    big.write_text(INCIDENT.read_text() * 4)
    code, _, err = run(capsys, "replay", big, "--policy", DEFAULT)
    assert code == 2 and "larger than 1024 bytes" in err and str(big) in err


@pytest.mark.parametrize(
    ("assume", "message"),
    [
        ("fallback_9=success:1", "names no target of the policy: fallback_9"),
        ("fallback_1=sucess:1", "expected recorded, unknown or an outcome kind"),
        ("success:-2", "finite number of seconds >= 0"),
    ],
)
def test_a_bad_assumption_is_named(
    capsys: pytest.CaptureFixture[str], assume: str, message: str
) -> None:
    code, _, err = run(capsys, "replay", INCIDENT, "--policy", DEFAULT, "--assume", assume)
    assert code == 2 and message in err


def test_missing_files_are_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "replay", tmp_path / "nope.jsonl", "--policy", DEFAULT)
    assert code == 2 and "trace file not found" in err
    code, _, err = run(capsys, "replay", INCIDENT, "--policy", tmp_path / "nope.toml")
    assert code == 2 and "policy file not found" in err


def test_diagram_picks_one_turn_of_a_recording(capsys: pytest.CaptureFixture[str]) -> None:
    ids = [json.loads(x)["turn"] for x in INCIDENT.read_text().splitlines() if '"v"' in x]
    drawn = []
    for extra in ([], ["--turn", ids[0]], ["--turn", ids[1]]):
        code, out, err = run(capsys, "diagram", WAITING, "--trace", INCIDENT, *extra)
        assert code == 0, err
        drawn.append(out)
    assert drawn[0] == drawn[1] != drawn[2]  # the first turn by default
    code, _, err = run(capsys, "diagram", WAITING, "--trace", INCIDENT, "--turn", "nope")
    assert code == 2 and f"no turn 'nope' in the trace (its turns: {ids[0]}, {ids[1]})" in err
    code, _, err = run(capsys, "diagram", "--turn", ids[0])
    assert code == 2 and "give --trace too" in err


def test_replay_help_says_how_requests_are_answered_and_the_exit_statuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "replay", "--help")
    assert code == 0
    for word in ("--policy", "--assume", "--seed", "--json", "recorded path", "exit status"):
        assert word in out
    code, out, _ = run(capsys, "--help")
    assert "fallgate replay turns.jsonl --policy new.toml" in out
