"""The README's Python API example runs as printed and says what its comments say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _block(after_heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(after_heading):]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m is not None, f"no python block after {after_heading!r}"
    return m.group(1)


def test_the_python_api_example_runs_and_prints_what_its_comments_promise():
    code = _block("## The Python API")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "answer from z-ai/glm-4.7 fallback_1 2" in out.stdout
    assert "turn failed:" in out.stdout and "bad_request (HTTP 400)" in out.stdout
    assert "done ['primary', 'primary_transport_backoff', 'primary', 'done']" in out.stdout
    assert '"event": "rate_limited"' in out.stdout
