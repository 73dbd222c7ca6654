"""The README's quick start and the Python API page's example run as printed and say what
their comments say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from fallgate.testing import FaultServer

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PYTHON_API = ROOT / "docs" / "python-api.md"


def _block(page: Path, after_heading: str, lang: str = "python") -> str:
    text = page.read_text(encoding="utf-8")
    section = text[text.index(after_heading) :]
    m = re.search(rf"```{lang}\n(.*?)```", section, re.S)
    assert m is not None, f"no {lang} block after {after_heading!r} in {page.name}"
    return m.group(1)


def _run(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_python_api_example_runs_and_prints_what_its_comments_promise():
    out = _run(_block(PYTHON_API, "## The Python API"), ROOT)
    assert "answer from z-ai/glm-4.7 fallback_1 2" in out
    assert "turn failed:" in out and "bad_request (HTTP 400)" in out
    assert "done ['primary', 'primary_transport_backoff', 'primary', 'done']" in out
    assert '"event": "rate_limited"' in out


def test_the_quick_start_runs_against_a_server_and_falls_back(tmp_path: Path) -> None:
    """The README's TOML and Python, unchanged, with the two known providers moved to a
    fault server (a `[providers.<name>]` table each): the primary answers 429, the
    fallback answers."""
    toml = _block(README, "## Quick start", "toml")
    code = _block(README, "## Quick start", "python")
    script = {
        "models": {
            "gpt-4.1": [{"kind": "status", "status": 429}],
            "z-ai/glm-4.7": [{"kind": "answer", "text": "hello from the fallback"}],
        }
    }
    with FaultServer(script) as srv:
        moved = "".join(
            f'\n[providers.{name}]\nbase_url = "{srv.base_url}"\n'
            for name in ("openai", "openrouter")
        )
        (tmp_path / "fallgate.toml").write_text(toml + moved, encoding="utf-8")
        env = {**os.environ, "OPENAI_API_KEY": "sk-test-a", "OPENROUTER_API_KEY": "sk-test-b"}
        out = _run(code, tmp_path, env)
        assert srv.counts == {"gpt-4.1": 1, "z-ai/glm-4.7": 1}
    assert out == "z-ai/glm-4.7 hello from the fallback\n"


def test_the_set_up_is_the_two_make_commands() -> None:
    """A fresh clone needs two commands, both real Makefile targets: `make demo`, `make test`."""
    block = _block(README, "## Set-up: two commands", "sh")
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.M), target
