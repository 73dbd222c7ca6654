"""One entry of the chain (`Target`) and how its endpoint and keys are made explicit.

`resolve_target` fills in what an entry leaves out from the provider registry
(`fsm.registry`, plus a policy's own ``[providers.<name>]`` entries), and refuses an
entry left with neither a base_url nor a credential source, so nothing downstream
falls back to an SDK's environment defaults.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs

from . import registry
from .credentials import _ANONYMOUS, Credential
from .policy_checks import _MISSING, MAX_CONTEXT, _is_int, _Problems, name_problem, url_problem
from .redact import looks_like_key, safe_url, url_repr
from .registry import Provider

Rotation = Literal["fill_first", "round_robin"]
_ROTATIONS = ("fill_first", "round_robin")


def _endpoint_id(base_url: str | None) -> str:
    """The base_url as a health-store key shows it: without credentials, which a short
    digest of the whole URL stands for (two URLs differing only in their key stay
    apart; the store, its snapshot and a shared backend never hold the key)."""
    if not base_url:
        return ""
    shown = safe_url(base_url)
    if shown == base_url:
        return base_url
    return f"{shown}#{hashlib.sha256(base_url.encode()).hexdigest()[:12]}"


def _default_credentials() -> tuple[Credential, ...]:
    return ()


def _cred_tuple(value: Iterable[Credential]) -> tuple[Credential, ...]:
    return tuple(value)


@attrs.frozen(slots=True)
class Target:
    """One entry of the chain. `index` 0 is the primary (set by the Policy)."""

    provider: str
    model: str
    base_url: str | None = attrs.field(default=None, repr=url_repr)
    context_length: int | None = None
    credentials: tuple[Credential, ...] = attrs.field(
        factory=_default_credentials, converter=_cred_tuple
    )
    rotation: Rotation = "fill_first"
    #: A local server that takes no key (Ollama, vLLM without --api-key): no
    #: credentials, and a placeholder key is sent (never one from the environment).
    keyless: bool = False
    index: int = 0
    #: The state-name prefix: ``primary``, ``fallback_1``, ... (derived from index).
    name: str = attrs.field(init=False, repr=False, eq=False)
    #: Identity across turns, policies and processes (the health store's key): the
    #: backend a request reaches, base_url and model (aliases of one backend share it).
    key: tuple[str, str] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        ps = _Problems()
        for name in ("provider", "model"):
            v = getattr(self, name)
            bad = name_problem(v)
            if bad is None and looks_like_key(v):  # it would be sent, traced and drawn
                bad = f"must be a {name} name, not a key"
            if bad:
                ps.add(name, v, bad)
        bad_url = url_problem(self.base_url) if self.base_url is not None else None
        if bad_url:
            ps.add("base_url", self.base_url, bad_url)
        if self.context_length is not None and not (
            _is_int(self.context_length) and 0 < self.context_length <= MAX_CONTEXT
        ):
            ps.add(
                "context_length",
                self.context_length,
                f"must be a positive integer of at most {MAX_CONTEXT:,} tokens",
            )
        if self.rotation not in _ROTATIONS:
            ps.add("rotation", self.rotation, f"must be one of {', '.join(_ROTATIONS)}")
        for i, c in enumerate(self.credentials):
            if not isinstance(c, Credential):
                ps.add(f"credentials[{i}]", c, "must be a Credential")
        ids = [c.id for c in self.credentials if isinstance(c, Credential)]
        if len(set(ids)) != len(ids):
            ps.add("credentials", ids, "credential ids must be unique")
        if not isinstance(self.keyless, bool):
            ps.add("keyless", self.keyless, "must be true or false")
        elif self.keyless and self.credentials:
            ps.add("keyless", True, "a keyless target takes no key_env / api_key")
        if not _is_int(self.index) or self.index < 0:
            ps.add("index", self.index, "must be an integer >= 0")
        ps.raise_if_any()
        name = "primary" if self.index == 0 else f"fallback_{self.index}"
        object.__setattr__(self, "name", name)
        object.__setattr__(
            self,
            "key",
            (_endpoint_id(self.base_url) or f"provider:{self.provider}", self.model),
        )

    def same_as(self, other: Target) -> bool:
        """Identical entries (same provider+model, or same base_url+model) are skipped."""
        if self.model != other.model:
            return False
        return self.provider == other.provider or (
            self.base_url is not None and self.base_url == other.base_url
        )

    def pool(self) -> tuple[Credential, ...]:
        """The credential pool; a keyless target has one anonymous slot (its key is a
        placeholder: the SDK insists on one, a local server ignores it)."""
        return self.credentials or (_ANONYMOUS,)


def _known_list(extra: Mapping[str, Provider] | None) -> str:
    return ", ".join(registry.known(extra))


def resolve_target(
    t: Target,
    extra: Mapping[str, Provider] | None,
    ps: _Problems,
    where: str,
    credentials_given: bool = False,
) -> Target:
    """`t` with its endpoint and credentials made explicit: what the entry gives,
    else what the registry (`extra` first, then the built-in one) gives. What
    cannot be made explicit is reported on `ps` under `where` (``primary``,
    ``fallback_providers[0]``, ``targets[1]``). `credentials_given`: the entry
    named credentials that were refused already (no second complaint)."""
    info = registry.lookup(t.provider, extra)
    changes: dict[str, Any] = {}
    if t.base_url is None and (info is None or info.base_url is None):
        near = registry.suggest(t.provider, extra)
        hint = f" (did you mean {near!r}?)" if near and near != t.provider else ""
        ps.add(
            f"{where}.provider",
            t.provider,
            f"unknown provider and no base_url{hint}: use a known provider "
            f"({_known_list(extra)}), or give base_url and a credential",
        )
        return t  # one root cause, one problem
    if t.base_url is None and info is not None:
        changes["base_url"] = info.base_url
    if not t.credentials and not t.keyless and not credentials_given:
        if info is not None and info.keyless:
            changes["keyless"] = True
        elif info is not None and info.key_envs:
            changes["credentials"] = tuple(Credential.from_env(e) for e in info.key_envs)
        else:
            near = registry.suggest(t.provider, extra) if info is None else None
            hint = f" (did you mean {near!r}?)" if near else ""
            whose = (
                f"provider {t.provider!r} has no key variable in the registry"
                if info is not None
                else f"{t.provider!r} is not a known provider{hint}"
            )
            ps.add(
                f"{where}.key_env",
                _MISSING,
                "missing: no credential: give key_env, key_envs, api_key or api_keys, or "
                f"keyless = true for a local server that takes no key ({whose}; known "
                f"providers: {_known_list(extra)})",
            )
    return attrs.evolve(t, **changes) if changes else t
