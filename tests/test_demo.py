"""`fallgate demo`: the regression scenarios (docs/design.md) with the real openai SDK
over real HTTP, in seconds.

The demo checks itself (each scenario's final state, calls, and the requests the
fault server saw); these tests check the demo: its JSON shape, the expected
paths, the diagrams it writes, its speed, and that it leaves nothing running.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fallgate.providers.cli import demo, main

from helpers import no_collector_pauses

ROOT = Path(__file__).resolve().parent.parent

EXPECTED = {
    "scenario-1": (
        "done",
        [
            ["primary", "glm-5.1"],
            ["primary", "glm-5.1"],
            ["primary", "glm-5.1"],
            ["fallback_1", "glm-4.7"],
        ],
    ),
    "retry-after": ("done", [["primary", "gpt-4.1"], ["fallback_1", "glm-4.7"]]),
    "overloaded": ("done", [["primary", "gpt-4.1"], ["fallback_1", "glm-4.7"]]),
    "context-too-long": ("done", [["primary", "small-8k"], ["fallback_2", "large-128k"]]),
    # one silent attempt, then the fallback while it still has its attempt's time
    "silent-primary": ("done", [["primary", "gpt-4.1"], ["fallback_1", "glm-4.7"]]),
    "stream-broken": ("failed", [["primary", "gpt-4.1"]]),
    # the delivered text as an assistant prefix to the fallback, which goes on from there
    "stream-continued": ("done", [["primary", "gpt-4.1"], ["fallback_1", "mistral-large"]]),
}


@pytest.fixture(scope="module")
def demo_json(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, Path, float, set]:
    # The demo's attempts are bounded at 1 s, and its fault server runs in this process.
    with no_collector_pauses():
        return _run_demo(tmp_path_factory.mktemp("demo"))


def _run_demo(out: Path) -> tuple[int, dict, Path, float, set]:
    before = set(threading.enumerate())
    t0 = time.perf_counter()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["demo", "--json", "--out", str(out)])
    elapsed = time.perf_counter() - t0
    time.sleep(0.05)
    leftover = {t for t in threading.enumerate() if t not in before and t.is_alive()}
    return code, json.loads(buf.getvalue()), out, elapsed, leftover


def test_demo_json_lists_every_scenario_with_state_calls_and_elapsed(demo_json):
    code, data, _, _, _ = demo_json
    assert list(data) == ["scenarios"]
    names = [s["name"] for s in data["scenarios"]]
    assert names == list(EXPECTED)
    for s in data["scenarios"]:
        assert {"name", "final_state", "calls", "elapsed"} <= set(s)
        state, calls = EXPECTED[s["name"]]
        assert s["final_state"] == state, s
        assert s["calls"] == calls, s
        assert isinstance(s["elapsed"], float) and 0 < s["elapsed"] < 5
        assert s["ok"] is True
    assert code == 0  # after the scenarios: a failure names the scenario that broke


def test_retry_after_171_is_answered_by_the_fallback_without_sleeping(demo_json):
    _, data, _, _, _ = demo_json
    by_name = {s["name"]: s for s in data["scenarios"]}
    assert by_name["retry-after"]["elapsed"] < 2.0


def test_demo_finishes_in_under_ten_seconds_and_leaves_nothing_running(demo_json):
    _, _, _, elapsed, leftover = demo_json
    assert elapsed < 10
    assert not leftover, f"threads left running: {[t.name for t in leftover]}"


def test_demo_writes_each_paths_diagram(demo_json):
    _, _, out, _, _ = demo_json
    for name in EXPECTED:
        md = (out / f"{name}.md").read_text()
        assert "```mermaid\nstateDiagram-v2" in md
        assert "class s_idle" in md and " taken" in md  # the path is highlighted
        if shutil.which("dot"):
            assert (out / f"{name}.svg").read_text().lstrip().startswith("<?xml")
    assert "| 6 | primary | rate_limited | fallback_1 |" in (out / "scenario-1.md").read_text()


def test_demo_prints_each_turns_path_as_a_table(capsys):
    assert main(["demo", "--no-diagrams"]) == 0
    text = capsys.readouterr().out
    assert "#  elapsed  event" in text
    assert "-> state" in text and "wait" in text and "next" in text
    assert "rate_limited  HTTP 429, Retry-After 171s  fallback_1" in text
    assert "call fallback_2 (large-128k)" in text
    assert "never called: tiny-4k" in text
    assert "'Once upon a time'" in text
    assert "answered 'Once upon a time there was a gate that never closed.'" in text
    n = len(demo.SCENARIOS)
    assert f"{n}/{n} scenarios took their expected path" in text
    assert "sk-demo" not in text  # keys never printed


def test_without_graphviz_the_demo_says_in_one_line_how_to_get_svgs(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "")  # no `dot` to be found
    assert main(["demo", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    about = [line for line in text.splitlines() if "Graphviz" in line or "apt-get" in line]
    assert about == [demo.NO_DOT_HINT]
    assert "apt-get install graphviz" in about[0] and "then make diagrams" in about[0]
    assert list(tmp_path.glob("*.md")) and not list(tmp_path.glob("*.svg"))


@pytest.mark.parametrize("where", ["a file", "a directory that takes no files"])
def test_an_out_that_cannot_take_the_diagrams_is_said_before_any_scenario_runs(
    capsys, monkeypatch, tmp_path, where
):
    """`--out` naming a file, or a directory nothing can be written in: one message
    naming it and why (exit 1, an output that could not be written), at once, not an
    internal error (nor an exit 0 with a line per scenario) after the scenarios ran."""
    played: list[object] = []
    monkeypatch.setattr(demo, "run_all", lambda: played.append(1) or [])
    if where == "a file":
        out = tmp_path / "afile"
        out.write_text("x")
        says = f"cannot write the diagrams to {out}: File exists"
    else:
        out, says = Path("/proc"), "cannot write the diagrams to /proc: "
    assert main(["demo", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert says in err, err
    assert "internal error" not in err and "Traceback" not in err
    assert played == []


@pytest.mark.parametrize("target", ["demo", "diagrams"])
def test_make_demo_and_diagrams_install_nothing_system_wide(target):
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        [make, "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    recipe = done.stdout
    assert f"fallgate{' demo' if target == 'demo' else '.providers.cli.gallery'}" in recipe
    for word in ("apt-get", "apt ", "sudo", "brew", "dnf", "yum"):
        assert word not in recipe, (target, word, recipe)
