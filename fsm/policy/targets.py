"""One entry of the chain (`Target`) and how its endpoint and keys are made explicit.

`resolve_target` fills in what an entry leaves out from the provider registry
(`fsm.catalogue.registry`, plus a policy's own ``[providers.<name>]`` entries), and refuses an
entry left with neither a base_url nor a credential source, so nothing downstream
falls back to an SDK's environment defaults.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from ..catalogue import registry
from ..catalogue.registry import Provider
from ..redact import looks_like_key, safe_url, url_repr
from .checks import (
    MAX_CONTEXT,
    MISSING,
    Problems,
    is_int,
    is_number,
    name_problem,
    url_problem,
)
from .credentials import ANONYMOUS, Credential

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
    #: A broken stream may be continued on this target (it answers a request whose last
    #: message is the delivered text with the rest): None takes its provider's
    #: `Provider.assistant_prefix` from the registry (resolved when the policy is built).
    assistant_prefix: bool | None = None
    index: int = 0
    #: The deployment group this target is a member of (`fsm.policy.groups`): the
    #: members of one group are equivalent deployments that share one chain entry.
    group: str | None = None
    #: A member's share of its group's traffic, relative to the others (1: equal).
    weight: float = 1.0
    #: The member's number in its group, from 1 in declared order (0: no group; set
    #: by the Policy, and kept by the turn's routed order so names stay put).
    member: int = 0
    #: The chain entry this target stands at (None: its index; set by the Policy:
    #: a group's members share one entry).
    entry: int | None = None
    #: The state-name prefix: ``primary``, ``fallback_1``, ``fallback_1_m2`` (derived
    #: from the entry and the member number).
    name: str = attrs.field(init=False, repr=False, eq=False)
    #: Identity across turns, policies and processes (the health store's key): the
    #: backend a request reaches, base_url and model (aliases of one backend share it).
    key: tuple[str, str] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        ps = Problems()
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
            is_int(self.context_length) and 0 < self.context_length <= MAX_CONTEXT
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
        if self.assistant_prefix is not None and not isinstance(self.assistant_prefix, bool):
            ps.add("assistant_prefix", self.assistant_prefix, "must be true or false")
        if not is_int(self.index) or self.index < 0:
            ps.add("index", self.index, "must be an integer >= 0")
        if self.group is not None:
            bad = name_problem(self.group)
            if bad is None and looks_like_key(self.group):
                bad = "must be a group name, not a key"
            if bad:
                ps.add("group", self.group, bad)
        if not (is_number(self.weight) and 0 < self.weight <= 1e6):
            ps.add("weight", self.weight, "must be a number > 0 and at most 1000000")
        elif self.weight != 1 and self.group is None:
            ps.add("weight", self.weight, "only a group's members take a weight")
        if not is_int(self.member) or self.member < 0:
            ps.add("member", self.member, "must be an integer >= 0")
        if self.entry is not None and (not is_int(self.entry) or self.entry < 0):
            ps.add("entry", self.entry, "must be an integer >= 0")
        ps.raise_if_any()
        at = self.index if self.entry is None else self.entry
        name = "primary" if at == 0 else f"fallback_{at}"
        if self.member:
            name = f"{name}_m{self.member}"
        object.__setattr__(self, "name", name)
        object.__setattr__(
            self,
            "key",
            (_endpoint_id(self.base_url) or f"provider:{self.provider}", self.model),
        )

    def same_as(self, other: Target) -> bool:
        """Identical entries (same provider+model, or same base_url+model) are skipped.
        Two members of one group are not: they are other deployments by declaration
        (the group refuses two members on one backend)."""
        if self.model != other.model:
            return False
        if self.group is not None and self.group == other.group:
            return False
        return self.provider == other.provider or (
            self.base_url is not None and self.base_url == other.base_url
        )

    @property
    def continues(self) -> bool:
        """Can a broken stream be continued here (`assistant_prefix`, as resolved)?"""
        return self.assistant_prefix is True

    def pool(self) -> tuple[Credential, ...]:
        """The credential pool; a keyless target has one anonymous slot (its key is a
        placeholder: the SDK insists on one, a local server ignores it)."""
        return self.credentials or (ANONYMOUS,)


def identical_warnings(targets: Sequence[Target]) -> list[str]:
    """Entries identical to an earlier one (`Target.same_as`), for `fallgate check`: a turn
    that tried the earlier one skips them, so they are only used when it was not tried."""
    out = []
    for i, t in enumerate(targets):
        first = next((u for u in targets[:i] if u.same_as(t)), None)
        if first is not None:
            how = "provider" if first.provider == t.provider else "base_url"
            out.append(
                f"{t.name} ({t.provider} · {t.model}) is identical to {first.name} (same {how} "
                f"and model): a turn that tried {first.name} skips it; to give {first.name} "
                "more keys, list them in its key_envs"
            )
    return out


def known_list(extra: Mapping[str, Provider] | None) -> str:
    return ", ".join(registry.known(extra))


def resolve_target(
    t: Target,
    extra: Mapping[str, Provider] | None,
    ps: Problems,
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
            f"({known_list(extra)}), or give base_url and a credential",
        )
        return t  # one root cause, one problem
    if t.base_url is None and info is not None:
        changes["base_url"] = info.base_url
    if t.assistant_prefix is None:
        changes["assistant_prefix"] = info is not None and info.assistant_prefix
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
                MISSING,
                "missing: no credential: give key_env, key_envs, api_key or api_keys, or "
                f"keyless = true for a local server that takes no key ({whose}; known "
                f"providers: {known_list(extra)})",
            )
    return attrs.evolve(t, **changes) if changes else t
