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

Here: the policy and its knobs (backoff, cooldown, breaker, retry budget) and
reading a policy file. A target and its endpoint are `fsm.targets`, its keys
`fsm.credentials`, the field checks `fsm.policy_checks`, the plain-data shape
`fsm.policy_data`; their public names are importable from here too.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from . import registry
from .credentials import KEYLESS_PLACEHOLDER, Credential, Secret
from .errors import PolicyError, Problem
from .outcomes import OutcomeKind
from .policy_checks import (
    _MISSING,
    MAX_CONTEXT,
    MAX_SECONDS,
    _check_growth,
    _check_rule,
    _check_seconds,
    _is_int,
    _is_number,
    _Problems,
    name_problem,
    url_problem,
)
from .registry import Provider
from .targets import Rotation, Target, resolve_target
from .textfile import UnreadableFile, read_text
from .tomlpos import split_path, toml_line
from .traits import DEFAULT_RULES, Rule

__all__ = [
    "KEYLESS_PLACEHOLDER",
    "MAX_CONTEXT",
    "MAX_POLICY_BYTES",
    "MAX_SECONDS",
    "MAX_TARGETS",
    "Backoff",
    "Breaker",
    "Cooldown",
    "Credential",
    "Policy",
    "RetryBudget",
    "Rotation",
    "Secret",
    "Target",
    "chain_too_long",
    "resolve_target",
]

#: The longest chain: the primary and 99 fallbacks. Far above any real fallback list
#: (a handful); a turn that keeps failing calls every target in turn, and what lists
#: every edge (each target may fall back to every later one) grows with the square of
#: the chain: the full diagram (~1 MB of Mermaid at 100), the `transitions` executor,
#: the model checker. The declaration and the default executor grow linearly.
MAX_TARGETS = 100
#: The largest policy file read (bytes).
MAX_POLICY_BYTES = 1 << 20


def _target_tuple(value: Iterable[Target]) -> tuple[Target, ...]:
    return tuple(value)


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
