"""A key the policy holds is never printed by a `PolicyError` or the CLI, whatever field
it was typed into; a key pasted with a newline is refused at load (issue 24, finding 5).

On main only ``sk-``-shaped values were masked: a key of another shape typed into
``rotation``, ``deadline``, ``max_attempts``, ``context_length``, ``keyless`` or as a
field's name was printed (6/6), and ``"...\\n"`` was accepted, then every attempt failed
as a transport fault.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fallgate.fsm import Policy, TurnFailed
from fallgate.fsm.errors import PolicyError
from fallgate.providers import Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

#: Not key-shaped: no known prefix, no digits, under 24 characters.
KEY = "hunterprimarykeyzq"


def _entry(**extra: Any) -> dict[str, Any]:
    return {
        "provider": "p",
        "model": "m",
        "base_url": "https://p.test/v1",
        "api_key": KEY,
        **extra,
    }


WRONG_FIELDS = {
    "rotation": lambda: {"primary": _entry(rotation=KEY)},
    "deadline": lambda: {"primary": _entry(), "deadline": KEY},
    "max_attempts": lambda: {"primary": _entry(), "max_attempts": KEY},
    "context_length": lambda: {"primary": _entry(context_length=KEY)},
    "keyless": lambda: {"primary": _entry(keyless=KEY)},
    "a field's name": lambda: {"primary": _entry(**{KEY: 1})},
    "a top-level name": lambda: {"primary": _entry(), KEY: 1},
    "a fallback's model": lambda: {
        "primary": _entry(),
        "fallback_providers": [{"model": 5, "api_key": KEY + "x"}],
    },
}


@pytest.mark.parametrize("where", list(WRONG_FIELDS))
def test_a_key_typed_into_a_wrong_field_is_never_printed(where: str) -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_dict(WRONG_FIELDS[where]())
    text = str(info.value)
    assert "hunter" not in text, text
    assert "***" in text or where == "a fallback's model"


def test_the_cli_does_not_print_it_either(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(
        f'deadline = 30\n[primary]\nprovider = "p"\nmodel = "m"\nbase_url = "https://p.test/v1"\n'
        f'api_key = "{KEY}"\nrotation = "{KEY}"\n{KEY} = 1\n'
    )
    out = subprocess.run(
        [sys.executable, "-m", "fallgate.providers.cli", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "rotation" in out.stdout + out.stderr
    assert "hunter" not in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize(
    "pasted", [KEY + "\n", KEY + "\r\n", " " + KEY, KEY + "\t", KEY[:6] + "\n" + KEY[6:]]
)
def test_a_key_pasted_with_a_newline_is_refused_at_load(pasted: str) -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"primary": _entry(api_key=pasted)})
    text = str(info.value)
    assert "primary.api_key" in text
    assert "newline" in text or "control character" in text
    assert "hunter" not in text


def test_a_key_read_from_the_environment_with_a_newline_is_never_sent(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Env keys are read at use time: the attempt is refused there, naming the variable
    (main sent it, and every attempt failed as a transport fault, retried and rebuilt)."""
    monkeypatch.setenv("FG_PASTED_KEY", KEY + "\n")
    policy = chain({"model": "a", "key_env": "FG_PASTED_KEY"}, server=fault_server)
    with Fallgate(policy) as gate, pytest.raises(TurnFailed) as info:
        gate.run(messages=[{"role": "user", "content": "hi"}])
    assert fault_server.requests == []
    text = str(info.value)
    assert "FG_PASTED_KEY" in text and "newline" in text and "hunter" not in text, text
