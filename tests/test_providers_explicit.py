"""No silent fall-through to the SDK's own defaults.

A second fault server is the TRAP: the environment points the openai SDK's
defaults at it (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, and openai 3.x's
``OPENAI_CUSTOM_HEADERS`` with an ``Authorization`` of its own). Turns to
registry-resolved targets (the registry entry's base_url overridden in the
policy to point at the real fault server on loopback) must reach the real
server with the target's own key, and the trap must see nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fallgate.fsm import Policy, Target, instant_waits
from fallgate.fsm.policy.model import KEYLESS_PLACEHOLDER, Credential
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.openai.http.pools import check_client, client_arguments, openai_factory
from fallgate.providers.testing.fault_server import FaultServer

MSG = [{"role": "user", "content": "hi"}]
TRAP_KEY = "sk-trap-must-never-be-sent-000000"
OR_KEY = "sk-or-test-openrouter-111111"
ZAI_KEY = "sk-zai-test-222222"


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


@pytest.fixture
def trap(monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultServer]:
    """A fault server the SDK's environment defaults point at; it must see no request."""
    with FaultServer() as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", TRAP_KEY)
        monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", f"Authorization: Bearer {TRAP_KEY}\nX-Trap: 1")
        monkeypatch.setenv("OPENAI_ORG_ID", "org-trap")
        monkeypatch.setenv("OPENROUTER_API_KEY", OR_KEY)
        monkeypatch.setenv("ZAI_API_KEY", ZAI_KEY)
        yield srv
        assert srv.requests == [], "a request reached the SDK's default endpoint"


def registry_policy(srv: FaultServer) -> Policy:
    """What a user writes (provider + model), with the registry entries pointed at `srv`."""
    return Policy.from_dict(
        {
            "primary": {"provider": "openrouter", "model": "z-ai/glm-4.7"},
            "fallback_providers": [
                {"provider": "zai", "model": "glm-4.7"},
                {"provider": "ollama", "model": "llama3"},
            ],
            "providers": {
                "openrouter": {"base_url": srv.base_url},
                "zai": {"base_url": srv.base_url},
                "ollama": {"base_url": srv.base_url},
            },
            "max_attempts": 1,
        }
    )


def test_registry_targets_reach_their_server_with_their_keys_never_the_trap(
    fault_server: FaultServer, trap: FaultServer
) -> None:
    fault_server.script(
        {
            "models": {
                "z-ai/glm-4.7": [{"kind": "status", "status": 503}],
                "glm-4.7": [{"kind": "status", "status": 503}],
                "llama3": [{"kind": "answer", "text": "from ollama"}],
            }
        }
    )
    policy = registry_policy(fault_server)
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
    assert result.model == "llama3"
    seen = [(r.model, r.api_key) for r in fault_server.requests]
    assert seen == [
        ("z-ai/glm-4.7", OR_KEY),
        ("glm-4.7", ZAI_KEY),
        ("llama3", KEYLESS_PLACEHOLDER),
    ]
    for r in fault_server.requests:
        assert r.header("x-trap") is None
        assert r.header("openai-organization") is None


async def test_the_async_client_never_reaches_the_trap_either(
    fault_server: FaultServer, trap: FaultServer
) -> None:
    policy = registry_policy(fault_server)
    async with AsyncFallgate(policy) as gate:
        reply = await gate.chat.completions.create(messages=MSG)
        stream = await gate.chat.completions.create(messages=MSG, stream=True)
        async for _ in stream:
            pass
    assert reply.choices[0].message.content == "ok"
    assert [r.api_key for r in fault_server.requests] == [OR_KEY, OR_KEY]


def test_with_options_copies_keep_the_explicit_endpoint_key_and_headers(
    fault_server: FaultServer, trap: FaultServer
) -> None:
    policy = registry_policy(fault_server)
    with Fallgate(policy) as gate:
        gate.with_options(default_headers={"x-tenant": "t1"}).run(messages=MSG)
    (r,) = fault_server.requests
    assert (r.api_key, r.header("x-tenant"), r.header("x-trap")) == (OR_KEY, "t1", None)
    assert r.header("openai-organization") is None


def test_an_organization_the_caller_asks_for_is_sent_the_environments_never(
    fault_server: FaultServer, trap: FaultServer
) -> None:
    policy = registry_policy(fault_server)
    with Fallgate(policy) as gate:
        gate.with_options(organization="org-mine").run(messages=MSG)
        gate.run(messages=MSG)
    asked, plain = fault_server.requests
    assert asked.header("openai-organization") == "org-mine"
    assert plain.header("openai-organization") is None  # OPENAI_ORG_ID is org-trap


def test_the_default_factory_refuses_a_target_without_a_base_url(trap: FaultServer) -> None:
    # A Target built by hand (no Policy to resolve it) must not become an SDK default.
    bare = Target("openrouter", "m", credentials=[Credential.literal(OR_KEY)])
    with pytest.raises(ValueError, match="no base_url"):
        openai_factory(1.0)(bare, OR_KEY)
    with pytest.raises(ValueError, match="empty key"):
        client_arguments(Target("x", "m", "http://127.0.0.1:9/v1"), "")


def test_check_client_catches_a_client_pointed_elsewhere(trap: FaultServer) -> None:
    import openai

    target = Target("x", "m", "http://127.0.0.1:9/v1", keyless=True)
    with openai.OpenAI(api_key="k") as stray:  # base_url from OPENAI_BASE_URL: the trap
        with pytest.raises(ValueError, match="refusing to send"):
            check_client(stray, target, "k")
    with openai.OpenAI(**client_arguments(target, "k")) as good:
        check_client(good, target, "k")


def test_openai_endpoints_keep_the_organization_header_others_never_get_it() -> None:
    openai_target = Policy.from_dict(
        {"primary": {"provider": "openai", "model": "m", "api_key": "k"}}
    ).targets[0]
    other = Target("x", "m", "http://127.0.0.1:9/v1", keyless=True)
    assert "OpenAI-Organization" not in client_arguments(openai_target, "k")["default_headers"]
    assert "OpenAI-Organization" in client_arguments(other, "k")["default_headers"]
