"""`fsm.policy.tomlpos.toml_line`: the line of a key path in TOML text, for error messages."""

from __future__ import annotations

import tomllib

import pytest
from fallgate.fsm.policy.tomlpos import split_path, toml_line

POLICY = """\
max_attempts = 3

[primary]
provider = "zai"
model = "glm-5.1"
key_env = "ZAI_API_KEY"

[[fallback_providers]]
provider = "a"
model = "b"

[[fallback_providers]]
provider = "c"
model = "d"
context_length = 0

[rules.rate_limited]
fall_back = true

[backoff]
initial = 0.5
"""

SCRIPT = """\
[default]
kind = "answer"
text = "ok"

[[models."glm-5.1"]]
kind = "timeout"

[[models."glm-5.1"]]
kind = "status"
status = 429
headers = { retry-after = "20" }

[[models.'glm-4.7']]
kind = "answer"
delay = "soon"

[[models.plain]]
kind = "drop"
"""

INLINE = """\
primary = { provider = "a", model = "b", credentials = [{ id = "k1" }, { id = "k2" }] }
fallback_providers = [
  { provider = "c", model = "d" },  # a comment, with ] and } in it
  # a comment line between elements
  { provider = "e", model = "f", context_length = 0 },
]
rules.overloaded.rotate = true
rules . "stream_interrupted" . fall_back = true
"""

NESTED = """\
[[fruits]]
name = "apple"

[fruits.physical]
color = "red"

[[fruits.varieties]]
name = "red delicious"

[[fruits]]
name = "banana"

[[fruits.varieties]]
name = "plantain"
"""

DECOYS = '''\
title = "a # not a comment, [[models.m]] or x = 1"
body = """
[[models.m]]
kind = "fake"
"""
literal = \'\'\'
[default]
\'\'\'
"quote\\"d" = 1
"a\\u0062" = 2
ends = """two quotes at the end"""""
[[models.m]]
kind = "real"
'''

SCALARS = """\
chunks = [
  "one ",  # the first
  "two \\" ]",
  [1, 2],
]
"""

TABLE_OF_STEPS = """\
[models]
"glm-5.1" = [
  { kind = "timeout" },
  { kind = "status", status = "x" },
]
"""


@pytest.mark.parametrize(
    ("text", "path", "line"),
    [
        # tables, arrays of tables with an index, top-level keys (the policy's cases)
        (POLICY, ("max_attempts",), 1),
        (POLICY, ("primary",), 3),
        (POLICY, ("primary", "model"), 5),
        (POLICY, ("fallback_providers",), 8),
        (POLICY, ("fallback_providers", 0, "model"), 10),
        (POLICY, ("fallback_providers", 1), 12),
        (POLICY, ("fallback_providers", 1, "context_length"), 15),
        (POLICY, ("rules", "rate_limited", "fall_back"), 18),
        (POLICY, ("rules",), 17),  # known only from a nested table's header
        (POLICY, ("backoff", "initial"), 21),
        # a missing key or index: the deepest prefix that is there
        (POLICY, ("primary", "credential"), 3),
        (POLICY, ("fallback_providers", 1, "base_url"), 12),
        (POLICY, ("fallback_providers", 7, "model"), 8),
        (POLICY, ("rules", "overloaded", "rotate"), 17),
        # the fault script's cases: quoted, single-quoted and bare model names
        (SCRIPT, ("default",), 1),
        (SCRIPT, ("default", "text"), 3),
        (SCRIPT, ("models", "glm-5.1", 0, "kind"), 6),
        (SCRIPT, ("models", "glm-5.1", 1), 8),
        (SCRIPT, ("models", "glm-5.1", 1, "status"), 10),
        (SCRIPT, ("models", "glm-5.1", 1, "headers", "retry-after"), 11),
        (SCRIPT, ("models", "glm-4.7", 0, "delay"), 15),
        (SCRIPT, ("models", "plain", 0, "kind"), 18),
        (SCRIPT, ("models", "plain", 0, "status"), 17),
        # inline tables, arrays over several lines, dotted keys
        (INLINE, ("primary", "model"), 1),
        (INLINE, ("primary", "credentials", 1, "id"), 1),
        (INLINE, ("fallback_providers", 0, "model"), 3),
        (INLINE, ("fallback_providers", 1), 5),
        (INLINE, ("fallback_providers", 1, "context_length"), 5),
        (INLINE, ("rules", "overloaded", "rotate"), 7),
        (INLINE, ("rules", "stream_interrupted", "fall_back"), 8),
        (SCALARS, ("chunks", 1), 3),
        (SCALARS, ("chunks", 2, 1), 4),
        (TABLE_OF_STEPS, ("models", "glm-5.1", 1, "status"), 4),
        # [fruits.physical] and [[fruits.varieties]] belong to the last [[fruits]]
        (NESTED, ("fruits", 0, "physical", "color"), 5),
        (NESTED, ("fruits", 0, "varieties", 0, "name"), 8),
        (NESTED, ("fruits", 1, "name"), 11),
        (NESTED, ("fruits", 1, "varieties", 0, "name"), 14),
        # what is inside strings and comments is not structure
        (DECOYS, ("models", "m", 0, "kind"), 13),
        (DECOYS, ("default",), None),
        (DECOYS, ('quote"d',), 9),
        (DECOYS, ("ab",), 10),
        (DECOYS, ("ends",), 11),
        # nothing to find
        (POLICY, (), None),
        (POLICY, ("nowhere", "at_all"), None),
        ("", ("a",), None),
    ],
)
def test_the_line_of_a_path(text: str, path: tuple[str | int, ...], line: int | None) -> None:
    tomllib.loads(text)  # every document here is valid TOML
    assert toml_line(text, path) == line


def test_windows_line_endings_count_the_same_lines() -> None:
    text = POLICY.replace("\n", "\r\n")
    assert toml_line(text, ("fallback_providers", 1, "context_length")) == 15
    assert toml_line(text, ("backoff", "initial")) == 21


@pytest.mark.parametrize(
    "text",
    ["a = 1\n[b\nc = 2\n", 'a = "unterminated\nb = 1\n', "[[x]]\ny = [1, 2\n", "= = =", "[\n"],
)
def test_text_that_is_not_toml_gives_what_was_found_before_it_and_never_raises(
    text: str,
) -> None:
    assert toml_line(text, ("a",)) == (1 if text.startswith("a = ") else None)
    assert toml_line(text, ("zzz",)) is None


def test_a_string_path_is_refused_rather_than_read_letter_by_letter() -> None:
    with pytest.raises(TypeError, match="split_path"):
        toml_line(POLICY, "primary")


@pytest.mark.parametrize(
    ("dotted", "parts"),
    [
        ("max_attempts", ("max_attempts",)),
        ("fallback_providers[1].context_length", ("fallback_providers", 1, "context_length")),
        ("primary.credentials[0]", ("primary", "credentials", 0)),
        ("rules.rate_limited.fall_back", ("rules", "rate_limited", "fall_back")),
        ("targets[0][2]", ("targets", 0, 2)),
        ("", ()),
    ],
)
def test_split_path(dotted: str, parts: tuple[str | int, ...]) -> None:
    assert split_path(dotted) == parts
    assert toml_line(POLICY, split_path("fallback_providers[1].context_length")) == 15
