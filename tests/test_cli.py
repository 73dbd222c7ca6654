"""The `fallgate` command line: complete help, and one clear line for every bad input.

Bad arguments and bad files exit non-zero with a message on stderr naming the
problem (file, field, line) — never a traceback. Exit statuses: 0 success, 1 the
command ran and failed (a broken property, an unwritable output), 2 a usage or
input error (bad argument, missing or invalid file, unsupported output suffix), 3 a
missing system tool (Graphviz), 130 interrupted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fallgate.fsm import checker
from fallgate.providers.cli import gallery, main

ROOT = Path(__file__).resolve().parent.parent


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


# -- help ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "must_mention"),
    [
        ([], ["demo", "diagram", "check", "serve", "examples:"]),
        (["demo"], ["--json", "--out", "fault server", "openai"]),
        (["diagram"], ["--format", "--trace", "--output", "mermaid", "svg", "Graphviz"]),
        (["check"], ["--json", "properties", "shortest", "exit status"]),
        (["providers"], ["--json", "base_url", "never its value", "[providers.<name>]"]),
        (["serve"], ["--script", "--port", "--host", "Ctrl-C"]),
    ],
)
def test_help_is_complete_for_every_command(capsys, argv, must_mention):
    code, out, _ = run(capsys, *argv, "--help")
    assert code == 0
    for word in must_mention:
        assert word in out, (argv, word)


def test_no_command_is_a_one_line_usage_error(capsys):
    code, _, err = run(capsys)
    assert code == 2
    assert err.strip().count("\n") == 0
    assert "COMMAND" in err and "--help" in err


def test_an_unknown_format_is_a_usage_error(capsys):
    code, _, err = run(capsys, "diagram", "--format", "jpeg")
    assert code == 2
    assert "invalid choice: 'jpeg'" in err


@pytest.mark.parametrize("command", [[], ["check"], ["demo"], ["diagram"], ["serve"]])
def test_help_never_cites_a_document_that_does_not_exist(capsys, command):
    code, out, _ = run(capsys, *command, "--help")
    assert code == 0
    assert "SPEC" not in out


def test_help_states_the_exit_statuses(capsys):
    _, out, _ = run(capsys, "check", "--help")
    assert "0    every property holds" in out
    assert "1    a property is broken" in out
    assert "2    usage or input error" in out
    _, out, _ = run(capsys, "--help")
    for line in (
        "0    success",
        "1    the command ran and failed",
        "2    usage or input",
        "3    a needed system tool is missing",
        "130  interrupted",
    ):
        assert line in out, line
    _, out, _ = run(capsys, "demo", "--help")
    assert "regression scenarios in docs/design.md" in out
    assert "exit status: 0 when every scenario took its expected path, 1 when" in out


def test_a_bad_port_is_a_usage_error(capsys):
    code, _, err = run(capsys, "serve", "--script", "x.toml", "--port", "99999")
    assert code == 2
    assert "port must be between 0 and 65535" in err


# -- diagram ------------------------------------------------------------------------------------


def test_diagram_of_the_default_policy_is_mermaid_on_stdout(capsys):
    code, out, _ = run(capsys, "diagram")
    assert code == 0
    assert out == (gallery.DIAGRAMS / "turn-machine.mmd").read_text()


def test_diagram_with_a_trace_redraws_the_committed_scenario_1(capsys):
    code, out, _ = run(
        capsys,
        "diagram",
        str(gallery.DIAGRAMS / "scenario-1.toml"),
        "--trace",
        str(gallery.DIAGRAMS / "scenario-1.trace.jsonl"),
        "--format",
        "dot",
    )
    assert code == 0
    assert 'color="#e8590c"' in out
    assert "⑥ rate_limited" in out


def test_diagram_format_follows_the_output_suffix(capsys, tmp_path):
    out = tmp_path / "sub" / "machine.dot"
    code, _, err = run(capsys, "diagram", "-o", str(out))
    assert code == 0
    assert out.read_text().startswith("digraph fallgate {")
    assert f"wrote {out}" in err


@pytest.mark.parametrize(
    ("name", "start"),
    [
        ("m.mmd", "stateDiagram-v2\n"),
        ("m.mermaid", "stateDiagram-v2\n"),
        ("m.md", "# fallgate turn machine"),
        ("m.dot", "digraph fallgate {"),
        ("m.gv", "digraph fallgate {"),
    ],
)
def test_each_text_suffix_gets_its_format(capsys, tmp_path, name, start):
    out = tmp_path / name
    code, _, _ = run(capsys, "diagram", "-o", str(out))
    assert code == 0
    assert out.read_text().startswith(start)


@pytest.mark.parametrize("name", ["m.txt", "m.jpeg", "m.PDF", "machine"])
def test_an_unsupported_output_suffix_is_refused_listing_the_supported_ones(capsys, tmp_path, name):
    out = tmp_path / name
    code, stdout, err = run(capsys, "diagram", "-o", str(out))
    assert code == 2
    assert not out.exists() and stdout == ""
    assert err.strip().count("\n") == 0
    assert f"cannot write a diagram to {out}" in err
    for suffix in (".mmd", ".md", ".dot", ".svg", ".png"):
        assert suffix in err


def test_format_and_suffix_must_agree(capsys, tmp_path):
    out = tmp_path / "m.png"
    code, _, err = run(capsys, "diagram", "--format", "mermaid", "-o", str(out))
    assert code == 2
    assert not out.exists()
    assert "--format mermaid does not match" in err
    code, _, _ = run(capsys, "diagram", "--format", "dot", "-o", str(tmp_path / "m.dot"))
    assert code == 0


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_diagram_png_with_graphviz(capsys, tmp_path):
    out = tmp_path / "m.png"
    code, _, _ = run(capsys, "diagram", "-o", str(out))
    assert code == 0
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_diagram_svg_by_suffix_with_graphviz(capsys, tmp_path):
    out = tmp_path / "m.svg"
    code, _, _ = run(capsys, "diagram", "-o", str(out))
    assert code == 0
    assert out.read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize(("suffix", "word"), [(".png", "PNG"), (".svg", "SVG")])
def test_png_and_svg_without_graphviz_name_the_missing_dot(
    capsys, monkeypatch, tmp_path, suffix, word
):
    monkeypatch.setenv("PATH", "")
    out = tmp_path / f"m{suffix}"
    code, stdout, err = run(capsys, "diagram", "-o", str(out))
    assert code == 3
    assert not out.exists() and stdout == ""
    assert err.startswith(f"fallgate: {word} output needs Graphviz's `dot`, which is not installed")
    assert "apt-get install graphviz" in err
    assert err.strip().count("\n") == 0


def test_the_overview_is_mermaid_only(capsys, tmp_path):
    code, out, _ = run(capsys, "diagram", "--overview")
    assert code == 0
    assert out == (gallery.DIAGRAMS / "overview.mmd").read_text()
    md = tmp_path / "o.md"
    code, _, _ = run(capsys, "diagram", "--overview", "-o", str(md))
    assert code == 0
    assert md.read_text() == f"```mermaid\n{out}```\n"
    for bad in ("o.dot", "o.svg", "o.png"):
        code, _, err = run(capsys, "diagram", "--overview", "-o", str(tmp_path / bad))
        assert code == 2 and "--overview is drawn in Mermaid only" in err
    trace = str(gallery.DIAGRAMS / "scenario-1.trace.jsonl")
    code, _, err = run(capsys, "diagram", "--overview", "--trace", trace)
    assert code == 2 and "drop --overview" in err


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_diagram_svg_with_graphviz(capsys, tmp_path):
    out = tmp_path / "m.svg"
    code, _, _ = run(capsys, "diagram", "--format", "svg", "-o", str(out))
    assert code == 0
    assert "<svg" in out.read_text()


def test_svg_without_graphviz_says_how_to_get_it(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "")
    code, out, err = run(capsys, "diagram", "--format", "svg")
    assert code == 3
    assert out == ""
    assert "apt-get install graphviz" in err
    assert err.strip().count("\n") == 0


def test_a_missing_policy_file_is_one_line(capsys):
    code, _, err = run(capsys, "diagram", "no/such/policy.toml")
    assert code == 2
    assert err == "fallgate: policy file not found: no/such/policy.toml\n"


def test_bad_toml_names_the_file(capsys, tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text("max_attempts = [\n")
    code, _, err = run(capsys, "diagram", str(bad))
    assert code == 2
    assert f"{bad}: not valid TOML" in err


def test_an_invalid_policy_names_each_field_value_and_line(capsys, tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text(
        'max_attempts = 0\n[primary]\nprovider = "openai"\nmodel = "y"\n'
        'api_key = "sk-SECRET-123456"\nrotation = "random"\n'
    )
    code, _, err = run(capsys, "diagram", str(bad))
    assert code == 2
    assert f"invalid policy in {bad} (2 problems)" in err
    assert "line 1: max_attempts = 0: must be an integer between 1 and 1000" in err
    assert "line 6: primary.rotation = 'random'" in err
    assert "SECRET" not in err


def test_trace_errors_name_the_file_and_line(capsys, tmp_path):
    code, _, err = run(capsys, "diagram", "--trace", str(tmp_path / "none.jsonl"))
    assert (code, err) == (2, f"fallgate: trace file not found: {tmp_path / 'none.jsonl'}\n")
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"seq": 1}\nnot json\n')
    code, _, err = run(capsys, "diagram", "--trace", str(bad))
    assert code == 2
    assert f"{bad}:1: missing action, dest, event, source, time" in err


def test_a_trace_recorded_with_another_policy_is_refused(capsys):
    trace = str(gallery.DIAGRAMS / "scenario-1.trace.jsonl")
    code, out, err = run(capsys, "diagram", "--trace", trace)
    assert code == 2 and out == ""
    assert "target primary is model 'glm-5.1' in the trace but 'gpt-4.1' in this policy" in err


def test_an_unwritable_output_is_one_line(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run(capsys, "diagram", "-o", str(blocker / "x.mmd"))
    assert code == 1
    assert err.startswith(f"fallgate: cannot write {blocker / 'x.mmd'}")


# -- check and serve ----------------------------------------------------------------------------


def test_check_refuses_an_invalid_policy_with_the_field_exit_2(capsys, tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text('[primary]\nprovider = "x"\n')
    code, out, err = run(capsys, "check", str(bad))
    assert code == 2
    assert out == ""
    assert "primary.model: missing (required)" in err
    code, _, err = run(capsys, "check", str(tmp_path / "missing.toml"))
    assert code == 2 and "policy file not found" in err
    code, _, err = run(capsys, "check", "--no-such-option")
    assert code == 2


SMALL_POLICY = (
    'max_attempts = 1\n[primary]\nprovider = "a"\nmodel = "a"\nkey_env = "A_KEY"\n'
    'base_url = "https://a.test/v1"\n'
    '[[fallback_providers]]\nprovider = "b"\nmodel = "b"\nkey_env = "B_KEY"\n'
    'base_url = "https://b.test/v1"\n'
)


def test_check_exits_0_when_every_property_holds_and_says_1_key(capsys, tmp_path):
    small = tmp_path / "p.toml"
    small.write_text(SMALL_POLICY)
    code, out, _ = run(capsys, "check", str(small))
    assert code == 0
    assert "policy: primary (a, 1 key) -> fallback_1 (b, 1 key); max_attempts 1" in out
    assert "holds   fallback_gate" in out
    # no "1 keys", "1 turns", "<= 1 attempts": a count of one takes the singular
    assert not re.search(r"(?<![\d.,])1 [a-z ]*?(key|attempt|event|turn|configuration)s\b", out)
    solo = tmp_path / "solo.toml"  # one target, one key, one attempt, no recovery
    solo.write_text("recover_transport = false\n" + SMALL_POLICY.split("[[")[0])
    code, out, _ = run(capsys, "check", str(solo))
    assert code == 0
    assert "policy: primary (a, 1 key); max_attempts 1" in out
    # one attempt, and one after each of the two waits for a breaker's verdict
    assert "bounds: <= 3 attempts and " in out


def test_check_with_turns_explores_concurrent_turns_and_reports_the_fleet_properties(
    capsys, tmp_path
):
    small = tmp_path / "p.toml"
    small.write_text(SMALL_POLICY.replace("max_attempts = 1", "max_attempts = 2"))
    code, out, _ = run(capsys, "check", str(small), "--turns", "2")
    assert code == 0
    assert "2 concurrent turns on one shared health store, every interleaving" in out
    for prop in ("one_probe_in_flight", "retry_budget", "probe_within_bound"):
        assert f"  {prop}: holds" in out
    assert re.search(r"\d+ configurations, \d+ transitions, [\d.]+ s", out)
    code, out, _ = run(capsys, "check", str(small), "--turns", "2", "--json")
    assert code == 0 and json.loads(out)["fleet"]["properties"]["one_probe_in_flight"] == "holds"
    code, _, err = run(capsys, "check", str(small), "--turns", "9")
    assert code == 2 and "--turns must be 1..4" in err


def test_check_exits_1_when_a_property_is_broken(capsys, tmp_path, monkeypatch):
    # A real broken machine: a fallback index that goes stale after transport recovery
    # (tests/test_checker_broken.py), checked through the command line.
    from test_checker_broken import STALE_NEXT_IS

    real = checker.check_policy
    broken = lambda p, **kw: real(p, guards=STALE_NEXT_IS, **kw)  # noqa: E731
    monkeypatch.setattr(checker, "check_policy", broken)
    small = tmp_path / "p.toml"
    small.write_text(SMALL_POLICY.replace("max_attempts = 1", "max_attempts = 2"))
    code, out, err = run(capsys, "check", str(small))
    assert code == 1, err
    assert "BROKEN  fallback_gate" in out
    assert "counterexample (4 events; replay with fallgate.fsm.checker.replay" in out
    code, out, _ = run(capsys, "check", str(small), "--json")
    assert code == 1
    assert "counterexample" in json.loads(out)["properties"]["fallback_gate"]


def test_check_model_checks_a_small_policy(capsys, tmp_path):
    small = tmp_path / "p.toml"
    small.write_text(
        'max_attempts = 1\n[primary]\nprovider = "a"\nmodel = "a"\nkey_env = "A_KEY"\n'
        'base_url = "https://a.test/v1"\n'
        '[[fallback_providers]]\nprovider = "b"\nmodel = "b"\nkey_env = "B_KEY"\n'
        'base_url = "https://b.test/v1"\n'
    )
    code, out, _ = run(capsys, "check", str(small), "--json")
    assert code == 0
    data = json.loads(out)
    assert set(data["properties"].values()) == {"holds"} and data["key_audit"]["finding"] is None


def test_serve_refuses_a_missing_script(capsys, tmp_path):
    code, _, err = run(capsys, "serve", "--script", str(tmp_path / "none.toml"))
    assert (code, err) == (2, f"fallgate: script file not found: {tmp_path / 'none.toml'}\n")


def test_serve_runs_the_fault_server_until_interrupted(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"models": {"m": [{"kind": "answer", "text": "hi"}]}}))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fallgate.providers.cli",
            "serve",
            "--script",
            str(script),
            "--port",
            "0",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("fault server listening on http://127.0.0.1:"), first
        import openai

        base = first.split(" on ", 1)[1].strip()
        with openai.OpenAI(base_url=base, api_key="sk-test", max_retries=0) as client:
            reply = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )
        assert reply.choices[0].message.content == "hi"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "requests: m x1" in out


# -- providers ----------------------------------------------------------------------------------

SECRET_VALUE = "sk-must-not-be-printed-7f3a9c"


def test_providers_lists_the_registry_and_which_key_variables_are_set(capsys, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", SECRET_VALUE)
    monkeypatch.delenv("GROQ_API_KEY", raising=False)
    code, out, err = run(capsys, "providers")
    assert code == 0 and err == ""
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    for name in ("openai", "openrouter", "zai", "groq", "anthropic", "gemini", "ollama", "vllm"):
        assert name in lines, name
    assert "https://openrouter.ai/api/v1" in lines["openrouter"]
    assert "OPENROUTER_API_KEY (set)" in lines["openrouter"]
    assert "GROQ_API_KEY (not set)" in lines["groq"]
    assert "none (keyless)" in lines["ollama"]
    assert SECRET_VALUE not in out and SECRET_VALUE[:12] not in out


def test_providers_json_never_holds_a_value(capsys, monkeypatch):
    monkeypatch.setenv("ZAI_API_KEY", SECRET_VALUE)
    code, out, _ = run(capsys, "providers", "--json")
    assert code == 0
    assert SECRET_VALUE not in out
    rows = {r["name"]: r for r in json.loads(out)["providers"]}
    assert rows["zai"]["key_envs"] == [{"name": "ZAI_API_KEY", "set": True}]
    assert rows["zai"]["error_codes"]["1113"] == "quota"
    assert rows["zai"]["base_url"] == "https://api.z.ai/api/paas/v4"
    assert rows["vllm"]["keyless"] is True and rows["vllm"]["key_envs"] == []
    assert {r["source"] for r in rows.values()} == {"built-in"}


def test_providers_with_a_policy_shows_its_own_entries(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CORP_KEY", SECRET_VALUE)
    f = tmp_path / "p.toml"
    f.write_text(
        '[primary]\nprovider = "corp"\nmodel = "m"\n'
        '[providers.corp]\nbase_url = "https://llm.corp.example/v1"\nkey_env = "CORP_KEY"\n'
        '[providers.zai]\nbase_url = "https://api.z.ai/api/coding/paas/v4"\n'
    )
    code, out, _ = run(capsys, "providers", str(f))
    assert code == 0 and SECRET_VALUE not in out
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "https://llm.corp.example/v1" in lines["corp"] and "CORP_KEY (set)" in lines["corp"]
    assert "api/coding/paas/v4" in lines["zai"]
    assert f"* from {f}" in out
    code, out, _ = run(capsys, "providers", str(f), "--json")
    rows = {r["name"]: r for r in json.loads(out)["providers"]}
    assert (rows["corp"]["source"], rows["zai"]["source"]) == ("policy", "policy")
    assert rows["zai"]["error_codes"]["1113"] == "quota"  # an override keeps the quirks
    assert rows["openai"]["source"] == "built-in"


def test_providers_refuses_a_bad_policy_in_one_message(capsys, tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[primary]\nprovider = "opnrouter"\nmodel = "m"\n')
    code, _, err = run(capsys, "providers", str(f))
    assert code == 2  # an invalid input file (the CLI's exit statuses)
    assert "line 2: primary.provider = 'opnrouter'" in err and "did you mean 'openrouter'" in err
