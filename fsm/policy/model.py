"""The policy: the chain of targets and how each outcome class is handled.

Frozen attrs classes, validated at construction. A bad policy raises one
`PolicyError` naming every bad field and value (secrets shown as ``***``).
`Policy.from_dict` / `Policy.from_toml` accept the common
``fallback_providers`` shape.

Every target of a valid policy has an explicit endpoint and credentials: what
the entry gives, else what the provider registry (`fsm.catalogue.registry`, plus the
policy's own ``[providers.<name>]`` tables) says. A target left with neither a
base_url nor a credential source is refused, so nothing downstream ever falls
back to an SDK's environment defaults.

Here: the policy and reading a policy file. Its knobs (backoff, cooldown, breaker, retry
budget) are `fsm.policy.knobs`, a target and its endpoint `fsm.policy.targets`, its keys
`fsm.policy.credentials`, the field checks `fsm.policy.checks`, the plain-data shape
`fsm.policy.loading`; their public names are importable from here too.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ..catalogue import registry
from ..catalogue.registry import Provider
from ..errors import PolicyError, Problem
from ..kinds import DEFAULT_RULES, OutcomeKind, Rule
from . import groups
from .checks import (
    MAX_CONTEXT,
    MAX_SECONDS,
    MISSING,
    ONE_ATTEMPT,
    Problems,
    check_reserve,
    check_rule,
    check_seconds,
    is_int,
    name_problem,
    url_problem,
)
from .credentials import KEYLESS_PLACEHOLDER, Credential, Secret
from .knobs import MAX_TARGETS, Backoff, Breaker, Cooldown, RetryBudget, chain_too_long
from .loading import policy_from_dict
from .targets import Rotation, Target, resolve_target
from .textfile import UnreadableFile, read_text
from .tomlpos import split_path, toml_line

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

#: The largest policy file read (bytes).
MAX_POLICY_BYTES = 1 << 20


#: The per-attempt time bounds (`providers.openai.http.bounds` enforces them).
_BOUNDS = (
    "attempt_timeout",
    "connect_timeout",
    "first_byte_timeout",
    "first_event_timeout",
    "stream_idle_timeout",
)


def _target_tuple(value: Iterable[Target]) -> tuple[Target, ...]:
    return tuple(value)


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
    deadline: float = 180.0
    #: An attempt's total time (seconds): connect, headers and the whole non-streamed
    #: reply; a stream's until its first event. The bounds below are capped by it.
    attempt_timeout: float = 60.0
    #: Each connection's TCP + TLS setup (the openai SDK's own default connect timeout).
    connect_timeout: float = 5.0
    #: A non-streamed reply's first byte (its headers): most providers send them once
    #: the answer is done, and a reasoning model may think for minutes first.
    first_byte_timeout: float = 300.0
    #: A stream's first event (headers included): it usually comes within seconds.
    first_event_timeout: float = 30.0
    #: A started stream's limit on each wait for its next event (seconds).
    stream_idle_timeout: float = 60.0
    #: Time kept for the next eligible target: a retry, wait, rebuild or rotation on the
    #: current one is taken only if its worst case still leaves this much of the
    #: deadline. ``"one_attempt"`` (that target's `attempt_bound`), seconds, or False.
    reserve: str | float = ONE_ATTEMPT
    #: What one attempt may read off the wire (bytes); more is a malformed reply.
    max_body_bytes: int = 64 * 1024 * 1024
    prefer_waiting: bool = False
    #: A stream that breaks after its first output is continued (the delivered text as an
    #: assistant prefix) on a target that can (`Target.assistant_prefix`), not failed.
    continue_streams: bool = True
    #: Pace from the providers' rate-limit headers: an attempt takes a key with headroom
    #: now, else falls back, else waits for the soonest reset (`fsm.core.pacing`). Costs
    #: nothing where no reply carries such headers.
    pacing: bool = True
    cooldown: Cooldown = attrs.field(factory=Cooldown)
    breaker: Breaker = attrs.field(factory=Breaker)
    retry_budget: RetryBudget = attrs.field(factory=RetryBudget)
    rules: Mapping[OutcomeKind, Rule] = attrs.field(factory=dict, converter=_rules_converter)
    #: The policy's own provider registry entries (``[providers.<name>]``): they add
    #: to, or replace, the built-in ones of `fsm.catalogue.registry` for this policy.
    providers: Mapping[str, Provider] = attrs.field(factory=dict, converter=_provider_map)
    #: What is built once per policy (its declaration, compiled tables): lives and dies
    #: with the policy, never keyed by id().
    memo: dict[str, object] = attrs.field(
        factory=dict, init=False, repr=False, eq=False, hash=False
    )

    def __attrs_post_init__(self) -> None:
        ps = Problems()
        if not self.targets:
            ps.add("targets", self.targets, "the chain needs at least one target (the primary)")
        if len(self.targets) > MAX_TARGETS:
            ps.add("targets", MISSING, chain_too_long(len(self.targets)))
            ps.raise_if_any()  # one problem, not one per target of a runaway chain
        for name, entry in self.providers.items():
            bad_name = name_problem(name)
            if bad_name:
                ps.add("providers", name, f"provider name {bad_name}")
            elif not isinstance(entry, Provider) or entry.name != name:
                ps.add(
                    f"providers.{name}",
                    entry,
                    f"must be an fsm.catalogue.registry.Provider named {name!r}",
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
        object.__setattr__(self, "targets", groups.assign(fixed, ps))
        for name in ("max_attempts", "transport_faults_before_recovery"):
            v = getattr(self, name)
            if not is_int(v) or not 1 <= v <= 1000:
                ps.add(name, v, "must be an integer between 1 and 1000")
        for name in ("recover_transport", "prefer_waiting", "continue_streams", "pacing"):
            if not isinstance(getattr(self, name), bool):
                ps.add(name, getattr(self, name), "must be true or false")
        check_seconds(ps, "retry_after_cap", self.retry_after_cap)
        check_seconds(ps, "deadline", self.deadline, positive=True)
        for name in _BOUNDS:
            check_seconds(ps, name, getattr(self, name), positive=True)
        check_reserve(ps, self.reserve)
        if not is_int(self.max_body_bytes) or not 1024 <= self.max_body_bytes <= 1 << 40:
            ps.add(
                "max_body_bytes",
                self.max_body_bytes,
                f"must be an integer between 1024 and {1 << 40} (1 TiB)",
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
            check_rule(ps, kind, rule)
        ps.raise_if_any()

    # -- derived facts the machine reads -------------------------------------------------
    def rule(self, kind: OutcomeKind) -> Rule:
        return self.rules[kind]

    @property
    def continues(self) -> bool:
        """Are broken streams continued (`continue_streams` and the rule's `retry`)?"""
        return self.continue_streams and self.rules[OutcomeKind.STREAM_INTERRUPTED].retry

    def provider(self, target: Target) -> Provider | None:
        """The registry entry of `target`'s provider (the policy's own first), if any."""
        return registry.lookup(target.provider, self.providers)

    def attempt_bound(self, target: Target, *, stream: bool = False) -> float:
        """The worst case of one attempt on `target` (seconds from its start until its
        outcome is known; the turn's deadline not counted): a non-streamed reply's total
        bound, or how long a stream may take to start (a started stream's time is the
        caller's). The same for every target today; `target` lets per-target bounds in."""
        del target
        if stream:
            return min(self.attempt_timeout, self.first_event_timeout)
        return self.attempt_timeout

    def reserve_for(self, target: Target) -> float:
        """The time to keep for one attempt on `target` when it is the next eligible
        fallback (seconds; 0 with ``reserve = false``)."""
        r = self.reserve
        if r is False:
            return 0.0
        if r == ONE_ATTEMPT:
            return self.attempt_bound(target)
        return float(r)

    def most_reserve(self) -> float:
        """The largest `reserve_for` of any fallback (memoised): a stay that leaves this
        much keeps the reserve whichever target is eligible next."""
        found = self.memo.get("most_reserve")
        if not isinstance(found, float):
            found = self.memo["most_reserve"] = max(
                (self.reserve_for(t) for t in self.targets[1:]), default=0.0
            )
        return found

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
        """Build from plain data (TOML/JSON/YAML shape); see docs/policy.md for the fields."""
        try:
            return policy_from_dict(cls, data)
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
            return policy_from_dict(cls, data)
        except PolicyError as e:
            located = [
                attrs.evolve(pr, line=toml_line(text, split_path(pr.path))) for pr in e.problems
            ]
            raise PolicyError(located, where) from None
        except RecursionError:
            raise PolicyError([_TOO_DEEP], where) from None


_TOO_DEEP = Problem("<policy>", "", "nested too deeply (tables or arrays inside one another)")
