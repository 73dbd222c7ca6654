"""No control character from a trace or a request reaches the terminal (issue 24,
finding 8): `fallgate replay` printed trace ids raw and `fallgate serve` printed
requested model names raw, so an ESC sequence in one cleared the screen."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from fallgate.fsm.printable import printable
from fallgate.providers.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "replay"
ESC = "\x1b[2J\x1b]0;owned\x07"


def test_printable_escapes_controls_and_keeps_lines() -> None:
    assert printable(f"turn {ESC}x\nnext\tcol") == "turn \\x1b[2J\\x1b]0;owned\\x07x\nnext\tcol"
    assert printable("right-to-left \u202eevil") == "right-to-left \\u202eevil"
    assert printable("plain, ünïcode text") == "plain, ünïcode text"


def test_replay_prints_a_trace_id_with_an_escape_sequence_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "incident.jsonl"
    text = (EXAMPLE / "incident.jsonl").read_text()
    trace.write_text(text.replace('"74abb7-1"', '"\\u001b[2J74abb7-1"'))
    code = main(["replay", str(trace), "--policy", str(EXAMPLE / "default.toml")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "\\x1b[2J74abb7-1" in out
    assert "\x1b" not in out + err


def test_serve_prints_a_requested_model_name_escaped(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text('{"default": {"kind": "answer", "text": "ok"}}')
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
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        base_url = first.strip().rsplit(" ", 1)[-1]
        assert base_url.startswith("http://127.0.0.1:"), first
        with openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as client:
            client.chat.completions.create(
                model=f"m{ESC}", messages=[{"role": "user", "content": "hi"}]
            )
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "requests: m\\x1b[2J" in out, out
    assert "\x1b" not in out + err
