"""First contact: the messages a new user meets say what happened and what to do
(issue 24, finding 9). On main a 429 with Retry-After 3600 and no fallback said
"Retry-After 3600s" without "not waited"; the next turn said "every target is cooling"
with no word on when or how to clear it; a top-level knob written after ``[primary]``
in TOML said "unknown field" only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fallgate.fsm import HealthStore, Policy, TurnFailed, instant_waits
from fallgate.fsm.errors import PolicyError
from fallgate.providers import Fallgate
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


def test_a_retry_after_over_the_cap_says_why_it_was_not_waited_and_how_to_clear_it(
    fault_server: FaultServer,
) -> None:
    fault_server.script(
        {"default": {"kind": "status", "status": 429, "headers": {"retry-after": "3600"}}}
    )
    health = HealthStore()
    with Fallgate(chain("a", server=fault_server), health=health) as gate:
        with pytest.raises(TurnFailed) as first:
            gate.run(messages=MSG)
        assert "Retry-After is more than retry_after_cap = 30 s, so not waited" in str(first.value)
        with pytest.raises(TurnFailed) as second:
            gate.run(messages=MSG)
        text = str(second.value)
        assert "every target is cooling" in text
        assert "free in 3600 s" in text or "free in 3599 s" in text, text
        assert "health.clear()" in text and "fallgate health --store URL --reset all" in text
        health.clear()
        fault_server.script({"default": {"kind": "answer"}})
        assert gate.run(messages=MSG).model == "a"  # what the message said works


def test_a_top_level_knob_written_after_the_primary_table_says_move_it_up(
    tmp_path: Path,
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(
        '[primary]\nprovider = "p"\nmodel = "m"\nbase_url = "https://p.test/v1"\n'
        'api_key = "abcdefgh"\ndeadline = 30\n'
    )
    with pytest.raises(PolicyError) as info:
        Policy.from_toml(path)
    text = str(info.value)
    assert "line 6: primary.deadline: unknown field" in text, text
    assert "move it above the first table" in text


def test_a_fault_server_on_a_fixed_port_serves_a_policy_written_beforehand() -> None:
    with FaultServer(port=0) as probe:
        port = probe.port  # a port that was free a moment ago
    with FaultServer({"default": {"kind": "answer", "text": "fixed"}}, port=port) as srv:
        assert srv.base_url == f"http://127.0.0.1:{port}/v1"
        policy = Policy.from_dict(
            {
                "primary": {
                    "provider": "local",
                    "model": "m",
                    "base_url": f"http://127.0.0.1:{port}/v1",
                    "keyless": True,
                }
            }
        )
        with Fallgate(policy) as gate:
            assert gate.run(messages=MSG).value.choices[0].message.content == "fixed"
