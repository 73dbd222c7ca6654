"""docs/policy.md's field tables name every policy field once, with its real default."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import attrs
from fallgate.fsm.policy.model import Backoff, Breaker, Cooldown, Policy, RetryBudget, Target

DOC = Path(__file__).resolve().parent.parent / "docs" / "policy.md"
NESTED = {"backoff": Backoff, "cooldown": Cooldown, "breaker": Breaker, "retry_budget": RetryBudget}
#: Filled in from elsewhere: the chain's entries, the rules and provider tables (own
#: sections), the index (the entry's place), the credentials (the key fields).
NOT_IN_TABLES = {"targets", "rules", "providers", "index", "credentials", "member", "entry"}


def rows() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    tables = text[: text.index("## Rules and providers")]  # the provider table comes later
    out = {}
    for m in re.finditer(r"^\| `([\w.]+)`(?:, `[\w.]+`)? \| ([^|]+) \|", tables, re.M):
        out[m.group(1)] = m.group(2).strip()
    return out


def fields() -> dict[str, attrs.Attribute]:
    out = {}
    for cls, prefix in ((Policy, ""), (Target, "")):
        for f in attrs.fields(cls):
            if f.init and f.name not in NOT_IN_TABLES and f.name not in NESTED:
                out[prefix + f.name] = f
    for name, cls in NESTED.items():
        for f in attrs.fields(cls):
            out[f"{name}.{f.name}"] = f
    return out


def test_every_field_has_a_row_and_every_row_a_field():
    # the credential keys and a group's members: entry keys, not fields
    documented = set(rows()) - {"key_env", "api_key", "members"}
    assert documented == set(fields())


def test_each_documented_default_is_the_attrs_default():
    table = rows()
    for name, f in fields().items():
        cell = table[name]
        if f.default is attrs.NOTHING:
            assert cell == "required", name
        elif f.default is None:
            assert cell == "—", name
        else:
            assert cell.startswith("`") and cell.endswith("`"), (name, cell)
            value = tomllib.loads(f"v = {cell.strip('`')}")["v"]
            assert value == f.default and type(value) is type(f.default), (name, cell)
