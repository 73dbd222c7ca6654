"""The policy: validated at construction; one clear error naming every bad field."""

from __future__ import annotations

import attrs
import pytest
from fallgate.fsm import Policy, PolicyError, Target
from fallgate.fsm.kinds import OutcomeKind
from fallgate.fsm.policy.model import Backoff, Credential
from hypothesis import given, settings
from hypothesis import strategies as st

GOOD = {
    "primary": {
        "provider": "zai",
        "model": "glm-5.1",
        "base_url": "https://api.z.ai/v1",
        "key_env": "ZAI_API_KEY",
    },
    "fallback_providers": [
        {
            "provider": "openrouter",
            "model": "glm-4.7",
            "api_key": "sk-live-abcdef123456",
            "context_length": 128000,
        },
    ],
    "max_attempts": 2,
}


def test_the_common_fallback_providers_shape_loads_into_a_chain():
    p = Policy.from_dict(GOOD)
    assert [t.name for t in p.targets] == ["primary", "fallback_1"]
    assert p.targets[1].context_length == 128000
    assert p.targets[0].credentials[0].id == "env:ZAI_API_KEY"
    assert p.max_attempts == 2


def test_one_error_names_every_bad_field_and_value():
    bad = {
        "primary": {"provider": "zai", "model": ""},
        "fallback_providers": [{"model": "x", "context_length": -4, "key_env": "1BAD"}],
        "max_attemps": 3,
        "deadline": -1,
        "backoff": {"initial": "soon"},
        "rules": {"quota": {"retry": True}, "weird": {}},
    }
    with pytest.raises(PolicyError) as info:
        Policy.from_dict(bad)
    text = str(info.value)
    for fragment in [
        "primary.model = ''",
        "fallback_providers[0].provider: missing",
        "fallback_providers[0].context_length = -4",
        "fallback_providers[0].key_env = *** (4 characters, not shown)",  # never echoed
        "max_attemps: unknown field (did you mean 'max_attempts'?)",
        "deadline = -1",
        "backoff.initial = 'soon'",
        "rules.quota.retry",
        "rules.weird: unknown outcome class",
    ]:
        assert fragment in text, fragment
    assert len(info.value.problems) == 9


@pytest.mark.parametrize("name", ["A\n", "OPENAI_API_KEY\n", "\nA"])
def test_a_key_env_with_a_newline_is_refused_as_key_env_not_as_an_id(name):
    """A trailing newline passed the name check ("$" matches before it) and then failed
    as the derived credential id, at a path without the target's name."""
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"primary": {"provider": "openai", "model": "m", "key_env": name}})
    assert [pr.path for pr in info.value.problems] == ["primary.key_env"]


def test_a_short_key_inside_a_field_name_leaves_the_path_readable():
    """A 4-character api_key ("prov") is masked wherever it is typed, but not inside the
    name of a field ("fallback_providers[0].model" read as "***[0].model")."""
    with pytest.raises(PolicyError) as info:
        Policy.from_dict(
            {
                "primary": {"provider": "openai", "model": ""},
                "fallback_providers": [{"provider": "openai", "model": "", "api_key": "prov"}],
            }
        )
    paths = [pr.path for pr in info.value.problems]
    assert paths == ["primary.model", "fallback_providers[0].model"]


def test_a_key_typed_as_a_field_name_is_masked_in_the_path():
    key = "sk-live-typed-as-a-name-0123456789"
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"primary": {"provider": "openai", "model": "m", "api_key": key, key: 1}})
    assert key not in str(info.value)
    assert any(pr.path == "primary.***" for pr in info.value.problems), [
        pr.path for pr in info.value.problems
    ]


def test_a_secret_in_a_bad_field_is_never_shown():
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"primary": {"provider": "p", "model": "m", "api_key": "   "}})
    assert "***" in str(info.value)
    p = Policy.from_dict(GOOD)
    assert "sk-live-abcdef123456" not in repr(p)
    assert "sk-live-abcdef123456" not in str(p.targets[1].credentials)


def test_direct_construction_is_validated_too():
    with pytest.raises(PolicyError, match="max_attempts = 0: must be an integer"):
        Policy(targets=[Target("p", "m")], max_attempts=0)
    with pytest.raises(PolicyError, match="cap = 1: must be >= initial"):
        Backoff(initial=2, cap=1)
    with pytest.raises(PolicyError, match="targets"):
        Policy(targets=[])


def test_a_toml_policy_error_names_the_file_and_line(tmp_path):
    f = tmp_path / "policy.toml"
    f.write_text(
        "max_attempts = 3\n"
        "\n"
        "[primary]\n"
        'provider = "zai"\n'
        'model = "glm-5.1"\n'
        'key_env = "ZAI_API_KEY"\n'
        "\n"
        "[[fallback_providers]]\n"
        'provider = "a"\n'
        'model = "b"\n'
        "\n"
        "[[fallback_providers]]\n"
        'provider = "c"\n'
        'model = "d"\n'
        "context_length = 0\n"
    )
    with pytest.raises(PolicyError) as info:
        Policy.from_toml(f)
    assert str(f) in str(info.value)
    assert "line 15: fallback_providers[1].context_length = 0" in str(info.value)


def test_a_toml_file_that_is_not_toml_or_missing_is_one_clear_error(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text("primary = {\n")
    with pytest.raises(PolicyError, match="not valid TOML"):
        Policy.from_toml(f)
    with pytest.raises(PolicyError, match="cannot read policy file"):
        Policy.from_toml(tmp_path / "absent.toml")


def test_missing_env_credentials_name_the_variable_at_use_time(monkeypatch):
    c = Credential.from_env("FALLGATE_TEST_KEY")
    monkeypatch.delenv("FALLGATE_TEST_KEY", raising=False)
    with pytest.raises(LookupError, match=r"'FALLGATE_TEST_KEY'.*'primary'"):
        c.resolve("primary")
    monkeypatch.setenv("FALLGATE_TEST_KEY", "sk-from-env")
    assert c.resolve("primary") == "sk-from-env"


def test_rules_keep_their_safety_properties():
    with pytest.raises(PolicyError, match=r"rules\.overloaded\.rotate"):
        Policy.from_dict({**GOOD, "rules": {"overloaded": {"rotate": True}}})
    with pytest.raises(PolicyError, match=r"rules\.stream_interrupted\.fall_back"):
        Policy.from_dict({**GOOD, "rules": {"stream_interrupted": {"fall_back": True}}})
    p = Policy.from_dict(
        {**GOOD, "continue_streams": True, "rules": {"stream_interrupted": {"retry": True}}}
    )
    assert p.rule(OutcomeKind.STREAM_INTERRUPTED).retry


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)
fields = st.sampled_from(
    [
        "primary",
        "fallback_providers",
        "targets",
        "max_attempts",
        "deadline",
        "backoff",
        "cooldown",
        "rules",
        "retry_after_cap",
        "transport_faults_before_recovery",
        "bogus",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(fields, json_values, max_size=6) | json_values)
def test_garbage_in_gives_a_policy_or_a_policy_error_never_a_crash(data):
    """Property: any JSON-shaped input either builds a Policy or raises PolicyError whose
    problems each name a field path and a message."""
    try:
        Policy.from_dict(data)
    except PolicyError as e:
        assert e.problems
        assert all(p.path and p.message for p in e.problems)


target_dicts = st.fixed_dictionaries(
    {"provider": st.sampled_from(["openai", "zai", ""]), "model": st.text(max_size=6)},
    optional={
        "context_length": st.integers(-5, 10**6) | st.none(),
        "api_key": st.text(max_size=10),
        "key_env": st.text(max_size=10),
        "base_url": st.sampled_from(["http://x", "ftp://y", "https://api.z.ai/v1"]),
    },
)


@settings(max_examples=300, deadline=None)
@given(
    primary=target_dicts, fallbacks=st.lists(target_dicts, max_size=4), attempts=st.integers(-2, 5)
)
def test_plausible_but_wrong_chains_are_rejected_with_named_fields(primary, fallbacks, attempts):
    """Property: every problem of a near-valid chain is reported with its path."""
    try:
        p = Policy.from_dict(
            {"primary": primary, "fallback_providers": fallbacks, "max_attempts": attempts}
        )
    except PolicyError as e:
        paths = " ".join(pr.path for pr in e.problems)
        assert all(
            pr.path.split(".")[0].split("[")[0] in {"primary", "fallback_providers", "max_attempts"}
            for pr in e.problems
        ), paths
    else:
        assert len(p.targets) == 1 + len(fallbacks) and p.max_attempts == attempts >= 1


def test_pretty_printers_never_show_a_key():
    """Hypothesis and IPython print attrs objects field by field; a Secret stays ***."""
    from hypothesis.vendor.pretty import pretty

    p = Policy.from_dict(GOOD)
    assert "sk-live-abcdef123456" not in pretty(p)
    assert "***" in pretty(p.targets[1].credentials[0])


def test_a_cooldown_cap_below_its_initial_value_is_refused():
    from fallgate.fsm.policy.model import Cooldown

    with pytest.raises(PolicyError, match=r"cap = 1: must be >= initial \(5\)"):
        Cooldown(initial=5, cap=1)


def test_every_target_field_is_read_from_the_entry():
    """The entry's keys are the `Target` fields (derived, not restated): each one given
    reaches the target, and none is left out of the accepted keys."""
    entry = {
        "provider": "corp",
        "model": "m-1",
        "base_url": "http://127.0.0.1:9/v1",
        "context_length": 4096,
        "rotation": "round_robin",
        "keyless": True,
        "group": "g",
        "weight": 2.0,
        "assistant_prefix": True,
    }
    placed = {"credentials", "index", "member", "entry"}  # by the entry's place in the chain
    names = {f.name for f in attrs.fields(Target) if f.init} - placed
    assert set(entry) == names, "a Target field this test does not give"
    target = Policy.from_dict({"primary": entry}).targets[0]
    for name, value in entry.items():
        assert getattr(target, name) == value, name
