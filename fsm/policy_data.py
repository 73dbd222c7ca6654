"""A `Policy` from plain data: the TOML / JSON / dict shape users write.

Accepts ``primary`` + ``fallback_providers`` (the common shape) or ``targets``,
known-provider defaults, ``[providers.<name>]`` tables and per-kind ``rules``; the
field lists are derived from the attrs classes, so each field is named once. Every
problem is collected and raised as one `PolicyError` naming its path.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from . import registry
from .credentials import Credential
from .errors import PolicyError, Problem
from .outcomes import OutcomeKind
from .policy import (
    MAX_TARGETS,
    Backoff,
    Breaker,
    Cooldown,
    Policy,
    RetryBudget,
    chain_too_long,
)
from .policy_checks import (
    _MISSING,
    _Problems,
    _short_repr,
    env_name_ok,
    name_problem,
    url_problem,
)
from .registry import Provider
from .targets import Target, _known_list, resolve_target
from .traits import DEFAULT_RULES, FAULT_KINDS, Rule

__all__ = ["policy_from_dict"]


def _init_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in attrs.fields(cls) if f.init)


# Each field is named once, on its class; the dict shape is derived from them.
_CREDENTIAL_KEYS = ("key_env", "key_envs", "api_key", "api_keys")
_TARGET_KEYS = {*_init_fields(Target), *_CREDENTIAL_KEYS} - {"credentials", "index"}
_NESTED = ("targets", "backoff", "cooldown", "breaker", "retry_budget", "rules", "providers")
_SCALARS = tuple(f for f in _init_fields(Policy) if f not in _NESTED)
_POLICY_KEYS = {"primary", "fallback_providers", *_init_fields(Policy)}
_RULE_FIELDS = _init_fields(Rule)
_SECRET_KEYS = {"api_key", "api_keys"}
_PROVIDER_KEYS = ("base_url", "key_env", "key_envs", "keyless")


def _unknown(ps: _Problems, data: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    allowed = sorted(allowed)
    for k in data:
        if k not in allowed:
            near = difflib.get_close_matches(str(k), allowed, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(allowed)})"
            shown = k if isinstance(k, str) and k.isprintable() else repr(k)
            ps.add(f"{where}{shown}", _MISSING, f"unknown field{hint}")


def _providers_from_dict(raw: Any, ps: _Problems) -> dict[str, Provider]:
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
                _MISSING,
                "missing (required for a provider fallgate does not know; known: "
                f"{_known_list(None)})",
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
    data: Any, path: str, ps: _Problems, extra: Mapping[str, Provider] | None = None
) -> Target | None:
    if not isinstance(data, Mapping):
        ps.add(path, data, "must be a table with provider, model (base_url, key_env|api_key)")
        return None
    _unknown(ps, data, _TARGET_KEYS, f"{path}.")
    creds: list[Credential] = []
    envs = list(_as_list(data.get("key_env"))) + list(_as_list(data.get("key_envs")))
    keys = list(_as_list(data.get("api_key"))) + list(_as_list(data.get("api_keys")))
    for e in envs:
        if not env_name_ok(e):
            ps.add(f"{path}.key_env", e, "must be an environment variable name")
        else:
            creds.append(Credential.from_env(e))
    for n, k in enumerate(keys, start=1):
        if not isinstance(k, str) or not k.strip():
            ps.add(f"{path}.api_key", k, "must be a non-empty string", secret=True)
        else:
            creds.append(Credential.literal(k, n))
    missing = [k for k in ("provider", "model") if k not in data]
    for k in missing:
        ps.add(f"{path}.{k}", _MISSING, "missing (required)")
    try:
        target = Target(
            provider=data.get("provider", "?"),
            model=data.get("model", "?"),
            base_url=data.get("base_url"),
            context_length=data.get("context_length"),
            credentials=tuple(creds),
            rotation=data.get("rotation", "fill_first"),
            keyless=data.get("keyless", False),
        )
        if missing:
            return None
        n = len(ps.items)
        target = resolve_target(target, extra, ps, path, credentials_given=bool(envs or keys))
        return None if len(ps.items) > n else target
    except PolicyError as e:
        ps.extend(e, path)
        return None
    except (TypeError, ValueError) as e:  # pragma: no cover - defensive
        ps.add(path, _MISSING, str(e))
        return None


def _as_list(v: Any) -> Sequence[Any]:
    if v is None:
        return ()
    return list(v) if isinstance(v, list | tuple) else [v]


def _sub(
    ps: _Problems, data: Mapping[str, Any], key: str, cls: Callable[..., Any], fields: Sequence[str]
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


def policy_from_dict(data: Mapping[str, Any]) -> Policy:
    ps = _Problems()
    if not isinstance(data, Mapping):
        raise PolicyError([Problem("<policy>", _short_repr(data), "must be a table/dict")])
    _unknown(ps, data, _POLICY_KEYS, "")
    extra = _providers_from_dict(data.get("providers"), ps)
    targets: list[Target | None] = []
    n = _chain_length(data)
    if n > MAX_TARGETS:  # refused before any entry is looked at: one problem, not n
        where = "targets" if "targets" in data else "fallback_providers"
        ps.add(where, _MISSING, chain_too_long(n))
        ps.raise_if_any()
    if "targets" in data:
        if "primary" in data:
            ps.add("targets", _MISSING, "give either targets or primary, not both")
        raw = data["targets"]
        if not isinstance(raw, list):
            ps.add("targets", raw, "must be a list of tables")
        else:
            targets += [_target_from_dict(t, f"targets[{i}]", ps, extra) for i, t in enumerate(raw)]
    elif "primary" in data:
        targets.append(_target_from_dict(data["primary"], "primary", ps, extra))
    else:
        ps.add("primary", _MISSING, "missing (required): the primary target")
    fb = data.get("fallback_providers", [])
    if not isinstance(fb, list):
        ps.add("fallback_providers", fb, "must be a list of tables")
    else:
        targets += [
            _target_from_dict(t, f"fallback_providers[{i}]", ps, extra) for i, t in enumerate(fb)
        ]
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
                ps.add(f"rules.{shown}", _MISSING, f"unknown outcome class (choose from {choices})")
                continue
            if not isinstance(spec, Mapping):
                ps.add(f"rules.{kind}", spec, f"must be a table of {'/'.join(_RULE_FIELDS)}")
                continue
            _unknown(ps, spec, _RULE_FIELDS, f"rules.{kind}.")
            base = DEFAULT_RULES[k]
            rules[k] = Rule(**{f: spec.get(f, getattr(base, f)) for f in _RULE_FIELDS})
    scalars = {k: data[k] for k in _SCALARS if k in data}
    good_targets = [t for t in targets if t is not None]
    if ps.items or len(good_targets) != len(targets):
        # Validate the scalars too so that one error lists everything.
        try:
            Policy(
                targets=good_targets or [_PLACEHOLDER_TARGET],
                backoff=backoff,
                cooldown=cooldown,
                breaker=breaker,
                retry_budget=retry_budget,
                rules=rules,
                providers=extra,
                **scalars,
            )
        except PolicyError as e:
            ps.items += [p for p in e.problems if not p.path.startswith("targets")]
        ps.raise_if_any()
    try:
        return Policy(
            targets=good_targets,
            backoff=backoff,
            cooldown=cooldown,
            breaker=breaker,
            retry_budget=retry_budget,
            rules=rules,
            providers=extra,
            **scalars,
        )
    except PolicyError as e:
        ps.items += list(e.problems)
        ps.raise_if_any()
        raise  # pragma: no cover
