"""Bad input is refused naming the field, the file and the line (issue 24, finding 8).

On main: ``deadline = 10**5000`` raised a raw ValueError from the repr helper,
``deadline = 1e-300`` was accepted (then every turn failed), ``fallgate replay DIR``
ended as "internal error: IsADirectoryError", and a 5,000-digit ``seq`` in a trace was
refused without file or line.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fallgate.fsm import Policy
from fallgate.fsm.errors import PolicyError

PRIMARY = {"provider": "p", "model": "m", "base_url": "https://p.test/v1", "api_key": "abcdefgh"}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fallgate.providers.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_five_thousand_digit_deadline_is_a_policy_error_naming_it() -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"primary": PRIMARY, "deadline": 10**5000})
    assert "deadline = an integer of about 5,00" in str(info.value)


@pytest.mark.parametrize("field", ["deadline", "attempt_timeout", "stream_idle_timeout"])
def test_a_bound_too_short_for_any_request_is_refused_naming_it(field: str) -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"primary": PRIMARY, field: 1e-300})
    assert f"{field} = 1e-300: must be at least 0.01 seconds" in str(info.value)


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(
        '[primary]\nprovider = "p"\nmodel = "m"\nbase_url = "https://p.test/v1"\n'
        'api_key = "abcdefgh"\n'
    )
    return path


def test_replay_of_a_directory_is_a_usage_error_naming_it(
    tmp_path: Path, policy_file: Path
) -> None:
    out = _cli("replay", "--policy", str(policy_file), str(tmp_path))
    assert out.returncode == 2, out.stderr
    assert f"trace path is a directory, not a JSONL file: {tmp_path}" in out.stderr
    assert "internal error" not in out.stderr


def test_a_five_thousand_digit_seq_is_refused_with_file_and_line(
    tmp_path: Path, policy_file: Path
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('\n{"turn": "t1", "seq": ' + "9" * 5000 + "}\n")
    out = _cli("replay", "--policy", str(policy_file), str(trace))
    assert out.returncode == 2
    assert f"{trace}:2: holds a number of more than 4,300 digits" in out.stderr, out.stderr
