"""examples/: the policy file is complete and valid, and the agent loop runs.

`examples/agent_loop.py` runs as a user would run it (a subprocess, keys in
environment variables) with every target pointed at a fault server whose primary
answers 429 and whose first fallback answers a tool call, then a streamed answer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import attrs
import pytest
from fallgate.fsm.checker import PROPERTIES
from fallgate.fsm.kinds import FAULT_KINDS, Rule
from fallgate.fsm.policy.model import Backoff, Cooldown

from fallgate import Policy
from fallgate.testing import FaultServer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
POLICY = EXAMPLES / "policy.toml"
AGENT = EXAMPLES / "agent_loop.py"

KEYS = {
    "OPENAI_API_KEY": "sk-example-primary-1",
    "OPENAI_API_KEY_2": "sk-example-primary-2",
    "OPENROUTER_API_KEY": "sk-example-openrouter",
    "GROQ_API_KEY": "sk-example-groq",
}


def _fields(cls: type) -> set[str]:
    return {f.name for f in attrs.fields(cls) if f.init}


# -- examples/policy.toml -----------------------------------------------------------------------


def test_the_example_policy_loads_with_a_three_target_chain():
    policy = Policy.from_toml(POLICY)
    assert [(t.name, t.provider) for t in policy.targets] == [
        ("primary", "openai"),
        ("fallback_1", "openrouter"),
        ("fallback_2", "groq"),
    ]
    assert [c.id for c in policy.targets[0].credentials] == [
        "env:OPENAI_API_KEY",
        "env:OPENAI_API_KEY_2",
    ]
    assert all(t.base_url and t.context_length for t in policy.targets)
    assert not policy.secrets() or all(k not in POLICY.read_text() for k in policy.secrets())


def test_the_example_policy_shows_every_field():
    data = tomllib.loads(POLICY.read_text(encoding="utf-8"))
    top = _fields(Policy) - {"targets", "providers"} | {"primary", "fallback_providers"}
    assert set(data) == top
    assert "# [providers.my-gateway]" in POLICY.read_text(encoding="utf-8")  # shown, not set
    target_keys = {"provider", "model", "base_url", "context_length", "rotation"}
    for entry in [data["primary"], *data["fallback_providers"]]:
        assert target_keys <= set(entry), entry
        assert {"key_env", "key_envs"} & set(entry), entry
    assert set(data["backoff"]) == _fields(Backoff)
    assert set(data["cooldown"]) == _fields(Cooldown)
    assert set(data["rules"]) == {k.value for k in FAULT_KINDS}
    for kind, rule in data["rules"].items():
        assert set(rule) == _fields(Rule), kind


def test_every_value_outside_the_chain_is_the_default():
    policy = Policy.from_toml(POLICY)
    assert policy == Policy(targets=policy.targets)


def test_fallgate_check_passes_on_the_example_policy():
    exe = Path(sys.executable).parent / "fallgate"
    done = subprocess.run(
        [str(exe), "check", str(POLICY)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("  holds   ") == len(PROPERTIES), done.stdout


# -- examples/agent_loop.py ---------------------------------------------------------------------


def run_agent(base_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env.update(KEYS)
    return subprocess.run(
        [sys.executable, str(AGENT), "--base-url", base_url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


LIMITED = {"kind": "status", "status": 429, "headers": {"retry-after": "30"}}
PRIMARY, FALLBACK_1, FALLBACK_2 = (t.model for t in Policy.from_toml(POLICY).targets)


@pytest.fixture
def server():
    script = {
        "models": {
            PRIMARY: [LIMITED, LIMITED, LIMITED],
            FALLBACK_1: [
                {
                    "kind": "tool_calls",
                    "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
                },
                {"kind": "answer", "text": "It is sunny in Paris, 21 degrees.", "chunks": 4},
            ],
        },
        # Anything else (a third call, the second fallback) is an error the test would see.
        "default": {"kind": "status", "status": 400},
    }
    with FaultServer(script) as srv:
        yield srv


def test_the_agent_loop_falls_back_runs_the_tool_and_streams_the_answer(server):
    done = run_agent(server.base_url, "What is the weather in Paris?")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "> What is the weather in Paris?",
        f"[answered by fallback_1 ({FALLBACK_1}) after 3 attempt(s)]",
        '[tool] get_weather({"city":"Paris"}) -> '
        '{"city": "Paris", "forecast": "sunny", "temperature_c": 21}',
        "It is sunny in Paris, 21 degrees.",
        f"[answered by fallback_1 ({FALLBACK_1}) after 1 attempt(s)]",
    ]
    # fallgate's path, on stderr: both primary keys rate limited, then the fallback;
    # the second turn starts at the fallback (the primary's keys are benched for 30 s).
    err = done.stderr
    assert "primary --rate_limited--> primary: call gpt-4.1 with key env:OPENAI_API_KEY_2" in err
    assert "primary --rate_limited--> fallback_1: call" in err
    assert err.count("idle --start--> fallback_1") == 1
    assert err.count("fallback_1 --success--> done") == 2
    for key in KEYS.values():
        assert key not in done.stdout + err

    seen = [(r.model, r.kind, r.stream, r.api_key) for r in server.requests]
    assert seen == [
        (PRIMARY, "status", True, KEYS["OPENAI_API_KEY"]),
        (PRIMARY, "status", True, KEYS["OPENAI_API_KEY_2"]),
        (FALLBACK_1, "tool_calls", True, KEYS["OPENROUTER_API_KEY"]),
        (FALLBACK_1, "answer", True, KEYS["OPENROUTER_API_KEY"]),
    ]
    # The second call carried the tool call and its result back to the model.
    last = server.requests[-1].body
    assert [m["role"] for m in last["messages"]] == ["system", "user", "assistant", "tool"]
    call = last["messages"][2]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    assert last["messages"][3]["tool_call_id"] == call["id"]
    assert last["tools"][0]["function"]["name"] == "get_weather"


def test_the_agent_loop_reports_a_turn_that_no_target_answered(server):
    # Every target rate limited for an hour: longer than retry_after_cap (30 s), so
    # fallgate neither waits nor finds anything to fall back to: the turn fails.
    server.script({"default": {**LIMITED, "headers": {"retry-after": "3600"}}})
    done = run_agent(server.base_url)
    assert done.returncode == 1
    assert done.stdout.splitlines() == ["> What is the weather in Paris?"]
    assert "[no answer]" in done.stderr
    assert server.counts == {PRIMARY: 2, FALLBACK_1: 1, FALLBACK_2: 1}
