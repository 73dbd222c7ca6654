"""A `Policy` from plain data: the TOML / JSON / dict shape users write.

Accepts ``primary`` + ``fallback_providers`` (the common shape) or ``targets``,
known-provider defaults, ``[providers.<name>]`` tables and per-kind ``rules``; the
field lists are derived from the attrs classes, so each field is named once. Every
problem is collected and raised as one `PolicyError` naming its path.
"""

from __future__ import annotations

import contextvars
import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from ..catalogue import registry
from ..catalogue.registry import Provider
from ..errors import PolicyError, Problem
from ..kinds import DEFAULT_RULES, FAULT_KINDS, OutcomeKind, Rule
from ..redact import redact
from .checks import (
    KNOWN_SECRETS,
    MISSING,
    Problems,
    env_name_ok,
    key_text_problem,
    name_problem,
    redact_path,
    short_repr,
    url_problem,
)
from .credentials import Credential
from .knobs import MAX_TARGETS, Backoff, Breaker, Cooldown, RetryBudget, chain_too_long
from .targets import Target, known_list, resolve_target

if TYPE_CHECKING:
    from .model import Policy

P = TypeVar("P", bound="Policy")

__all__ = ["policy_from_dict"]


def _init_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in attrs.fields(cls) if f.init)


# Each field is named once, on its class; the dict shape is derived from them.
_CREDENTIAL_KEYS = ("key_env", "key_envs", "api_key", "api_keys")
#: A target entry's own fields, as written (credentials come from the key fields, the index
#: from the entry's place in the chain).
_TARGET_FIELDS = tuple(
    f for f in _init_fields(Target) if f not in ("credentials", "index", "member", "entry")
)
_TARGET_KEYS = {*_TARGET_FIELDS, *_CREDENTIAL_KEYS}
#: An entry that is a deployment group: its fields are every member's defaults.
_GROUP_KEYS = {*_TARGET_KEYS, "members"}
#: The most members one group may list (the chain's own limit applies too).
MAX_MEMBERS = 16
#: Stand-ins for the required fields (no default) while the others are validated (a missing
#: one is already reported).
_TARGET_STANDINS = {
    f.name: "?" for f in attrs.fields(Target) if f.init and f.default is attrs.NOTHING
}
_NESTED = ("targets", "backoff", "cooldown", "breaker", "retry_budget", "rules", "providers")
_RULE_FIELDS = _init_fields(Rule)
_SECRET_KEYS = {"api_key", "api_keys"}
_PROVIDER_KEYS = ("base_url", "key_env", "key_envs", "keyless")


#: The top-level fields of the policy class being loaded (`policy_from_dict` sets it: the
#: class is handed in), for the hint on a top-level field written inside a table.
_TOP_FIELDS: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "fallgate_policy_fields", default=frozenset()
)


def _unknown(ps: Problems, data: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    allowed = sorted(allowed)
    for k in data:
        if k not in allowed:
            near = difflib.get_close_matches(str(k), allowed, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(allowed)})"
            if where and k in _TOP_FIELDS.get():
                # TOML: a key after a [table] header belongs to that table
                hint = (
                    f" ({k} is a policy field, not one of {where.rstrip('.')}'s: in TOML a "
                    "key written after a [table] header belongs to that table; move it above "
                    "the first table)"
                )
            shown = k if isinstance(k, str) and k.isprintable() else repr(k)
            ps.add(f"{where}{shown}", MISSING, f"unknown field{hint}")


def _providers_from_dict(raw: Any, ps: Problems) -> dict[str, Provider]:
    """The ``[providers.<name>]`` tables: new providers, or fields of known ones replaced."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        ps.add("providers", raw, "must be a table of [providers.<name>] tables")
        return {}
    out: dict[str, Provider] = {}
    for name, spec in raw.items():
        path = f"providers.{name}"
        bad_name = name_problem(name)
        if bad_name:
            ps.add("providers", name, f"provider name {bad_name}")
            continue
        if not isinstance(spec, Mapping):
            ps.add(path, spec, f"must be a table of {', '.join(_PROVIDER_KEYS)}")
            continue
        n = len(ps.items)
        _unknown(ps, spec, _PROVIDER_KEYS, f"{path}.")
        base_url = spec.get("base_url")
        bad_url = url_problem(base_url) if base_url is not None else None
        if bad_url:
            ps.add(f"{path}.base_url", base_url, bad_url)
        elif base_url is None and name not in registry.PROVIDERS:
            ps.add(
                f"{path}.base_url",
                MISSING,
                "missing (required for a provider fallgate does not know; known: "
                f"{known_list(None)})",
            )
        given_envs = "key_env" in spec or "key_envs" in spec
        envs = list(_as_list(spec.get("key_env"))) + list(_as_list(spec.get("key_envs")))
        for e in envs:
            if not env_name_ok(e):
                ps.add(f"{path}.key_env", e, "must be an environment variable name")
        keyless = spec.get("keyless")
        if keyless is not None and not isinstance(keyless, bool):
            ps.add(f"{path}.keyless", keyless, "must be true or false")
        elif keyless and envs:
            ps.add(f"{path}.keyless", True, "a keyless provider takes no key_env")
        if len(ps.items) > n:
            continue
        out[str(name)] = registry.merge(
            str(name),
            base_url=base_url,
            key_envs=envs if given_envs else (() if keyless else None),
            keyless=keyless,
        )
    return out


def _target_from_dict(
    data: Any, path: str, ps: Problems, extra: Mapping[str, Provider] | None = None
) -> Target | None:
    if not isinstance(data, Mapping):
        ps.add(path, data, "must be a table with provider, model (base_url, key_env|api_key)")
        return None
    _unknown(ps, data, _TARGET_KEYS, f"{path}.")
    creds: list[Credential] = []
    envs = _items(data, path, "key_env", "key_envs")
    keys = _items(data, path, "api_key", "api_keys")
    named: dict[str, str] = {}  # variable name or key -> where it was first given
    for where, e in envs:
        if not env_name_ok(e):
            ps.add(where, e, "must be an environment variable name")
        elif e in named:
            ps.add(where, e, f"the same variable as {named[e]}: give each key once")
        else:
            named[e] = where
            creds.append(Credential.from_env(e))
    for n, (where, k) in enumerate(keys, start=1):
        if not isinstance(k, str) or not k.strip():
            ps.add(where, k, "must be a non-empty string", secret=True)
        elif (why := key_text_problem(k)) is not None:
            ps.add(where, k, why, secret=True)
        elif k in named:
            ps.add(where, k, f"the same key as {named[k]}: give each key once", secret=True)
        else:
            named[k] = where
            creds.append(Credential.literal(k, n))
    missing = [k for k in _TARGET_STANDINS if k not in data]
    for k in missing:
        ps.add(f"{path}.{k}", MISSING, "missing (required)")
    try:
        given = {k: data[k] for k in _TARGET_FIELDS if k in data}
        target = Target(**{**_TARGET_STANDINS, **given}, credentials=tuple(creds))
        if missing:
            return None
        n = len(ps.items)
        target = resolve_target(target, extra, ps, path, credentials_given=bool(envs or keys))
        return None if len(ps.items) > n else target
    except PolicyError as e:
        ps.extend(e, path)
        return None
    except (TypeError, ValueError) as e:  # pragma: no cover - defensive
        ps.add(path, MISSING, str(e))
        return None


def _entry_from_dict(
    data: Any,
    path: str,
    ps: Problems,
    extra: Mapping[str, Provider] | None = None,
    inherited: dict[str, tuple[str, frozenset[str]]] | None = None,
) -> list[tuple[Target | None, str]]:
    """One chain entry: a target, or with ``members = [...]`` a deployment group (one
    target per member, each member's fields over the entry's; `fsm.policy.groups`); each
    with the path the user wrote it at (``primary``, ``fallback_providers[0].members[1]``).
    `inherited` learns, per member path, the entry's path and the fields the member took
    from it (a problem with one of those is the entry's: `_relocated`)."""
    if not isinstance(data, Mapping) or "members" not in data:
        return [(_target_from_dict(data, path, ps, extra), path)]
    _unknown(ps, data, _GROUP_KEYS, f"{path}.")
    raw = data["members"]
    if not isinstance(raw, list) or not raw or len(raw) > MAX_MEMBERS:
        ps.add(
            f"{path}.members",
            short_repr(raw),
            f"must be a list of 1 to {MAX_MEMBERS} tables (base_url, key_env, weight, ...)",
        )
        return [(None, path)]
    if "weight" in data:
        ps.add(f"{path}.weight", data["weight"], "a weight is given per member")
    shared = {k: v for k, v in data.items() if k in _TARGET_KEYS and k != "weight"}
    label = shared.pop("group", None)
    if label is None:  # named after its model (a bad model is its own problem, once)
        model = data.get("model")
        label = model if isinstance(model, str) and model.strip() else None
    out: list[tuple[Target | None, str]] = []
    for j, member in enumerate(raw):
        where = f"{path}.members[{j}]"
        if not isinstance(member, Mapping):
            ps.add(where, member, "must be a table with base_url, key_env|api_key (weight)")
            out.append((None, where))
            continue
        if "group" in member or "members" in member:
            bad = "group" if "group" in member else "members"
            ps.add(f"{where}.{bad}", MISSING, "a member belongs to its entry's group")
            out.append((None, where))
            continue
        own_keys = any(k in member for k in (*_CREDENTIAL_KEYS, "keyless"))
        base = {k: v for k, v in shared.items() if not (own_keys and k in _CREDENTIAL_KEYS)}
        origin = (path, frozenset({k for k in base if k not in member} | {"group"}))
        if inherited is not None:
            inherited[where] = origin
        n = len(ps.items)
        target = _target_from_dict({**base, **member, "group": label}, where, ps, extra)
        ps.items[n:] = [_relocated(p, {where: origin}) for p in ps.items[n:]]
        out.append((target, where))
    return out


_MEMBER_FIELD = re.compile(r"(.*\.members\[\d+\])\.([A-Za-z_][A-Za-z0-9_]*)(.*)", re.DOTALL)


def _relocated(p: Problem, inherited: Mapping[str, tuple[str, frozenset[str]]]) -> Problem:
    """A problem with a field a group's member took from its entry, at the path (so the
    line) the user wrote it at: ``primary.rotation``, not ``primary.members[1].rotation``."""
    m = _MEMBER_FIELD.fullmatch(p.path)
    origin = inherited.get(m[1]) if m is not None else None
    if m is None or origin is None or m[2] not in origin[1]:
        return p
    return attrs.evolve(p, path=f"{origin[0]}.{m[2]}{m[3]}")


def _once(problems: Sequence[Problem]) -> list[Problem]:
    """Each problem once (an entry's bad field is found on every member that took it)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        if (p.path, p.message) not in seen:
            seen.add((p.path, p.message))
            out.append(p)
    return out


def _group_label(data: Any) -> tuple[str | None, str]:
    """The group an entry as written is (None: not a group), and the field that says so:
    ``group``, or for an entry with ``members`` and no ``group``, its ``model``."""
    if not isinstance(data, Mapping):
        return None, ""
    label = data.get("group")
    if label is None and "members" in data:
        return (data.get("model"), "members") if isinstance(data.get("model"), str) else (None, "")
    return (label, "group") if isinstance(label, str) else (None, "")


def _claim_groups(entries: Sequence[tuple[str, Any]], ps: Problems) -> None:
    """A group is one entry of the chain: two entries with one group name are refused
    (next to each other they would silently become one group of both entries' members)."""
    owner: dict[str, str] = {}
    for path, data in entries:
        label, field = _group_label(data)
        if label is None:
            continue
        if label in owner:
            named = "" if field == "group" else " (an entry with members is named after its model)"
            ps.add(
                f"{path}.{field}",
                label,
                f"group {label!r} is already {owner[label]}'s{named}: a group is one entry of "
                f"the chain; list all its deployments in {owner[label]}.members, or give this "
                "entry another group name",
            )
        else:
            owner[label] = path


_TARGET_PATH = re.compile(r"targets\[(\d+)\](.*)", re.DOTALL)


def _as_written(p: Problem, paths: Sequence[str]) -> Problem:
    """A problem the policy found on ``targets[i]`` (every member counted), at the path
    the user wrote that target at."""
    m = _TARGET_PATH.fullmatch(p.path)
    if m is None or int(m[1]) >= len(paths):
        return p
    return attrs.evolve(p, path=f"{paths[int(m[1])]}{m[2]}")


def _items(data: Mapping[str, Any], path: str, one: str, many: str) -> list[tuple[str, Any]]:
    """The values of a field given as one value (`one`) or a list (`many`, or `one` given
    a list), each with its own path: ``primary.key_envs[1]``."""
    out: list[tuple[str, Any]] = []
    for field in (one, many):
        v = data.get(field)
        if isinstance(v, list | tuple):
            out += [(f"{path}.{field}[{i}]", x) for i, x in enumerate(v)]
        elif v is not None:
            out.append((f"{path}.{field}", v))
    return out


def _as_list(v: Any) -> Sequence[Any]:
    if v is None:
        return ()
    return list(v) if isinstance(v, list | tuple) else [v]


def _sub(
    ps: Problems, data: Mapping[str, Any], key: str, cls: Callable[..., Any], fields: Sequence[str]
) -> Any:
    raw = data.get(key)
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        ps.add(key, raw, "must be a table")
        return cls()
    _unknown(ps, raw, fields, f"{key}.")
    try:
        return cls(**{k: raw[k] for k in fields if k in raw})
    except PolicyError as e:
        ps.extend(e, key)
        return cls()


#: Stands in for the chain while the other fields are validated (see policy_from_dict).
_PLACEHOLDER_TARGET = Target("placeholder", "placeholder", "http://placeholder", keyless=True)


def _chain_length(data: Mapping[str, Any]) -> int:
    """How many targets the data lists (lists that are not lists count as none)."""
    n = 0
    for key in ("targets", "fallback_providers"):
        if isinstance(data.get(key), list):
            n += len(data[key])
    return n + ("primary" in data and "targets" not in data)


def _policy_keys(data: Any) -> tuple[str, ...]:
    """Every literal key the data holds (``api_key``/``api_keys`` of each entry), longest
    first, each also without its blanks: what no problem may show, wherever it was typed."""
    if not isinstance(data, Mapping):
        return ()
    entries: list[Any] = [data.get("primary")]
    for where in ("targets", "fallback_providers"):
        if isinstance(data.get(where), list):
            entries += data[where]
    found: set[str] = set()
    for entry in list(entries):
        if isinstance(entry, Mapping) and isinstance(entry.get("members"), list):
            entries += entry["members"]
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        for k in [*_as_list(entry.get("api_key")), *_as_list(entry.get("api_keys"))]:
            if isinstance(k, str) and len(k.strip()) >= 4:
                found |= {k, k.strip()}
    return tuple(sorted(found, key=len, reverse=True))


def policy_from_dict(policy: type[P], data: Mapping[str, Any]) -> P:
    """A `policy` (the class `fsm.policy.model.Policy`, handed in: it imports this module)
    from plain data, or one `PolicyError` naming every bad field, with every key the data
    holds masked in it (a key typed into ``rotation`` or as a field's name included)."""
    secrets = _policy_keys(data)
    token = KNOWN_SECRETS.set(secrets)
    top = _TOP_FIELDS.set(frozenset({"primary", "fallback_providers", *_init_fields(policy)}))
    try:
        return _policy_from_dict(policy, data)
    except PolicyError as e:
        if not secrets:
            raise
        clean = [
            attrs.evolve(
                p,
                path=redact_path(p.path, secrets),
                value=redact(p.value, secrets),
                message=redact(p.message, secrets),
            )
            for p in e.problems
        ]
        raise PolicyError(clean, e.source) from None
    finally:
        KNOWN_SECRETS.reset(token)
        _TOP_FIELDS.reset(top)


def _policy_from_dict(policy: type[P], data: Mapping[str, Any]) -> P:
    ps = Problems()
    fields_of_policy = _init_fields(policy)
    if not isinstance(data, Mapping):
        raise PolicyError([Problem("<policy>", short_repr(data), "must be a table/dict")])
    _unknown(ps, data, {"primary", "fallback_providers", *fields_of_policy}, "")
    extra = _providers_from_dict(data.get("providers"), ps)
    targets: list[tuple[Target | None, str]] = []
    entries: list[tuple[str, Any]] = []  # (path, data) of each chain entry as written
    n = _chain_length(data)
    if n > MAX_TARGETS:  # refused before any entry is looked at: one problem, not n
        where = "targets" if "targets" in data else "fallback_providers"
        ps.add(where, MISSING, chain_too_long(n))
        ps.raise_if_any()
    if "targets" in data:
        if "primary" in data:
            ps.add("targets", MISSING, "give either targets or primary, not both")
        raw = data["targets"]
        if not isinstance(raw, list):
            ps.add("targets", raw, "must be a list of tables")
        else:
            entries += [(f"targets[{i}]", t) for i, t in enumerate(raw)]
    elif "primary" in data:
        entries.append(("primary", data["primary"]))
    else:
        ps.add("primary", MISSING, "missing (required): the primary target")
    fb = data.get("fallback_providers", [])
    if not isinstance(fb, list):
        ps.add("fallback_providers", fb, "must be a list of tables")
    else:
        entries += [(f"fallback_providers[{i}]", t) for i, t in enumerate(fb)]
    inherited: dict[str, tuple[str, frozenset[str]]] = {}
    for path, entry in entries:
        targets += _entry_from_dict(entry, path, ps, extra, inherited)
    _claim_groups(entries, ps)
    backoff = _sub(ps, data, "backoff", Backoff, _init_fields(Backoff))
    cooldown = _sub(ps, data, "cooldown", Cooldown, _init_fields(Cooldown))
    breaker = _sub(ps, data, "breaker", Breaker, _init_fields(Breaker))
    retry_budget = _sub(ps, data, "retry_budget", RetryBudget, _init_fields(RetryBudget))
    rules: dict[Any, Rule] = {}
    raw_rules = data.get("rules", {})
    if not isinstance(raw_rules, Mapping):
        ps.add("rules", raw_rules, "must be a table of outcome classes")
    else:
        for kind, spec in raw_rules.items():
            try:
                k = OutcomeKind(kind)
            except ValueError:
                k = None
            if k is None or k not in DEFAULT_RULES:
                choices = ", ".join(x.value for x in FAULT_KINDS)
                shown = kind if isinstance(kind, str) and kind.isprintable() else repr(kind)
                ps.add(f"rules.{shown}", MISSING, f"unknown outcome class (choose from {choices})")
                continue
            if not isinstance(spec, Mapping):
                ps.add(f"rules.{kind}", spec, f"must be a table of {'/'.join(_RULE_FIELDS)}")
                continue
            _unknown(ps, spec, _RULE_FIELDS, f"rules.{kind}.")
            base = DEFAULT_RULES[k]
            rules[k] = Rule(**{f: spec.get(f, getattr(base, f)) for f in _RULE_FIELDS})
    scalars = {k: data[k] for k in fields_of_policy if k not in _NESTED and k in data}
    good_targets = [t for t, _ in targets if t is not None]
    written = [path for t, path in targets if t is not None]
    fields: dict[str, Any] = {
        "backoff": backoff,
        "cooldown": cooldown,
        "breaker": breaker,
        "retry_budget": retry_budget,
        "rules": rules,
        "providers": extra,
        **scalars,
    }
    if ps.items or len(good_targets) != len(targets):
        # Validate the scalars too so that one error lists everything.
        try:
            policy(targets=good_targets or [_PLACEHOLDER_TARGET], **fields)
        except PolicyError as e:
            ps.items += [p for p in e.problems if not p.path.startswith("targets")]
        ps.items = _once(ps.items)
        ps.raise_if_any()
    try:
        return policy(targets=good_targets, **fields)
    except PolicyError as e:
        ps.items = _once([_relocated(_as_written(p, written), inherited) for p in e.problems])
        ps.raise_if_any()
        raise  # pragma: no cover
