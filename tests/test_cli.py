"""The `fallgate` command line: complete help, and one clear line for every bad input.

Bad arguments and bad files exit non-zero with a message on stderr naming the
problem (file, field, line) — never a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fallgate.providers import gallery
from fallgate.providers.cli import main

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
        (["check"], ["--json", "properties", "shortest"]),
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
    code, _, err = run(capsys, "diagram", "--format", "png")
    assert code == 2
    assert "invalid choice: 'png'" in err


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
    assert code == 1
    assert err == "fallgate: policy file not found: no/such/policy.toml\n"


def test_bad_toml_names_the_file(capsys, tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text("max_attempts = [\n")
    code, _, err = run(capsys, "diagram", str(bad))
    assert code == 1
    assert f"{bad}: not valid TOML" in err


def test_an_invalid_policy_names_each_field_value_and_line(capsys, tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text(
        'max_attempts = 0\n[primary]\nprovider = "openai"\nmodel = "y"\n'
        'api_key = "sk-SECRET-123456"\nrotation = "random"\n'
    )
    code, _, err = run(capsys, "diagram", str(bad))
    assert code == 1
    assert f"invalid policy in {bad} (2 problems)" in err
    assert "line 1: max_attempts = 0: must be an integer between 1 and 1000" in err
    assert "line 6: primary.rotation = 'random'" in err
    assert "SECRET" not in err


def test_trace_errors_name_the_file_and_line(capsys, tmp_path):
    code, _, err = run(capsys, "diagram", "--trace", str(tmp_path / "none.jsonl"))
    assert (code, err) == (1, f"fallgate: trace file not found: {tmp_path / 'none.jsonl'}\n")
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"seq": 1}\nnot json\n')
    code, _, err = run(capsys, "diagram", "--trace", str(bad))
    assert code == 1
    assert "trace line 1: missing action, dest, event, source, time" in err


def test_a_trace_recorded_with_another_policy_is_refused(capsys):
    trace = str(gallery.DIAGRAMS / "scenario-1.trace.jsonl")
    code, out, err = run(capsys, "diagram", "--trace", trace)
    assert code == 1 and out == ""
    assert "target primary is model 'glm-5.1' in the trace but 'gpt-4.1' in this policy" in err


def test_an_unwritable_output_is_one_line(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run(capsys, "diagram", "-o", str(blocker / "x.mmd"))
    assert code == 1
    assert err.startswith(f"fallgate: cannot write {blocker / 'x.mmd'}")


# -- check and serve ----------------------------------------------------------------------------


def test_check_refuses_an_invalid_policy_with_the_field(capsys, tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text('[primary]\nprovider = "x"\n')
    code, _, err = run(capsys, "check", str(bad))
    assert code == 1
    assert "primary.model: missing (required)" in err
    code, _, err = run(capsys, "check", str(tmp_path / "missing.toml"))
    assert code == 1 and "policy file not found" in err


def test_check_model_checks_a_small_policy(capsys, tmp_path):
    pytest.importorskip("fallgate.fsm.checker", reason="fsm.checker is not in this tree")
    small = tmp_path / "p.toml"
    small.write_text(
        'max_attempts = 1\n[primary]\nprovider = "a"\nmodel = "a"\nkey_env = "A_KEY"\n'
        'base_url = "https://a.test/v1"\n'
        '[[fallback_providers]]\nprovider = "b"\nmodel = "b"\nkey_env = "B_KEY"\n'
        'base_url = "https://b.test/v1"\n'
    )
    code, out, _ = run(capsys, "check", str(small), "--json")
    assert code in (0, 1)
    assert isinstance(json.loads(out), dict)


def test_serve_refuses_a_missing_script(capsys, tmp_path):
    code, _, err = run(capsys, "serve", "--script", str(tmp_path / "none.toml"))
    assert (code, err) == (1, f"fallgate: script file not found: {tmp_path / 'none.toml'}\n")


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
    assert code == 1
    assert "line 2: primary.provider = 'opnrouter'" in err and "did you mean 'openrouter'" in err
