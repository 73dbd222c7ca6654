"""The provider registry: its data, how a target's endpoint and credentials are
resolved from it, the policy's own [providers.<name>] tables, and the quirks
classification reads (with the real SDK over real HTTP)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fallgate.fsm import OutcomeKind, Policy, PolicyError, Target, TurnFailed, instant_waits
from fallgate.fsm.catalogue.registry import PROVIDERS, known, markdown_table, merge, suggest
from fallgate.fsm.policy.model import Credential
from fallgate.providers import Fallgate
from fallgate.providers.openai.exceptions import classify_openai
from fallgate.providers.testing.fault_server import FaultServer

POLICY_DOC = Path(__file__).resolve().parent.parent / "docs" / "policy.md"
MSG = [{"role": "user", "content": "hi"}]
REQUIRED = {
    "openai",
    "openrouter",
    "zai",
    "groq",
    "deepseek",
    "together",
    "fireworks",
    "mistral",
    "gemini",
    "anthropic",
    "xai",
    "ollama",
    "vllm",
}
ENV = re.compile(r"^[A-Z][A-Z0-9_]*$")


@pytest.fixture(autouse=True)
def _instant() -> Iterator[None]:
    with instant_waits():
        yield


# -- the data -----------------------------------------------------------------------------------


def test_every_required_provider_is_there_with_an_endpoint_and_a_credential_source():
    assert REQUIRED <= set(PROVIDERS)
    for name, p in PROVIDERS.items():
        assert p.name == name == name.lower()
        assert p.base_url is not None and not p.base_url.endswith("/")
        assert p.docs, name
        if p.keyless:
            assert p.key_envs == () and p.base_url.startswith("http://localhost:")
        else:
            assert p.base_url.startswith("https://")
            assert p.key_envs and all(ENV.match(k) for k in p.key_envs), name
        for kind in (*p.error_codes.values(), *p.status_kinds.values()):
            assert isinstance(kind, OutcomeKind) and kind is not OutcomeKind.SUCCESS


def test_the_quirks_named_in_the_brief_are_data():
    assert PROVIDERS["zai"].error_codes["1113"] is OutcomeKind.QUOTA
    assert PROVIDERS["anthropic"].status_kinds[529] is OutcomeKind.OVERLOADED
    assert PROVIDERS["openrouter"].errors_in_2xx
    assert PROVIDERS["groq"].quirk(498) is OutcomeKind.OVERLOADED
    # a provider's error code wins over its status
    assert PROVIDERS["zai"].quirk(429, ["1113"]) is OutcomeKind.QUOTA
    assert PROVIDERS["zai"].quirk(429, [None, "invalid_request_error"]) is None


def test_lookup_suggest_and_merge():
    assert suggest("opnrouter") == "openrouter"
    assert suggest("OpenRouter") == "openrouter"
    assert suggest("zzzzzzzz") is None
    moved = merge("zai", base_url="https://api.z.ai/api/coding/paas/v4")
    assert moved.error_codes == PROVIDERS["zai"].error_codes  # quirks are kept
    assert moved.key_envs == ("ZAI_API_KEY",)
    new = merge("mine", base_url="http://127.0.0.1:1/v1", keyless=True)
    assert (new.keyless, new.key_envs) == (True, ())
    assert "mine" in known({"mine": new})


def test_the_documented_known_providers_table_is_the_registry():
    text = POLICY_DOC.read_text(encoding="utf-8")
    start = text.index("\n## Known providers")
    section = text[start:].split("\n## ", 2)[1]  # up to the next section, if any
    lines = section.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| provider |"))
    table = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        table.append(line)
    assert "\n".join(table) + "\n" == markdown_table(), (
        "docs/policy.md's table is stale: paste fallgate.fsm.catalogue.registry.markdown_table()"
    )


# -- resolution ---------------------------------------------------------------------------------


def test_what_a_user_writes_resolves_base_url_and_key_variable():
    p = Policy.from_dict({"primary": {"provider": "openrouter", "model": "z-ai/glm-4.7"}})
    t = p.targets[0]
    assert t.base_url == "https://openrouter.ai/api/v1"
    assert [c.id for c in t.credentials] == ["env:OPENROUTER_API_KEY"]
    assert not t.keyless


def test_the_entry_wins_over_the_registry():
    p = Policy.from_dict(
        {
            "primary": {
                "provider": "zai",
                "model": "glm-4.7",
                "base_url": "https://api.z.ai/api/coding/paas/v4",
                "key_envs": ["ZAI_KEY_1", "ZAI_KEY_2"],
            }
        }
    )
    t = p.targets[0]
    assert t.base_url == "https://api.z.ai/api/coding/paas/v4"
    assert [c.id for c in t.credentials] == ["env:ZAI_KEY_1", "env:ZAI_KEY_2"]


def test_an_unknown_provider_with_explicit_endpoint_and_key_stays_valid():
    p = Policy.from_dict(
        {
            "primary": {
                "provider": "my-proxy",
                "model": "m",
                "base_url": "https://x/v1",
                "api_key": "k",
            }
        }
    )
    assert p.targets[0].base_url == "https://x/v1"


def test_local_providers_are_keyless_and_a_keyless_target_is_spelled_out():
    p = Policy.from_dict(
        {
            "primary": {"provider": "ollama", "model": "llama3"},
            "fallback_providers": [
                {
                    "provider": "llamacpp",
                    "model": "q",
                    "base_url": "http://127.0.0.1:8080/v1",
                    "keyless": True,
                },
                {"provider": "vllm", "model": "v", "key_env": "VLLM_KEY"},  # --api-key server
            ],
        }
    )
    a, b, c = p.targets
    assert (a.base_url, a.keyless, a.credentials) == ("http://localhost:11434/v1", True, ())
    assert (b.keyless, b.credentials) == (True, ())
    assert (c.base_url, c.keyless, [x.id for x in c.credentials]) == (
        "http://localhost:8000/v1",
        False,
        ["env:VLLM_KEY"],
    )


def test_a_typo_in_a_provider_is_one_problem_naming_the_field_and_the_known_ones():
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"primary": {"provider": "opnrouter", "model": "z-ai/glm-4.7"}})
    (problem,) = info.value.problems
    assert problem.path == "primary.provider"
    assert "did you mean 'openrouter'?" in problem.message
    for name in REQUIRED:
        assert name in problem.message


def test_an_unknown_provider_without_a_credential_names_the_key_field():
    with pytest.raises(PolicyError) as info:
        Policy.from_dict(
            {
                "primary": {"provider": "openai", "model": "m"},
                "fallback_providers": [
                    {"provider": "my-proxy", "model": "m", "base_url": "https://x/v1"}
                ],
            }
        )
    (problem,) = info.value.problems
    assert problem.path == "fallback_providers[0].key_env"
    assert "no credential" in problem.message and "keyless = true" in problem.message
    assert "openrouter" in problem.message
    with pytest.raises(PolicyError, match="did you mean 'openrouter'"):
        Policy.from_dict(
            {"primary": {"provider": "openruter", "model": "m", "base_url": "https://x"}}
        )


def test_keyless_and_a_key_together_is_refused():
    with pytest.raises(PolicyError, match=r"primary\.keyless"):
        Policy.from_dict(
            {"primary": {"provider": "ollama", "model": "m", "keyless": True, "api_key": "k"}}
        )


def test_direct_construction_resolves_and_refuses_alike():
    p = Policy(targets=[Target("groq", "llama")])
    assert p.targets[0].base_url == "https://api.groq.com/openai/v1"
    assert p.targets[0].credentials == (Credential.from_env("GROQ_API_KEY"),)
    with pytest.raises(PolicyError, match=r"targets\[0\]\.provider = 'grok'.*did you mean 'groq'"):
        Policy(targets=[Target("grok", "llama")])


# -- the policy's own [providers.<name>] tables -----------------------------------------------


def test_a_providers_table_adds_a_provider_and_overrides_a_known_one():
    p = Policy.from_dict(
        {
            "providers": {
                "corp": {"base_url": "https://llm.corp.example/v1", "key_env": "CORP_KEY"},
                "openrouter": {"base_url": "https://or-proxy.example/api/v1"},
            },
            "primary": {"provider": "corp", "model": "m"},
            "fallback_providers": [{"provider": "openrouter", "model": "x"}],
        }
    )
    corp, orr = p.targets
    assert (corp.base_url, corp.credentials[0].id) == (
        "https://llm.corp.example/v1",
        "env:CORP_KEY",
    )
    assert (orr.base_url, orr.credentials[0].id) == (
        "https://or-proxy.example/api/v1",
        "env:OPENROUTER_API_KEY",
    )
    assert p.provider(orr) is not None and p.provider(orr).status_kinds  # quirks kept


def test_a_bad_providers_table_names_every_field_and_its_toml_line(tmp_path):
    f = tmp_path / "policy.toml"
    f.write_text(
        "[primary]\n"  # 1
        'provider = "openai"\n'  # 2
        'model = "m"\n'  # 3
        "\n"  # 4
        "[providers.corp]\n"  # 5
        'key_env = "1BAD"\n'  # 6
        "\n"  # 7
        "[providers.openrouter]\n"  # 8
        'base_url = "ftp://nope"\n'  # 9
        "keyles = true\n"  # 10
    )
    with pytest.raises(PolicyError) as info:
        Policy.from_toml(f)
    text = str(info.value)
    assert "line 10: providers.openrouter.keyles: unknown field (did you mean 'keyless'?)" in text
    assert "line 9: providers.openrouter.base_url = 'ftp://nope'" in text
    assert "line 5: providers.corp.base_url: missing" in text
    assert "line 6: providers.corp.key_env = *** (4 characters, not shown)" in text
    assert len(info.value.problems) == 4


# -- quirks in classification, over real HTTP ---------------------------------------------------


def _sdk_error(srv: FaultServer, step: dict[str, Any]) -> BaseException:
    srv.script({"models": {"m": [step]}})
    with openai.OpenAI(base_url=srv.base_url, api_key="sk-t", max_retries=0) as c:
        try:
            c.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
        except Exception as e:
            return e
    raise AssertionError("no error")


ZAI_ARREARS = {"error": {"code": "1113", "message": "Your account is in arrears"}}


def test_zai_business_code_1113_is_quota_although_the_status_says_429(fault_server):
    e = _sdk_error(fault_server, {"kind": "status", "status": 429, "body": ZAI_ARREARS})
    assert classify_openai(e).kind is OutcomeKind.RATE_LIMITED  # what the status alone says
    o = classify_openai(e, provider=PROVIDERS["zai"])
    assert o.kind is OutcomeKind.QUOTA and "zai" in o.detail
    assert classify_openai(e, provider=PROVIDERS["openai"]).kind is OutcomeKind.RATE_LIMITED


def test_status_quirks_groq_498_and_openrouter_403(fault_server):
    e = _sdk_error(fault_server, {"kind": "status", "status": 498})
    assert classify_openai(e).kind is OutcomeKind.BAD_REQUEST
    assert classify_openai(e, provider=PROVIDERS["groq"]).kind is OutcomeKind.OVERLOADED
    e = _sdk_error(fault_server, {"kind": "status", "status": 403})
    assert classify_openai(e).kind is OutcomeKind.AUTH
    assert classify_openai(e, provider=PROVIDERS["openrouter"]).kind is (
        OutcomeKind.CONTENT_FILTERED
    )


def test_a_stream_error_event_reads_the_provider_code(fault_server):
    fault_server.script(
        {
            "models": {
                "m": [
                    {"kind": "stream", "chunks": 0, "then": "error", "error": ZAI_ARREARS["error"]}
                ]
            }
        }
    )
    with openai.OpenAI(base_url=fault_server.base_url, api_key="sk-t", max_retries=0) as c:
        with pytest.raises(openai.APIError) as info:
            for _ in c.chat.completions.create(model="m", messages=MSG, stream=True):  # type: ignore[arg-type]
                pass
    assert classify_openai(info.value, provider=PROVIDERS["zai"]).kind is OutcomeKind.QUOTA


def test_a_gate_classifies_each_attempt_with_its_own_providers_quirks(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """z.ai's 1113 rotates away from the key as quota (not a rate limit to wait out), and
    the same body from an openai target stays a rate limit."""
    monkeypatch.setenv("ZAI_API_KEY", "sk-zai-test-1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-test-1")
    fault_server.script(
        {
            "models": {
                "glm-4.7": [{"kind": "status", "status": 429, "body": ZAI_ARREARS}],
                "gpt": [{"kind": "status", "status": 429, "body": ZAI_ARREARS}],
            }
        }
    )
    policy = Policy.from_dict(
        {
            "primary": {"provider": "zai", "model": "glm-4.7"},
            "fallback_providers": [{"provider": "openai", "model": "gpt"}],
            "providers": {
                "zai": {"base_url": fault_server.base_url},
                "openai": {"base_url": fault_server.base_url},
            },
            "max_attempts": 1,
        }
    )
    with Fallgate(policy) as gate, pytest.raises(TurnFailed) as info:
        gate.run(messages=MSG)
    events = [(e.source, e.event) for e in info.value.trace if e.event not in ("start",)]
    assert events[:2] == [("primary", "quota"), ("fallback_1", "rate_limited")]
    assert "(zai: quota)" in info.value.reasons["primary"]


def test_a_stream_that_fails_before_its_first_chunk_is_classified_with_its_providers_quirks(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZAI_API_KEY", "sk-zai-test-1")
    fault_server.script(
        {
            "models": {
                "glm-4.7": [{"kind": "status", "status": 429, "body": ZAI_ARREARS}],
                "glm-4.5": [{"kind": "answer", "text": "hello"}],
            }
        }
    )
    policy = Policy.from_dict(
        {
            "primary": {"provider": "zai", "model": "glm-4.7"},
            "fallback_providers": [{"provider": "zai", "model": "glm-4.5"}],
            "providers": {"zai": {"base_url": fault_server.base_url}},
        }
    )
    with Fallgate(policy) as gate:
        stream = gate.chat.completions.create(messages=MSG, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "hello"
    assert [e.event for e in stream.trace][:2] == ["start", "quota"]


def test_an_error_inside_a_200_reply_is_classified_by_its_code(
    fault_server: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenRouter reports errors that happen once the model has started in a 200 body
    (`errors_in_2xx`): its error.code is the HTTP status it stands for."""
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-test-1")
    body = {"error": {"code": 429, "message": "upstream rate limited"}}
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "status", "status": 200, "body": body}],
                "b": [{"kind": "answer", "text": "hello"}],
            }
        }
    )
    policy = Policy.from_dict(
        {
            "primary": {"provider": "openrouter", "model": "a"},
            "fallback_providers": [{"provider": "openrouter", "model": "b"}],
            "providers": {"openrouter": {"base_url": fault_server.base_url}},
        }
    )
    with Fallgate(policy) as gate:
        result = gate.run(messages=MSG)
    assert result.model == "b"
    assert [e.event for e in result.trace][:2] == ["start", "rate_limited"]


def test_the_documented_example_error_and_provider_tables_are_real():
    import tomllib

    text = POLICY_DOC.read_text(encoding="utf-8")
    start = text.index("\n## Known providers")
    section = text[start:].split("\n## ", 2)[1]  # up to the next section, if any
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"primary": {"provider": "opnrouter", "model": "z-ai/glm-4.7"}})
    assert str(info.value) in section
    toml = section.split("```toml\n", 1)[1].split("```", 1)[0]
    data = tomllib.loads(toml)
    data["primary"] = {"provider": "llamacpp", "model": "m"}
    data["fallback_providers"] = [
        {"provider": "corp", "model": "m"},
        {"provider": "openrouter", "model": "m"},
    ]
    a, b, c = Policy.from_dict(data).targets
    assert (a.keyless, b.credentials[1].id, c.base_url) == (
        True,
        "env:CORP_KEY_2",
        "https://or-proxy.internal/api/v1",
    )
