"""fallgate.providers.integrations.hermes without hermes-agent installed.

The real agent is exercised by tests/hermes/check_hermes.py (`make test-hermes`,
in a venv of its own). Here: importing the module never imports hermes, and
`attach` does what it says on a stand-in with the members of hermes' `AIAgent`
it patches: calls go through the chain, a failed turn is a `HermesTurnFailed`
whose cause is the provider's error, hermes' retry count and fallback are
switched off, an abort cancels the request's turn, `detach` restores all.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fallgate.fsm import Policy, TurnFailed, instant_waits
from fallgate.providers.integrations.hermes import (
    HermesChatClient,
    HermesTurnFailed,
    attach,
    detach,
)
from fallgate.providers.testing.fault_server import FaultServer

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


class StandIn:
    """The members of hermes' AIAgent that attach reads or patches."""

    api_mode = "chat_completions"

    def __init__(self, base_url: str, chain: list[dict[str, Any]]) -> None:
        self.provider, self.model, self.base_url = "zai", "glm-5.1", base_url
        self._client_kwargs = {"api_key": "sk-primary", "base_url": base_url}
        self._api_max_retries = 3
        self._fallback_chain = chain
        self._fallback_index = 0
        self._fallback_model = chain[0] if chain else None
        self._credential_pool = None
        self.built: list[tuple[str, bool]] = []
        self.closed: list[str] = []
        self.client = self._create_openai_client(self._client_kwargs, reason="init", shared=True)

    def _create_openai_client(self, kwargs: dict[str, Any], *, reason: str, shared: bool) -> Any:
        self.built.append((reason, shared))
        return openai.OpenAI(**{**kwargs, "max_retries": 0})

    def _close_openai_client(self, client: Any, *, reason: str, shared: bool) -> None:
        self.closed.append(reason)
        client.close()

    def _abort_request_openai_client(self, client: Any, *, reason: str) -> None:
        raise AssertionError("hermes' own abort ran for a fallgate client")

    def _try_activate_fallback(self, reason: Any = None) -> bool:
        raise AssertionError("hermes' own fallback ran")

    def _try_recover_primary_transport(self, *a: Any, **k: Any) -> bool:
        raise AssertionError("hermes' own transport recovery ran")

    def _recover_with_credential_pool(self, **k: Any) -> tuple[bool, bool]:
        raise AssertionError("hermes' own credential rotation ran")


def _agent(srv: FaultServer) -> StandIn:
    fb = {"provider": "zai", "model": "glm-4.7", "base_url": srv.base_url, "api_key": "sk-fb"}
    return StandIn(srv.base_url, [fb])


def test_importing_the_module_imports_nothing_of_hermes(tmp_path: Path) -> None:
    for pkg in ("agent", "hermes_cli", "tools"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text(f"raise ImportError('{pkg} imported')\n")
    (tmp_path / "run_agent.py").write_text("raise ImportError('run_agent imported')\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
        "import fallgate.providers.integrations.hermes as h; "
        "assert not {'agent', 'run_agent', 'hermes_cli', 'tools'} & set(sys.modules); "
        "print(h.attach.__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "attach"


def test_attach_routes_the_agents_calls_through_the_chain(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"glm-5.1": [{"kind": "status", "status": 429}]}})
    agent = _agent(fault_server)
    att = attach(agent)
    try:
        # hermes' own retries and fallback are off; its chain became fallgate's
        assert agent._api_max_retries == 1
        assert agent._fallback_chain == [] and agent._fallback_model is None
        assert [t.model for t in att.policy.targets] == ["glm-5.1", "glm-4.7"]
        assert agent._try_activate_fallback() is False and att.fallback_refusals == 1
        assert agent._try_recover_primary_transport(Exception(), retry_count=3) is False
        assert agent._recover_with_credential_pool(has_retried_429=True) == (False, True)
        assert agent.closed == ["fallgate_attach"]  # hermes' own shared client, closed
        # hermes builds a client per request through the patched builder
        client = agent._create_openai_client(agent._client_kwargs, reason="req", shared=False)
        assert isinstance(client, HermesChatClient) and not client.is_closed()
        reply = client.chat.completions.create(model="glm-5.1", messages=MSG)
        assert reply.choices[0].message.content == "ok"
        assert [(r.model, r.api_key) for r in fault_server.requests] == [
            ("glm-5.1", "sk-primary"),
            ("glm-4.7", "sk-fb"),
        ]
        # each target's SDK client was built by hermes' own builder
        assert agent.built.count(("fallgate_attempt", False)) == 2
        stream = agent.client.chat.completions.create(model="glm-5.1", messages=MSG, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == "ok"
        client.close()
        assert client.is_closed()
    finally:
        att.detach()


def test_a_failed_turn_is_a_hermes_turn_failed_caused_by_the_provider_error(
    fault_server: FaultServer,
) -> None:
    fault_server.script(
        {
            "models": {
                "glm-5.1": [{"kind": "status", "status": 503}],
                "glm-4.7": [{"kind": "status", "status": 402}],
            }
        }
    )
    agent = _agent(fault_server)
    att = attach(agent, {"max_attempts": 1})
    try:
        with pytest.raises(HermesTurnFailed) as info:
            agent.client.chat.completions.create(model="glm-5.1", messages=MSG)
    finally:
        att.detach()
    e = info.value
    assert isinstance(e, TurnFailed)
    assert str(e).startswith("fallgate turn failed")
    assert "primary" in str(e) and "fallback_1" in str(e)
    # what hermes' classifier reads: the provider's own error, as its cause
    assert isinstance(e.__cause__, openai.APIStatusError) and e.__cause__.status_code == 402
    assert not hasattr(e, "status_code")  # so hermes' Z.AI long-retry check never fires
    assert fault_server.counts == {"glm-5.1": 1, "glm-4.7": 1}


def test_hermes_abort_cancels_the_requests_turn(fault_server: FaultServer) -> None:
    agent = _agent(fault_server)
    att = attach(agent)
    try:
        client = agent._create_openai_client(agent._client_kwargs, reason="req", shared=False)
        agent._abort_request_openai_client(client, reason="interrupt")
        with pytest.raises(HermesTurnFailed) as info:
            client.chat.completions.create(model="glm-5.1", messages=MSG)
    finally:
        att.detach()
    assert info.value.state == "aborted"
    assert fault_server.counts == {}


def test_an_explicit_policy_is_used_as_is(fault_server: FaultServer) -> None:
    policy = Policy.from_dict(
        {
            "primary": {
                "provider": "x",
                "model": "m1",
                "base_url": fault_server.base_url,
                "api_key": "sk-1",
            },
        }
    )
    agent = _agent(fault_server)
    att = attach(agent, policy)
    try:
        # hermes always sends its own model: the chain decides which one is called
        agent.client.chat.completions.create(model="glm-5.1", messages=MSG)
    finally:
        att.detach()
    assert att.policy is policy
    assert [r.model for r in fault_server.requests] == ["m1"]


def test_detach_gives_hermes_back_its_client_retries_and_fallback(
    fault_server: FaultServer,
) -> None:
    agent = _agent(fault_server)
    chain = agent._fallback_chain
    attach(agent)
    attach(agent)  # attaching again replaces the attachment
    detach(agent)
    assert agent._api_max_retries == 3 and agent._fallback_chain is chain
    assert isinstance(agent.client, openai.OpenAI)
    assert "_create_openai_client" not in vars(agent) and not hasattr(agent, "_fallgate")
    with pytest.raises(AssertionError, match="own fallback"):
        agent._try_activate_fallback()
    agent.client.close()


def test_attach_refuses_what_it_does_not_cover(fault_server: FaultServer) -> None:
    agent = _agent(fault_server)
    agent.api_mode = "anthropic_messages"
    with pytest.raises(ValueError, match="chat_completions"):
        attach(agent)
    agent.api_mode = "chat_completions"
    with pytest.raises(TypeError, match="policy must be"):
        attach(agent, 42)  # type: ignore[arg-type]
    agent.client.close()


def test_a_model_switch_in_hermes_rebuilds_the_chain(fault_server: FaultServer) -> None:
    agent = _agent(fault_server)
    att = attach(agent)
    try:
        agent.client.chat.completions.create(model="glm-5.1", messages=MSG)
        # hermes' /model: new model and client kwargs, the client rebuilt through the builder
        agent.model = "glm-5.2"
        agent._client_kwargs = {"api_key": "sk-new", "base_url": fault_server.base_url}
        agent.client = agent._create_openai_client(agent._client_kwargs, reason="x", shared=True)
        agent.client.chat.completions.create(model="glm-5.2", messages=MSG)
    finally:
        att.detach()
    assert [(r.model, r.api_key) for r in fault_server.requests] == [
        ("glm-5.1", "sk-primary"),
        ("glm-5.2", "sk-new"),
    ]
    assert [t.model for t in att.policy.targets] == ["glm-5.2", "glm-4.7"]


class _Pooled:
    def __init__(self, key: str, base_url: str | None) -> None:
        self.runtime_api_key, self.runtime_base_url = key, base_url


class _Pool:
    def __init__(self, *entries: _Pooled) -> None:
        self._entries = list(entries)

    def entries(self) -> list[_Pooled]:
        return self._entries


def test_the_credential_pools_keys_are_the_primarys_keys(fault_server: FaultServer) -> None:
    fault_server.script({"models": {"glm-5.1": [{"kind": "status", "status": 401}]}})
    agent = _agent(fault_server)
    agent._credential_pool = _Pool(
        _Pooled("sk-primary", None),
        _Pooled("sk-pool-2", fault_server.base_url),
        _Pooled("sk-elsewhere", "https://elsewhere.example/v1"),
    )
    att = attach(agent)
    try:
        agent.client.chat.completions.create(model="glm-5.1", messages=MSG)
    finally:
        att.detach()
    # fallgate rotates the pool's keys (hermes' own pool rotation is off)
    assert [(r.model, r.api_key) for r in fault_server.requests] == [
        ("glm-5.1", "sk-primary"),
        ("glm-5.1", "sk-pool-2"),
    ]
