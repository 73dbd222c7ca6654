"""No key is echoed: not by a validation error, a repr, a diagram, a trace, nor by the
provider's own error text kept in `TurnFailed.last_error`.

Keys come from the shapes real providers issue (``sk-proj-...``, ``gsk_...``,
``AIza...``, Z.AI's ``<hex>.<alnum>``, Azure's 32 hex digits) and are put where users
put them by mistake: a field meant for a variable name, the primary itself, a
fallback entry, ``rotation``, a field name, ``base_url`` (``user:key@``, ``?key=``).
Providers echo a bad key in many styles; twelve of them are replayed through the real
SDK against the fault server.
"""

from __future__ import annotations

import string
from typing import Any

import pytest
from fallgate.fsm import HealthStore, Outcome, Policy, VirtualClock, run
from fallgate.fsm import redact as redaction
from fallgate.fsm.core.machine import declare
from fallgate.fsm.diagram.overview import to_mermaid_overview
from fallgate.fsm.diagram.render import to_dot, to_mermaid
from fallgate.fsm.errors import PolicyError
from fallgate.fsm.host.scripted import play
from fallgate.fsm.kinds import OutcomeKind
from fallgate.fsm.trace import to_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

from fallgate import Fallgate, TurnFailed

from helpers import chain

#: A realistic key with a distinctive tail (providers print the last 4 characters).
KEY = "sk-proj-T3xq9LmZ0aB7cD2eF5gH8iJ1kN4oP6rS2uV9wY3zQ7zX"
OTHER = "sk-proj-Wm4Yk8Rb2Nc6Pd0Qf3Sg7Th1Vj5Xl9Zn2Bp6Cr0Dt8Fv"  # the pool's second key

ALNUM = string.ascii_letters + string.digits


def pieces(key: str, size: int = 8) -> list[str]:
    """Every `size`-character window of `key`'s body (what a partial echo would show)."""
    body = key.split("-")[-1] if key.startswith("sk-") else key
    return [body[i : i + size] for i in range(0, len(body) - size + 1)]


def shows_key(text: str, key: str) -> list[str]:
    return [p for p in [key, *pieces(key)] if p in text]


@st.composite
def keys(draw: Any) -> str:
    """API keys in the shapes real providers issue."""
    body = draw(st.text(ALNUM, min_size=24, max_size=60).filter(
        lambda b: any(c.isdigit() for c in b) and any(c.isalpha() for c in b)))  # fmt: skip
    shape = draw(st.sampled_from(["sk-proj-", "sk-", "sk-ant-api03-", "sk-or-v1-", "gsk_",
                                  "AIza", "xai-", "hex", "zai"]))  # fmt: skip
    hexed = draw(st.text("0123456789abcdef", min_size=32, max_size=32).filter(
        lambda h: any(c.isdigit() for c in h) and any(c.isalpha() for c in h)))  # fmt: skip
    if shape == "zai":  # Z.AI: 32 hex digits, a dot, 16 letters and digits
        return f"{hexed}.{body[:16]}"
    if shape == "hex":  # Azure OpenAI, DeepSeek-style opaque keys
        return hexed
    return shape + body


#: Each place a key lands by mistake, as a function of the key: the policy dict.
def _primary(**fields: Any) -> dict[str, Any]:
    return {"provider": "openai", "model": "gpt-4.1", **fields}


MISPLACED = {
    "key_env": lambda k: {"primary": _primary(key_env=k)},
    "key_envs": lambda k: {"primary": _primary(key_envs=["OK_NAME", k])},
    "the primary itself": lambda k: {"primary": k},
    "a fallback entry": lambda k: {"primary": _primary(), "fallback_providers": [k]},
    "rotation": lambda k: {"primary": _primary(rotation=k)},
    "provider": lambda k: {"primary": {"provider": k, "model": "m"}},
    "model": lambda k: {"primary": _primary(model=k)},
    "a field name": lambda k: {"primary": _primary(**{k: "x"})},
    "a top-level field name": lambda k: {"primary": _primary(), k: 1},
    "deadline": lambda k: {"primary": _primary(), "deadline": k},
    "a rules table": lambda k: {"primary": _primary(), "rules": {k: {}}},
    "context_length": lambda k: {"primary": _primary(context_length=k)},
    "a providers table key_env": lambda k: {
        "primary": _primary(),
        "providers": {"corp": {"base_url": "https://c/v1", "key_env": k}},
    },
    "base_url as the key": lambda k: {"primary": _primary(base_url=k)},
    "a base_url with a bad scheme and the key": lambda k: {
        "primary": _primary(base_url=f"ftp://u:{k}@host/v1")
    },
}


@settings(deadline=None)
@given(key=keys(), where=st.sampled_from(sorted(MISPLACED)))
def test_a_key_typed_into_the_wrong_field_is_named_never_echoed(key, where):
    """For every key shape and every field a key can be typed into by mistake, the
    validation error names the field and holds no 8-character piece of the key."""
    with pytest.raises(PolicyError) as caught:
        Policy.from_dict(MISPLACED[where](key))
    text = f"{caught.value}\n{caught.value!r}\n{caught.value.problems!r}"
    assert shows_key(text, key) == []
    assert "primary" in text or "deadline" in text or "rules" in text or "providers" in text or (
        "<policy>" in text
    )  # fmt: skip


def test_a_key_in_key_env_says_where_it_belongs():
    with pytest.raises(PolicyError) as caught:
        Policy.from_dict({"primary": _primary(key_env=KEY)})
    text = str(caught.value)
    assert f"primary.key_env = *** ({len(KEY)} characters, not shown)" in text
    assert "looks like an API key" in text and "environment variable" in text


@settings(max_examples=40, deadline=None)
@given(key=keys(), other=keys())
def test_base_url_credentials_never_show_in_a_repr_trace_or_diagram(key, other):
    """A key in base_url's user info or query shows in no repr, trace, diagram,
    failure text or health snapshot; the URL's host and path still do."""
    url = f"https://user:{key}@llm.example/v1?api-version=2024-06-01&key={other}"
    policy = Policy.from_dict(
        {"primary": _primary(base_url=url, api_key="sk-literal-0000x9"), "max_attempts": 1}
    )
    health = HealthStore()
    played = play(policy, [Outcome(OutcomeKind.OVERLOADED, status=503)], health=health)
    texts = [
        repr(policy), str(policy.targets[0]), repr(played.calls), to_jsonl(played.trace),
        to_mermaid(declare(policy)), to_dot(declare(policy)),
        to_mermaid_overview(declare(policy)), str(played.error),
        repr(health.snapshot()), repr(policy.targets[0].key),
    ]  # fmt: skip
    for text in texts:
        assert shows_key(text, key) == [] and shows_key(text, other) == []
    assert "llm.example/v1?api-version=2024-06-01" in repr(policy)


def test_two_base_urls_that_differ_only_in_their_key_keep_apart_in_the_health_store():
    a = Policy.from_dict({"primary": _primary(base_url=f"https://h/v1?key={KEY}")})
    b = Policy.from_dict({"primary": _primary(base_url=f"https://h/v1?key={OTHER}")})
    assert a.targets[0].key != b.targets[0].key
    assert "?key=***#" in a.targets[0].key[0]  # (endpoint, model): the backend


def test_safe_url_keeps_what_is_not_a_secret():
    assert redaction.safe_url("https://api.example.com/v1") == "https://api.example.com/v1"
    assert redaction.safe_url("https://me:pw@h/v1?api-version=1&api_key=zz") == (
        "https://***@h/v1?api-version=1&api_key=***"
    )
    assert redaction.safe_url(None) is None


# -- the provider's own text --------------------------------------------------------------

ECHO_STYLES = {
    "OpenAI's masked echo": "Incorrect API key provided: sk-proj-*****************Q7zX. You "
    "can find your API key at https://platform.openai.com/account/api-keys.",
    "the whole key": f"Invalid API key: {KEY}",
    "prefix...suffix": f"API key {KEY[:10]}...{KEY[-4:]} is invalid",
    "prefix…suffix": f"The key {KEY[:7]}…{KEY[-4:]} was rejected",
    "a JSON echo": f'bad credentials {{"api_key": "{KEY}"}}',
    "a URL query": f"request to https://llm.example/v1/chat?key={KEY} was denied",
    "a bearer header": f"Authorization: Bearer {KEY} is not allowed",
    "the tail only": f"The key ending in {KEY[-4:]} was revoked",
    "a star mask before the tail": f"key ****{KEY[-4:]} disabled",
    "the body without its prefix": f"unknown key {KEY[8:]}",
    "an x mask": f"invalid key sk-proj-xxxxxxxxxxxxxxxx{KEY[-4:]}",
    "another key of the pool": f"key {OTHER} belongs to another project",
}


def _leaks(text: str) -> list[str]:
    found = shows_key(text, KEY) + shows_key(text, OTHER)
    return found + ([KEY[-4:]] if KEY[-4:] in text else [])


@pytest.mark.parametrize("style", sorted(ECHO_STYLES))
def test_the_real_sdk_error_that_echoes_the_key_is_scrubbed_everywhere(fault_server, style):
    message = ECHO_STYLES[style]
    body = {"error": {"message": message, "type": "invalid_request_error", "code": "bad_key",
                      "param": message}}  # fmt: skip
    fault_server.script({"default": {"kind": "status", "status": 401, "body": body}})
    policy = chain({"model": "m0", "api_keys": [KEY, OTHER]}, server=fault_server)
    with Fallgate(policy, clock=VirtualClock()) as client:
        with pytest.raises(TurnFailed) as caught:
            client.chat.completions.create(messages=[{"role": "user", "content": "hi"}])
    failed = caught.value
    error = failed.last_error
    assert error is not None and getattr(error, "status_code", None) == 401  # the SDK's own
    texts = {
        "str(TurnFailed)": str(failed),
        "repr(TurnFailed)": repr(failed),
        "str(last_error)": str(error),
        "repr(last_error)": repr(error),
        "last_error.message": str(getattr(error, "message", "")),
        "last_error.body": repr(getattr(error, "body", "")),
        "trace": to_jsonl(failed.trace),
    }
    leaks = {where: _leaks(text) for where, text in texts.items() if _leaks(text)}
    assert leaks == {}
    assert "401" in str(error)  # the rest of the provider's text is kept


STYLES = {
    "whole": lambda k: k,
    "prefix...tail": lambda k: f"{k[:10]}...{k[-4:]}",
    "prefix***tail": lambda k: f"{k[:7]}****{k[-4:]}",
    "tail only": lambda k: f"key ending in {k[-4:]}",
    "form field": lambda k: f"key={k}",
    "quoted": lambda k: f"'{k}'",
    "url user info": lambda k: f"https://u:{k}@h/v1",
    "bearer": lambda k: f"Bearer {k}",
}


@settings(deadline=None)
@given(key=keys(), style=st.sampled_from(sorted(STYLES)))
def test_scrubbing_an_exception_leaves_no_piece_of_a_known_key(key, style):
    """Whatever the key and however it is echoed, a scrubbed exception's str, repr and
    text attributes hold no 8-character piece of it and not its last four characters."""
    echo = STYLES[style](key)
    error = ValueError(f"provider said: {echo} (code 401)")
    error.body = {"error": {"message": echo, "list": [echo]}}  # type: ignore[attr-defined]
    redaction.scrub_exception(error, [key])
    text = f"{error}\n{error!r}\n{error.body!r}"  # type: ignore[attr-defined]
    assert shows_key(text, key) == []
    assert key[-4:] not in text.replace("code 401", "")


@settings(deadline=None)
@given(key=keys())
def test_every_issued_key_shape_looks_like_a_key_even_when_unknown(key):
    """Keys the policy does not know are still recognised by their shape."""
    assert redaction.looks_like_key(key)
    assert shows_key(redaction.redact(f"echo: {key}!"), key) == []


@pytest.mark.parametrize(
    "text",
    ["gpt-4.1-2025-04-14", "meta-llama/Llama-3.3-70B-Instruct-Turbo", "z-ai/glm-4.7",
     "https://api.openai.com/v1", "overloaded (HTTP 503): Service Unavailable",
     "deepseek-r1-distill-llama-70b", "fallback_1: cooling for 170.0s after quota (HTTP 402)"],
)  # fmt: skip
def test_ordinary_words_model_names_and_urls_are_left_alone(text):
    assert not redaction.looks_like_key(text)
    assert redaction.redact(text) == text


def test_a_run_of_the_core_keeps_its_exception_scrubbed_for_the_caller():
    """`fsm.run` with any transport: the exception it keeps as `last_error` is the one
    the call raised, scrubbed; the failure text holds no key either."""
    policy = chain({"model": "m0", "api_keys": [KEY, OTHER]})

    class Echo(Exception):
        status_code = 401

    raised: list[Exception] = []

    def call(target: Any, credential: Any) -> str:
        raised.append(Echo(f"Invalid key {credential.resolve()} (the other is {OTHER})"))
        raise raised[-1]

    with pytest.raises(TurnFailed) as caught:
        run(policy, call, health=HealthStore(), clock=VirtualClock())
    assert caught.value.last_error is raised[-1]
    assert len(raised) == 2  # both keys tried
    for text in (
        str(raised[-1]),
        repr(raised[-1]),
        str(caught.value),
        to_jsonl(caught.value.trace),
    ):
        assert _leaks(text) == []
