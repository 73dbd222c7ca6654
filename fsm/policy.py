"""The policy: the chain of targets and how each outcome class is handled.

Frozen attrs classes, validated at construction. A bad policy raises one
`PolicyError` naming every bad field and value (secrets shown as ``***``).
`Policy.from_dict` / `Policy.from_toml` accept the common
``fallback_providers`` shape.

Every target of a valid policy has an explicit endpoint and credentials: what
the entry gives, else what the provider registry (`fsm.registry`, plus the
policy's own ``[providers.<name>]`` tables) says. A target left with neither a
base_url nor a credential source is refused, so nothing downstream ever falls
back to an SDK's environment defaults.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import tomllib
import unicodedata
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs

from . import registry
from .errors import MissingCredential, PolicyError, Problem
from .outcomes import OutcomeKind
from .redact import looks_like_key, redact, safe_url, url_repr
from .registry import Provider
from .textfile import UnreadableFile, read_text
from .tomlpos import split_path, toml_line
from .traits import DEFAULT_RULES, FAULT_KINDS, TRAITS, Rule

Rotation = Literal["fill_first", "round_robin"]
_ROTATIONS = ("fill_first", "round_robin")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: The longest chain: the primary and 99 fallbacks. Far above any real fallback list
#: (a handful); a turn that keeps failing calls every target in turn, and what lists
#: every edge (each target may fall back to every later one) grows with the square of
#: the chain: the full diagram (~1 MB of Mermaid at 100), the `transitions` executor,
#: the model checker. The declaration and the default executor grow linearly.
MAX_TARGETS = 100
#: The longest duration a policy may give (deadline, attempt_timeout, backoff,
#: cooldown, retry_after_cap): one day, the longest Retry-After fallgate honours.
#: Far longer ones overflow the OS's timers (a sync attempt of 1e10 s failed with
#: "timestamp out of range").
MAX_SECONDS = 86_400.0
#: The largest context_length (tokens): far above any model's window.
MAX_CONTEXT = 1_000_000_000
#: The largest policy file read (bytes).
MAX_POLICY_BYTES = 1 << 20
#: Characters no name may hold: controls (newline, NUL, ...), format characters
#: (bidi overrides, zero-width), line and paragraph separators, surrogates. A name
#: shows in traces, logs, errors and diagrams, where such a character breaks the
#: line or the Mermaid/DOT source, or hides what the name says.
_UNSEEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def name_problem(value: object) -> str | None:
    """Why `value` is no good as a name (provider, model, credential id), or None."""
    if not isinstance(value, str) or not value.strip():
        return "must be a non-empty string"
    for i, c in enumerate(value):
        if unicodedata.category(c) in _UNSEEN:
            return f"must not hold control characters (found {c!r} at position {i})"
    return None


def url_problem(value: object) -> str | None:
    """Why `value` is no good as a base_url (an http:// or https:// URL), or None."""
    want = "must be an http:// or https:// URL"
    if not isinstance(value, str):
        return want
    for i, c in enumerate(value):
        if c.isspace() or unicodedata.category(c) in _UNSEEN:
            what = "a space" if c == " " else repr(c)
            return f"{want} (found {what} at position {i})"
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 - raises on a port that is not a number in 0..65535
    except ValueError as e:
        return f"{want} ({e})"
    if parts.scheme.lower() not in ("http", "https"):
        return want
    if not parts.hostname:
        return f"{want} with a host"
    return None


class _Problems:
    """Collects problems under a path prefix; raises them together."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.items: list[Problem] = []

    def add(self, field: str, value: object, message: str, secret: bool = False) -> None:
        path = (
            f"{self.prefix}{field}"
            if field.startswith("[") or not self.prefix
            else (f"{self.prefix}.{field}")
        )
        path = redact(path)  # a key pasted as a field name is not echoed either
        if secret or _KEY_FIELD.search(path):
            # A field meant for a key (or its variable's name) is never echoed: a key
            # typed into it by mistake would be printed.
            shown = _hidden(value)
            if isinstance(value, str) and looks_like_key(value) and not secret:
                message += (
                    "; the value looks like an API key: put the key in an environment "
                    "variable and give its name here"
                )
        else:
            shown = _short_repr(value)
            if isinstance(value, str) and looks_like_key(value):
                message += " (the value looks like an API key; it is not shown)"
        # A message may quote the value (a URL parser's complaint): masked too.
        self.items.append(Problem(path or "<policy>", shown, redact(message)))

    def extend(self, sub: PolicyError, field: str) -> None:
        for p in sub.problems:
            base = f"{self.prefix}.{field}" if self.prefix else field
            path = f"{base}.{p.path}" if not p.path.startswith("[") else f"{base}{p.path}"
            self.items.append(attrs.evolve(p, path=redact(path)))

    def raise_if_any(self) -> None:
        if self.items:
            raise PolicyError(self.items)


def env_name_ok(name: object) -> bool:
    """An environment variable's name, and not a key that happens to be shaped like one
    (``gsk_...``, ``AIza...``)."""
    return isinstance(name, str) and bool(_ENV_NAME.match(name)) and not looks_like_key(name)


#: Fields that hold a key or the name of the variable that holds one.
_KEY_FIELD = re.compile(r"(?:^|\.)(?:key_envs?|api_keys?|credentials?)(?:\[\d+\])?$")


def _short_repr(value: object) -> str:
    """The value as a problem shows it: short, and with anything key-shaped masked."""
    if value is _MISSING:
        return ""
    text = redact(repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _hidden(value: object) -> str:
    """A value of a key field, described without being shown."""
    if value is _MISSING:
        return ""
    if isinstance(value, str):
        return f"*** ({len(value)} characters, not shown)"
    return f"*** (a {type(value).__name__}, not shown)"


_MISSING = object()


def _is_number(v: object) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and math.isfinite(v))  # no int overflows


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@attrs.frozen(slots=True, repr=False)
class Secret:
    """A key that never shows itself in repr, str, logs or diagrams."""

    _value: str = attrs.field(alias="value")

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """Pretty-printers (IPython, Hypothesis) walk attrs fields: show *** there too."""
        p.text(repr(self))


@attrs.frozen(slots=True)
class Credential:
    """One API key of a target's pool: a literal key or an env var read at use time.

    `id` is the safe name that traces and logs show (``env:NAME`` or
    ``key#N``); the key itself only leaves through `resolve()`.
    """

    id: str
    env: str | None = None
    key: Secret | None = None
    #: The id health is shared under across processes: ``env:NAME`` for a key read from
    #: the environment, a fingerprint of a literal key (``key:`` + 16 hex digits of a
    #: salted SHA-256: the same key gets the same id in every process, and the id says
    #: nothing of the key), else the id.
    health_id: str = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        ps = _Problems()
        bad_id = name_problem(self.id)
        if bad_id:
            ps.add("id", self.id, bad_id)
        if (self.env is None) == (self.key is None):
            ps.add("credential", _MISSING, "give exactly one of key_env or api_key")
        if self.env is not None and not env_name_ok(self.env):
            ps.add("key_env", self.env, "must be an environment variable name")
        if self.key is not None and (
            not isinstance(self.key, Secret)
            or not isinstance(self.key.reveal(), str)
            or not self.key.reveal().strip()
        ):
            ps.add("api_key", self.key, "must be a non-empty string", secret=True)
        ps.raise_if_any()
        hid = self.id
        if self.key is not None and self.id != "none":
            digest = hashlib.sha256(b"fallgate-credential\0" + self.key.reveal().encode())
            hid = f"key:{digest.hexdigest()[:16]}"
        elif self.env is not None:
            hid = f"env:{self.env}"
        object.__setattr__(self, "health_id", hid)

    def resolve(self, target: str = "?") -> str:
        """The key, read now (env vars are read at use time, never cached)."""
        if self.key is not None:
            return self.key.reveal()
        assert self.env is not None
        value = os.environ.get(self.env, "")
        if not value.strip():
            raise MissingCredential(self.env, target)
        return value

    @classmethod
    def from_env(cls, name: str) -> Credential:
        return cls(id=f"env:{name}", env=name)

    @classmethod
    def literal(cls, key: str, n: int = 1) -> Credential:
        return cls(id=f"key#{n}", key=Secret(key))


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


def _target_tuple(value: Iterable[Target]) -> tuple[Target, ...]:
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


#: What a keyless target sends as its key: never empty (an empty key would let
#: the SDK look for one in its own environment variables).
KEYLESS_PLACEHOLDER = "no-key"
_ANONYMOUS = Credential(id="none", key=Secret(KEYLESS_PLACEHOLDER))


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


@attrs.frozen(slots=True)
class Backoff:
    """Exponential backoff with full jitter: wait = U(0, min(cap, initial * multiplier**n))."""

    initial: float = 0.5
    multiplier: float = 2.0
    cap: float = 8.0
    jitter: bool = True

    def __attrs_post_init__(self) -> None:
        ps = _Problems()
        _check_growth(ps, self.initial, self.multiplier, self.cap)
        if not isinstance(self.jitter, bool):
            ps.add("jitter", self.jitter, "must be true or false")
        ps.raise_if_any()


@attrs.frozen(slots=True)
class Cooldown:
    """Cross-turn cooldown after a hard failure when no Retry-After says otherwise."""

    initial: float = 5.0
    multiplier: float = 2.0
    cap: float = 300.0

    def __attrs_post_init__(self) -> None:
        ps = _Problems()
        _check_growth(ps, self.initial, self.multiplier, self.cap)
        ps.raise_if_any()


@attrs.frozen(slots=True)
class Breaker:
    """A circuit breaker per backend, shared through the health store.

    More than `allowed_failures` turns leaving the target with a hard failure within
    `window` seconds open it (for the `cooldown` span, growing with each reopening); a
    Retry-After from the server opens it at once. Once the span is over one turn at a
    time probes it (a lease of one attempt timeout and a second); success closes it. The default
    tolerates two failed turns a minute, so one 503 does not move an agent's later
    turns to another model."""

    allowed_failures: int = 2
    window: float = 60.0

    def __attrs_post_init__(self) -> None:
        ps = _Problems()
        if not _is_int(self.allowed_failures) or not 0 <= self.allowed_failures <= 1000:
            ps.add("allowed_failures", self.allowed_failures, "must be an integer 0..1000")
        _check_seconds(ps, "window", self.window)
        ps.raise_if_any()


@attrs.frozen(slots=True)
class RetryBudget:
    """A retry budget per backend (a token bucket, shared through the health store).

    First attempts are free; each retry on the same target takes one token; each success
    puts `refill` back, up to `size`. An empty bucket means no retry on this target now
    (the turn falls back, or fails saying so): while a backend is down, retries stop
    multiplying its traffic."""

    size: float = 10.0
    refill: float = 0.2
    enabled: bool = True

    def __attrs_post_init__(self) -> None:
        ps = _Problems()
        if not _is_number(self.size) or not 1 <= self.size <= 1e6:
            ps.add("size", self.size, "must be a number of tokens between 1 and 1000000")
        if not _is_number(self.refill) or not 0 <= self.refill <= 1e6:
            ps.add("refill", self.refill, "must be a number of tokens >= 0")
        if not isinstance(self.enabled, bool):
            ps.add("enabled", self.enabled, "must be true or false")
        ps.raise_if_any()


_MAX_MULTIPLIER = 1000


def _check_growth(ps: _Problems, initial: float, multiplier: float, cap: float) -> None:
    """initial * multiplier**n, capped: the shape Backoff and Cooldown share."""
    n = len(ps.items)
    _check_seconds(ps, "initial", initial)
    if not _is_number(multiplier) or not 1 <= multiplier <= _MAX_MULTIPLIER:
        ps.add("multiplier", multiplier, f"must be a finite number from 1 to {_MAX_MULTIPLIER}")
    _check_seconds(ps, "cap", cap)
    if len(ps.items) == n and cap < initial:
        ps.add("cap", cap, f"must be >= initial ({initial})")


def _check_seconds(ps: _Problems, name: str, v: object, positive: bool = False) -> None:
    if not _is_number(v) or v < 0 or (positive and v == 0):  # type: ignore[operator]
        ps.add(name, v, f"must be a finite number of seconds {'> 0' if positive else '>= 0'}")
    elif v > MAX_SECONDS:  # type: ignore[operator]
        ps.add(name, v, f"must be at most {MAX_SECONDS:g} seconds (one day)")


def _provider_map(value: Mapping[str, Provider] | None) -> dict[str, Provider]:
    return dict(value or {})


def _rules_converter(value: Mapping[Any, Any] | None) -> Mapping[OutcomeKind, Rule]:
    merged: dict[OutcomeKind, Rule] = dict(DEFAULT_RULES)
    if value:
        for k, v in value.items():
            try:
                kind = OutcomeKind(k)
            except ValueError:
                kind = k  # left for validation to name
            merged[kind] = v
    return merged


@attrs.frozen(slots=True)
class Policy:
    """Everything that shapes a turn. Build once, share across turns and threads."""

    targets: tuple[Target, ...] = attrs.field(converter=_target_tuple)
    max_attempts: int = 3
    transport_faults_before_recovery: int = 2
    recover_transport: bool = True
    backoff: Backoff = attrs.field(factory=Backoff)
    retry_after_cap: float = 30.0
    deadline: float = 120.0
    attempt_timeout: float = 60.0
    #: A committed stream's limit on each wait for its next event (seconds).
    stream_idle_timeout: float = 60.0
    #: What one attempt may read off the wire (bytes); more is a malformed reply.
    max_body_bytes: int = 64 * 1024 * 1024
    prefer_waiting: bool = False
    continue_streams: bool = False
    cooldown: Cooldown = attrs.field(factory=Cooldown)
    breaker: Breaker = attrs.field(factory=Breaker)
    retry_budget: RetryBudget = attrs.field(factory=RetryBudget)
    rules: Mapping[OutcomeKind, Rule] = attrs.field(factory=dict, converter=_rules_converter)
    #: The policy's own provider registry entries (``[providers.<name>]``): they add
    #: to, or replace, the built-in ones of `fsm.registry` for this policy.
    providers: Mapping[str, Provider] = attrs.field(factory=dict, converter=_provider_map)
    #: What is built once per policy (its declaration, compiled tables): lives and dies
    #: with the policy, never keyed by id().
    memo: dict[str, object] = attrs.field(
        factory=dict, init=False, repr=False, eq=False, hash=False
    )

    def __attrs_post_init__(self) -> None:
        ps = _Problems()
        if not self.targets:
            ps.add("targets", self.targets, "the chain needs at least one target (the primary)")
        if len(self.targets) > MAX_TARGETS:
            ps.add("targets", _MISSING, chain_too_long(len(self.targets)))
            ps.raise_if_any()  # one problem, not one per target of a runaway chain
        for name, entry in self.providers.items():
            bad_name = name_problem(name)
            if bad_name:
                ps.add("providers", name, f"provider name {bad_name}")
            elif not isinstance(entry, Provider) or entry.name != name:
                ps.add(
                    f"providers.{name}", entry, f"must be an fsm.registry.Provider named {name!r}"
                )
            elif entry.base_url is None or url_problem(entry.base_url):
                ps.add(
                    f"providers.{name}.base_url",
                    entry.base_url,
                    url_problem(entry.base_url) or "must be an http(s) URL",
                )
        extra = {k: v for k, v in self.providers.items() if isinstance(v, Provider)}
        fixed = []
        for i, t in enumerate(self.targets):
            if not isinstance(t, Target):
                ps.add(f"targets[{i}]", t, "must be a Target")
                continue
            t = resolve_target(t, extra, ps, f"targets[{i}]")
            fixed.append(t if t.index == i else attrs.evolve(t, index=i))
        object.__setattr__(self, "targets", tuple(fixed))
        for name in ("max_attempts", "transport_faults_before_recovery"):
            v = getattr(self, name)
            if not _is_int(v) or not 1 <= v <= 1000:
                ps.add(name, v, "must be an integer between 1 and 1000")
        for name in ("recover_transport", "prefer_waiting", "continue_streams"):
            if not isinstance(getattr(self, name), bool):
                ps.add(name, getattr(self, name), "must be true or false")
        _check_seconds(ps, "retry_after_cap", self.retry_after_cap)
        _check_seconds(ps, "deadline", self.deadline, positive=True)
        _check_seconds(ps, "attempt_timeout", self.attempt_timeout, positive=True)
        _check_seconds(ps, "stream_idle_timeout", self.stream_idle_timeout, positive=True)
        if not _is_int(self.max_body_bytes) or not 1024 <= self.max_body_bytes <= 1 << 40:
            ps.add(
                "max_body_bytes", self.max_body_bytes, "must be an integer between 1024 and 2**40"
            )
        if not isinstance(self.backoff, Backoff):
            ps.add("backoff", self.backoff, "must be a Backoff")
        if not isinstance(self.cooldown, Cooldown):
            ps.add("cooldown", self.cooldown, "must be a Cooldown")
        if not isinstance(self.breaker, Breaker):
            ps.add("breaker", self.breaker, "must be a Breaker")
        if not isinstance(self.retry_budget, RetryBudget):
            ps.add("retry_budget", self.retry_budget, "must be a RetryBudget")
        for kind, rule in self.rules.items():
            _check_rule(ps, kind, rule, self.continue_streams)
        ps.raise_if_any()

    # -- derived facts the machine reads -------------------------------------------------
    def rule(self, kind: OutcomeKind) -> Rule:
        return self.rules[kind]

    def provider(self, target: Target) -> Provider | None:
        """The registry entry of `target`'s provider (the policy's own first), if any."""
        return registry.lookup(target.provider, self.providers)

    @property
    def fallbacks(self) -> tuple[Target, ...]:
        return self.targets[1:]

    def secrets(self) -> list[str]:
        """Every key this policy can use right now (for redaction)."""
        out = []
        for t in self.targets:
            for c in t.credentials:
                if c.key is not None:
                    out.append(c.key.reveal())
                elif c.env and os.environ.get(c.env, "").strip():
                    out.append(os.environ[c.env])
        return [s for s in out if len(s) >= 4]

    # -- loading ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> Policy:
        """Build from plain data (TOML/JSON/YAML shape); see README for the fields."""
        try:
            from .policy_data import policy_from_dict

            return policy_from_dict(data)
        except PolicyError as e:
            raise PolicyError(e.problems, source) from None
        except RecursionError:
            raise PolicyError([_TOO_DEEP], source) from None

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> Policy:
        """Read a policy file: a regular file of at most `MAX_POLICY_BYTES` of UTF-8
        TOML (a named pipe or a device is refused, never waited on)."""
        where = os.fspath(path)
        try:
            text = read_text(where, MAX_POLICY_BYTES)
        except UnreadableFile as e:
            problem = Problem(where, "", f"cannot read policy file: {e.reason}")
            raise PolicyError([problem]) from None
        try:
            data = tomllib.loads(text)
        except ValueError as e:  # TOMLDecodeError, or a number of more than 4,300 digits
            text_e = str(e).split(";")[0]
            raise PolicyError([Problem(where, "", f"not valid TOML: {text_e}")]) from None
        except RecursionError:
            raise PolicyError([_TOO_DEEP], where) from None
        try:
            from .policy_data import policy_from_dict

            return policy_from_dict(data)
        except PolicyError as e:
            located = [
                attrs.evolve(pr, line=toml_line(text, split_path(pr.path))) for pr in e.problems
            ]
            raise PolicyError(located, where) from None
        except RecursionError:
            raise PolicyError([_TOO_DEEP], where) from None


_TOO_DEEP = Problem("<policy>", "", "nested too deeply (tables or arrays inside one another)")


def chain_too_long(n: int) -> str:
    """Why a chain of `n` targets is refused (the limit and its reasons)."""
    return (
        f"{n} targets: a chain holds at most {MAX_TARGETS} (the primary and "
        f"{MAX_TARGETS - 1} fallbacks); a failing turn calls each target in turn, and the "
        "diagrams and the model checker grow with the square of the chain"
    )


_RULE_FIELDS = tuple(f.name for f in attrs.fields(Rule))


def _check_rule(ps: _Problems, kind: object, rule: object, continue_streams: bool) -> None:
    if not isinstance(kind, OutcomeKind) or kind not in DEFAULT_RULES:
        choices = ", ".join(k.value for k in FAULT_KINDS)
        ps.add(f"rules.{kind}", _MISSING, f"unknown outcome class (choose from {choices})")
        return
    if not isinstance(rule, Rule):
        ps.add(f"rules.{kind.value}", rule, "must be a Rule")
        return
    path = f"rules.{kind.value}"
    for f in _RULE_FIELDS:
        if not isinstance(getattr(rule, f), bool):
            ps.add(f"{path}.{f}", getattr(rule, f), "must be true or false")
    traits = TRAITS[kind]
    switch = traits.retry_switch
    if rule.retry and traits.may_retry and switch is not None and not continue_streams:
        ps.add(f"{path}.retry", True, f"{kind.value} is retried only with {switch} = true")
    elif rule.retry and not traits.may_retry:
        retryable = ", ".join(k.value for k in FAULT_KINDS if TRAITS[k].may_retry)
        ps.add(
            f"{path}.retry",
            True,
            f"{kind.value} is never retried on the same target and credential "
            f"(only {retryable} are retryable)",
        )
    if rule.rotate and not traits.may_rotate:
        rotatable = ", ".join(k.value for k in FAULT_KINDS if TRAITS[k].may_rotate)
        ps.add(
            f"{path}.rotate",
            True,
            f"{kind.value} is not the key's fault; only {rotatable} rotate credentials",
        )
    if rule.fall_back and not traits.may_fall_back:
        ps.add(f"{path}.fall_back", True, "a committed stream is never replayed on another target")
