"""`fallgate.providers.testing` (the public test aids) and the pytest plugin."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import fallgate.fsm.clock
import fallgate.fsm.host.scripted
import fallgate.providers.testing
import fallgate.providers.testing.fault_server
import fallgate.providers.testing.redis_server
import openai
import pytest
from fallgate.fsm import Policy
from fallgate.providers.testing import FaultServer, Played, VirtualClock, load_script, play

AIDS = {
    "FaultServer": fallgate.providers.testing.fault_server,
    "Script": fallgate.providers.testing.fault_server,
    "ScriptError": fallgate.providers.testing.fault_server,
    "load_script": fallgate.providers.testing.fault_server,
    "Played": fallgate.fsm.host.scripted,
    "ScriptExhausted": fallgate.fsm.host.scripted,
    "play": fallgate.fsm.host.scripted,
    "RedisServer": fallgate.providers.testing.redis_server,
    "RedisServerMissing": fallgate.providers.testing.redis_server,
    "VirtualClock": fallgate.fsm.clock,
}


@pytest.mark.parametrize("name", sorted(AIDS))
def test_each_aid_is_the_original_not_a_copy(name: str) -> None:
    assert getattr(fallgate.providers.testing, name) is getattr(AIDS[name], name)


def test_the_testing_module_exports_exactly_the_aids() -> None:
    assert sorted(fallgate.providers.testing.__all__) == sorted(AIDS)


def test_the_installed_pytest_plugin_is_the_testing_plugin() -> None:
    [plugin] = [e for e in entry_points(group="pytest11") if e.name == "fallgate"]
    assert plugin.value == "fallgate.providers.testing.plugin"
    assert callable(plugin.load().fault_server)


def test_the_fixture_gives_a_started_server(fault_server: FaultServer) -> None:
    assert isinstance(fault_server, FaultServer)
    with openai.OpenAI(base_url=fault_server.base_url, api_key="sk-t", max_retries=0) as c:
        reply = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "ok"
    assert fault_server.count("m") == 1


def test_the_aids_play_a_script_file_and_an_outcome_sequence(tmp_path: Path) -> None:
    path = tmp_path / "faults.toml"
    path.write_text('[[models.a]]\nkind = "status"\nstatus = 503\n')
    with FaultServer(load_script(path)) as srv:
        with openai.OpenAI(base_url=srv.base_url, api_key="sk-t", max_retries=0) as c:
            with pytest.raises(openai.InternalServerError):
                c.chat.completions.create(model="a", messages=[])
    policy = Policy.from_dict(
        {
            "primary": {"provider": "openai", "model": "a", "api_key": "sk-a"},
            "fallback_providers": [{"provider": "openai", "model": "b", "api_key": "sk-b"}],
        }
    )
    played = play(policy, ["rate_limited:30", "success"], clock=VirtualClock())
    assert isinstance(played, Played)
    assert played.models == ["a", "b"]
    assert played.state == "done"


def test_the_plugin_and_a_valid_script_load_neither_openai_nor_the_core(tmp_path: Path) -> None:
    """The plugin loads in every pytest session of a project that installs fallgate."""
    path = tmp_path / "ok.toml"
    path.write_text('[default]\nkind = "answer"\n')
    code = (
        "import sys; import fallgate.providers.testing.plugin as p; "
        "import fallgate.providers.testing.fault_server as f; f.load_script(sys.argv[1]); "
        "print(sorted(m for m in ('openai', 'fsm') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("outcomes", "error", "says"),
    [
        (["transport", "bogus"], ValueError, "outcomes[1]: outcome 'bogus': 'bogus' is not one of"),
        (["rate_limited:soon"], ValueError, "the Retry-After 'soon' is not a number"),
        ([5], ValueError, "outcomes[0]: an outcome is an Outcome or 'kind[:retry_after]', got 5"),
        ("success", TypeError, "outcomes must be a list of outcomes, got 'success'"),
    ],
)
def test_a_bad_scripted_outcome_is_named_with_its_position(
    outcomes: Any, error: type[Exception], says: str
) -> None:
    """Before, these were a bare enum error, an AttributeError, or a string read as a
    list of one-letter outcomes ("'s' is not a valid OutcomeKind")."""
    policy = Policy.from_dict({"primary": {"provider": "openai", "model": "m", "key_env": "K"}})
    with pytest.raises(error) as caught:
        play(policy, outcomes)
    assert says in str(caught.value)


def test_the_virtual_clock_has_one_name() -> None:
    """`FakeClock` (an alias of `VirtualClock`) is gone: one clock, one name."""
    import fallgate.testing

    for module in (fallgate.testing, fallgate.providers.testing, fallgate.fsm.host.scripted):
        assert not hasattr(module, "FakeClock"), module.__name__
    assert fallgate.testing.VirtualClock is fallgate.VirtualClock
