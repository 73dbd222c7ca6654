"""A fallgate policy from a hermes agent's own configuration.

The primary is the agent's model, provider, base URL and key (its credential pool's
keys too); the fallbacks are ``fallback_model`` / ``fallback_providers`` in order,
resolved by hermes' own ``resolve_provider_client`` where an entry lacks a base URL or
key. hermes-agent is imported only inside functions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import openai

from ....fsm import Policy

__all__ = ["policy_data", "policy_from_agent", "primary_extras"]

log = logging.getLogger("fallgate.hermes")


def policy_from_agent(agent: Any, options: Mapping[str, Any] | None = None) -> Policy:
    """The chain `attach` builds from an agent's configuration (see the module
    docstring), with ``options`` (policy fields) laid over it."""
    chain = getattr(agent, "_fallgate", None)
    entries = chain.hermes_chain if chain is not None else list(agent._fallback_chain or [])
    data, _ = policy_data(agent, entries)
    data.update(options or {})
    return Policy.from_dict(data, source="the hermes agent's configuration")


# -- reading hermes' configuration ------------------------------------------------------


def primary_extras(agent: Any) -> dict[str | None, dict[str, Any]]:
    """hermes' client options for its primary's base URL (headers, query, TLS)."""
    kw = dict(getattr(agent, "_client_kwargs", None) or {})
    base_url = kw.pop("base_url", None)
    kw.pop("api_key", None)
    kw.pop("http_client", None)
    return {_str_or_none(base_url): kw}


def policy_data(
    agent: Any, entries: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str | None, dict[str, Any]]]:
    """(policy dict, per-base-URL client options) from the agent's configuration."""
    kw = getattr(agent, "_client_kwargs", None) or {}
    key = kw.get("api_key", getattr(agent, "api_key", None))
    if key is not None and not isinstance(key, str):
        raise ValueError(
            "the agent's key is not a string (an Entra ID token provider?): pass attach() a "
            "Policy of your own"
        )
    base_url = _str_or_none(kw.get("base_url") or getattr(agent, "base_url", None))
    keys = [key] if key else []
    for pooled in _pool_keys(agent, base_url):
        if pooled not in keys:
            keys.append(pooled)
    primary: dict[str, Any] = {
        "provider": (agent.provider or "custom"),
        "model": agent.model,
        "base_url": base_url,
        # a keyless local server still gets a bearer token (the SDK requires one)
        "api_keys": keys or ["no-key"],
    }
    extras = primary_extras(agent)
    fallbacks: list[dict[str, Any]] = []
    seen = {(primary["provider"], primary["model"]), (base_url, primary["model"])}
    for entry in entries:
        fb = _fallback_entry(entry)
        if fb is None:
            continue
        target, options = fb
        ids = ((target["provider"], target["model"]), (target.get("base_url"), target["model"]))
        if any(i in seen for i in ids):
            log.warning("fallback %s/%s repeats an earlier target: skipped", *ids[0])
            continue
        seen.update(ids)
        fallbacks.append(target)
        if options and target.get("base_url") not in extras:
            extras[target.get("base_url")] = options
    return {"primary": primary, "fallback_providers": fallbacks}, extras


def _fallback_entry(entry: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """One hermes fallback entry as a policy target (and its client options), or None
    when hermes could not reach it either."""
    provider = str(entry.get("provider") or "").strip().lower()
    model = str(entry.get("model") or "").strip()
    if not provider or not model:
        return None
    base_url = _str_or_none(entry.get("base_url"))
    api_key = _str_or_none(entry.get("api_key"))
    key_env = _str_or_none(entry.get("key_env") or entry.get("api_key_env"))
    options: dict[str, Any] = {}
    if base_url is None or (api_key is None and key_env is None):
        resolved = _resolve(provider, model, base_url, api_key)
        if resolved is None:
            log.warning("fallback %s/%s: hermes cannot resolve it: skipped", provider, model)
            return None
        base_url = base_url or _str_or_none(str(resolved.base_url))
        if api_key is None and key_env is None:
            api_key = _str_or_none(resolved.api_key)
        headers = getattr(resolved, "_custom_headers", None)
        if headers:
            options["default_headers"] = dict(headers)
        try:
            resolved.close()
        except Exception:  # pragma: no cover - best effort
            pass
    target: dict[str, Any] = {
        "provider": provider,
        "model": _normalized(model, provider),
        "base_url": base_url,
    }
    if key_env is not None and api_key is None:
        target["key_env"] = key_env
    else:
        target["api_key"] = api_key or "no-key"
    return target, options


def _resolve(provider: str, model: str, base_url: str | None, api_key: str | None) -> Any:
    """hermes' own provider router (its fallback uses the same)."""
    try:
        from agent.auxiliary_client import (  # type: ignore[import-not-found]
            resolve_provider_client,
        )
    except ImportError:  # pragma: no cover - attach() is only given hermes agents
        return None
    try:
        client, _ = resolve_provider_client(
            provider,
            model=model,
            raw_codex=True,
            explicit_base_url=base_url,
            explicit_api_key=api_key,
        )
    except Exception as e:
        log.warning("fallback %s/%s: hermes' resolver failed: %s", provider, model, e)
        return None
    return client if isinstance(client, openai.OpenAI) else None


def _normalized(model: str, provider: str) -> str:
    try:
        from hermes_cli.model_normalize import (  # type: ignore[import-not-found]
            normalize_model_for_provider,
        )
    except ImportError:  # pragma: no cover
        return model
    try:
        return str(normalize_model_for_provider(model, provider) or model)
    except Exception:
        return model


def _pool_keys(agent: Any, base_url: str | None) -> list[str]:
    """The keys of the agent's credential pool for its primary (fallgate rotates them)."""
    pool = getattr(agent, "_credential_pool", None)
    if pool is None:
        return []
    out = []
    try:
        for entry in pool.entries():
            entry_url = _str_or_none(getattr(entry, "runtime_base_url", None))
            if entry_url is not None and base_url is not None and entry_url != base_url:
                continue
            key = entry.runtime_api_key
            if isinstance(key, str) and key.strip():
                out.append(key.strip())
    except Exception as e:  # a pool of another shape: its keys stay hermes'
        log.warning("credential pool not read (%s): only the agent's current key is used", e)
        return []
    return out


def _str_or_none(v: Any) -> str | None:
    if v is None:
        return None
    s = str(v).strip()
    return s or None
