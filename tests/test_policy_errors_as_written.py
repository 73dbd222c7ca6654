"""A bad policy file is reported where the user wrote the mistake: the entry, the list
item and its line, never an internal index; and small things an editor or a paste
does to a file (a byte order mark, a doubled key) get a clear word, not a puzzle."""

from __future__ import annotations

import pytest
from fallgate.fsm import Policy, PolicyError
from fallgate.providers.cli import main as cli_main

from helpers import key

A, B = "https://a.test/v1", "https://b.test/v1"


def _problems(tmp_path, text: str) -> str:
    path = tmp_path / "p.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PolicyError) as e:
        Policy.from_toml(path)
    return str(e.value)


def test_a_bad_item_of_a_key_list_is_named_by_its_index_and_its_own_line(tmp_path):
    text = (
        '[primary]\nprovider = "fault"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'key_envs = [\n  "GOOD_KEY",\n  "1BAD",\n]\n'
    )
    says = _problems(tmp_path, text)
    assert "line 7: primary.key_envs[1] = ***" in says, says
    assert "must be an environment variable name" in says


def test_an_empty_literal_key_points_at_its_item_not_at_the_good_key_before_it(tmp_path):
    text = (
        f'[primary]\nprovider = "fault"\nmodel = "m"\napi_key = "{key(0)}"\n'
        f'base_url = "http://127.0.0.1:9/v1"\napi_keys = [\n  "{key(0, 1)}",\n  "",\n]\n'
    )
    says = _problems(tmp_path, text)
    assert "line 8: primary.api_keys[1] = *** (0 characters, not shown)" in says, says
    assert key(0) not in says and key(0, 1) not in says


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("key_envs", ["A_KEY", "A_KEY"], "the same variable as primary.key_envs[0]"),
        ("api_keys", [key(0), key(0)], "the same key as primary.api_keys[0]"),
    ],
    ids=["variable", "literal"],
)
def test_a_key_given_twice_is_refused_at_its_second_place(field, value, says):
    """A doubled key would count as two keys in `fallgate check` and rotate to itself."""
    with pytest.raises(PolicyError) as e:
        Policy.from_dict(
            {"primary": {"provider": "fault", "model": "m", "base_url": A, field: value}}
        )
    text = str(e.value)
    assert f"primary.{field}[1]" in text and says in text, text
    assert "credentials" not in text and key(0) not in text


def test_a_members_problem_names_the_member_as_written_with_its_line(tmp_path):
    text = (
        '[primary]\nprovider = "fault"\nmodel = "m"\nmembers = [\n'
        f'  {{ base_url = "{A}", api_key = "{key(0)}" }},\n'
        f'  {{ base_url = "{A}", api_key = "{key(1)}" }},\n]\n'
    )
    says = _problems(tmp_path, text)
    assert "line 6: primary.members[1].base_url" in says, says
    assert "targets[" not in says


@pytest.mark.parametrize(
    "written, says_at",
    [
        ('group = ""', "line 4: primary.group = ''"),
        ("context_length = 0", "line 4: primary.context_length = 0"),
        ('rotation = "random"', "line 4: primary.rotation = 'random'"),
        ('base_url = "ftp://x"', "line 4: primary.base_url = 'ftp://x'"),
    ],
)
def test_a_bad_field_of_a_group_entry_is_said_once_at_the_entry_not_per_member(
    tmp_path, written, says_at
):
    """The members take the entry's fields; a bad one is the entry's mistake: one problem,
    at the entry's field and line, not one per member at a field the member never wrote."""
    text = (
        f'[primary]\nprovider = "fault"\nmodel = "m"\n{written}\nmembers = [\n'
        f'  {{ api_key = "{key(0)}" }},\n'
        f'  {{ api_key = "{key(1)}" }},\n]\n'
    )
    says = _problems(tmp_path, text)
    assert says_at in says, says
    assert "(1 problem)" in says, says
    assert "members[" not in says, says


def test_a_group_named_after_a_bad_model_says_the_model_once_and_no_group(tmp_path):
    text = (
        '[primary]\nprovider = "fault"\nmodel = 5\nbase_url = "http://127.0.0.1:9/v1"\n'
        f'members = [\n  {{ api_key = "{key(0)}" }},\n  {{ api_key = "{key(1)}" }},\n]\n'
    )
    says = _problems(tmp_path, text)
    assert "line 3: primary.model = 5" in says and "(1 problem)" in says, says
    assert ".group" not in says, says


def test_a_members_own_bad_field_stays_the_members(tmp_path):
    text = (
        '[primary]\nprovider = "fault"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\n'
        f'members = [\n  {{ api_key = "{key(0)}" }},\n'
        f'  {{ api_key = "{key(1)}", rotation = "random" }},\n]\n'
    )
    says = _problems(tmp_path, text)
    assert "line 7: primary.members[1].rotation = 'random'" in says, says

def test_a_limit_in_a_message_is_shown_as_a_number_not_masked_as_a_secret():
    with pytest.raises(PolicyError) as e:
        Policy.from_dict(
            {"max_body_bytes": 10, "primary": {"provider": "fault", "model": "m", "base_url": A}}
        )
    assert "between 1024 and 1099511627776 (1 TiB)" in str(e.value), str(e.value)


def test_a_file_saved_with_a_byte_order_mark_loads_like_one_without(tmp_path):
    text = f'[primary]\nprovider = "fault"\nmodel = "m"\nbase_url = "{A}"\nkeyless = true\n'
    plain, marked = tmp_path / "plain.toml", tmp_path / "marked.toml"
    plain.write_text(text, encoding="utf-8")
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert Policy.from_toml(marked).targets == Policy.from_toml(plain).targets


def test_a_path_with_a_nul_character_is_a_policy_error():
    with pytest.raises(PolicyError, match="NUL"):
        Policy.from_toml("policy.toml\x00x")


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: "", "policy path is empty"),
        (lambda d: str(d / "loop"), "Too many levels of symbolic links"),
        (lambda d: str(d / "none.toml"), "policy file not found"),
    ],
    ids=["empty", "symlink-loop", "missing"],
)
def test_the_cli_says_why_a_policy_path_cannot_be_read(tmp_path, capsys, make, says):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert cli_main(["check", make(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


def test_check_warns_of_an_entry_identical_to_an_earlier_one(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text(
        f'[primary]\nprovider = "fault"\nmodel = "m"\nbase_url = "{A}"\nkeyless = true\n'
        f'[[fallback_providers]]\nprovider = "fault"\nmodel = "m"\nbase_url = "{B}"\n'
        "keyless = true\n"
    )
    cli_main(["check", str(path)])
    out = capsys.readouterr().out
    assert "warning: fallback_1 (fault · m) is identical to primary (same provider" in out, out


def test_a_field_named_like_a_key_is_masked_and_still_on_its_own_line(tmp_path):
    """The name is never shown, but the line is the one the user wrote it on."""
    named = "sk-proj-" + "Q" * 40
    text = (
        f'[primary]\nprovider = "fault"\nmodel = "m"\napi_key = "{key(0)}"\n'
        f'"{named}" = 1\nbase_url = "http://127.0.0.1:9/v1"\n'
    )
    says = _problems(tmp_path, text)
    assert "line 5: primary.***: unknown field" in says, says
    assert named not in says
