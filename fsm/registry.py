"""Well-known OpenAI-compatible providers, as data: where each one lives, which
environment variables hold its keys, and what its error replies say that the
HTTP status alone does not.

Pure data and lookup (no I/O, no environment reads). `fsm.policy` uses it to
make every target's endpoint and credentials explicit; `providers.classify`
reads each entry's quirks; ``fallgate providers`` lists it. A policy can add
or override entries with a ``[providers.<name>]`` table (see `merge`).

A keyless provider (``keyless = True``: a local server such as Ollama or vLLM
started without ``--api-key``) needs no credential: its targets send a
placeholder key, never one read from the SDK's own environment defaults.

Base URLs and key variables were checked against each provider's public
documentation on 2026-11-30 (the ``docs`` field of each entry names the page;
where only third-party pages were found, ``docs`` says so). Trailing slashes
are dropped: the SDK adds its own.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .outcomes import OutcomeKind
from .redact import safe_url, url_repr

__all__ = [
    "PROVIDERS",
    "Provider",
    "known",
    "lookup",
    "markdown_table",
    "merge",
    "suggest",
]

_O = OutcomeKind


def _frozen_map(value: Mapping[Any, OutcomeKind] | None) -> Mapping[Any, OutcomeKind]:
    return types.MappingProxyType(dict(value or {}))


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@attrs.frozen(slots=True)
class Provider:
    """One OpenAI-compatible provider.

    Resolution (`fsm.policy`): a target of this provider that gives no
    ``base_url`` gets `base_url`; one that gives no credential gets a pool of
    `key_envs` (read at use time), or none at all when `keyless`.

    Classification quirks (`providers.classify`), consulted before the generic
    status table:

    - `error_codes`: the value of the error object's ``code``, ``type`` or
      ``status`` field (as a string) -> outcome, for providers whose error
      bodies carry a more precise code than their HTTP status;
    - `status_kinds`: an HTTP status that means something else at this provider.

    `errors_in_2xx` and `notes` describe further behaviour for people (the
    README table, ``fallgate providers``); `docs` is where the entry was checked.
    """

    name: str
    base_url: str | None = attrs.field(repr=url_repr)
    key_envs: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    keyless: bool = False
    docs: str = ""
    error_codes: Mapping[str, OutcomeKind] = attrs.field(factory=dict, converter=_frozen_map)
    status_kinds: Mapping[int, OutcomeKind] = attrs.field(factory=dict, converter=_frozen_map)
    errors_in_2xx: bool = False
    notes: str = ""

    def quirk(self, status: int | None, codes: Iterable[object] = ()) -> OutcomeKind | None:
        """What this provider's quirks say an error is (None: nothing specific).

        `codes` are the values found in the error object (``code``, ``type``,
        ``status``); an error code is more specific than the HTTP status."""
        for c in codes:
            if c is None or isinstance(c, bool):
                continue
            kind = self.error_codes.get(str(c))
            if kind is not None:
                return kind
        if status is not None:
            return self.status_kinds.get(status)
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "base_url": safe_url(self.base_url),  # printed by `fallgate providers`
            "key_envs": list(self.key_envs),
            "keyless": self.keyless,
            "error_codes": {k: v.value for k, v in self.error_codes.items()},
            "status_kinds": {str(k): v.value for k, v in self.status_kinds.items()},
            "errors_in_2xx": self.errors_in_2xx,
            "notes": self.notes,
            "docs": self.docs,
        }


_ENTRIES = (
    Provider(
        "openai",
        "https://api.openai.com/v1",
        "OPENAI_API_KEY",
        docs="the openai SDK's own default (openai-python, lib/_client_auth.py)",
        notes="429 insufficient_quota is quota (generic rule)",
    ),
    Provider(
        "openrouter",
        "https://openrouter.ai/api/v1",
        "OPENROUTER_API_KEY",
        docs="https://openrouter.ai/docs/quickstart, https://openrouter.ai/docs/errors",
        # "403: Your chosen model requires moderation and your input was flagged"
        status_kinds={403: _O.CONTENT_FILTERED},
        errors_in_2xx=True,
        notes="once the model has started, errors arrive in a 200 body or as an SSE "
        "event whose error.code is the HTTP status",
    ),
    Provider(
        "zai",
        "https://api.z.ai/api/paas/v4",
        "ZAI_API_KEY",
        docs="https://docs.z.ai/guides/develop/openai/python, "
        "https://docs.z.ai/api-reference/api-code",
        # Business codes in the body's error.code; HTTP status is often 429 for all.
        error_codes={
            "1000": _O.AUTH,
            "1001": _O.AUTH,
            "1002": _O.AUTH,
            "1003": _O.AUTH,
            "1004": _O.AUTH,
            "1113": _O.QUOTA,  # account in arrears: recharge
            "1211": _O.NOT_FOUND,  # model does not exist
            "1301": _O.CONTENT_FILTERED,  # unsafe or sensitive content
            "1302": _O.RATE_LIMITED,  # high concurrency
        },
        notes="GLM Coding Plan keys need https://api.z.ai/api/coding/paas/v4 "
        "(a plan key on this endpoint answers 1113)",
    ),
    Provider(
        "groq",
        "https://api.groq.com/openai/v1",
        "GROQ_API_KEY",
        docs="https://console.groq.com/docs/openai, https://console.groq.com/docs/errors",
        # 498: flex tier at capacity ("capacity_exceeded"): retry later
        error_codes={"capacity_exceeded": _O.OVERLOADED},
        status_kinds={498: _O.OVERLOADED},
    ),
    Provider(
        "deepseek",
        "https://api.deepseek.com",
        "DEEPSEEK_API_KEY",
        docs="https://api-docs.deepseek.com/, "
        "https://api-docs.deepseek.com/quick_start/error_codes",
        notes="402 insufficient balance, 503 server overloaded (generic rules)",
    ),
    Provider(
        "together",
        "https://api.together.ai/v1",
        "TOGETHER_API_KEY",
        docs="https://docs.together.ai/docs/inference/openai-compatibility",
    ),
    Provider(
        "fireworks",
        "https://api.fireworks.ai/inference/v1",
        "FIREWORKS_API_KEY",
        docs="third-party pages only (Strands Agents, Pipecat docs); fireworks.ai's own "
        "docs were not reachable here",
    ),
    Provider(
        "mistral",
        "https://api.mistral.ai/v1",
        "MISTRAL_API_KEY",
        docs="third-party pages only (@ai-sdk/mistral, LibreChat docs); docs.mistral.ai "
        "was not reachable here",
    ),
    Provider(
        "gemini",
        "https://generativelanguage.googleapis.com/v1beta/openai",
        "GEMINI_API_KEY",
        docs="https://ai.google.dev/gemini-api/docs/openai",
        error_codes={"UNAVAILABLE": _O.OVERLOADED},
        notes="429 RESOURCE_EXHAUSTED covers per-minute and per-day quotas alike: the "
        "QuotaFailure quota id tells them apart (generic rules, fsm.error_body); a bad key "
        "is 400 INVALID_ARGUMENT with reason API_KEY_INVALID",
    ),
    Provider(
        "anthropic",
        "https://api.anthropic.com/v1",
        "ANTHROPIC_API_KEY",
        docs="https://docs.anthropic.com/en/api/openai-sdk, "
        "https://platform.claude.com/docs/en/api/errors",
        error_codes={
            "overloaded_error": _O.OVERLOADED,
            "rate_limit_error": _O.RATE_LIMITED,
            "billing_error": _O.QUOTA,
            "request_too_large": _O.CONTEXT_TOO_LONG,
        },
        status_kinds={529: _O.OVERLOADED},
        notes="529 overloaded; the compatibility layer is meant for testing, not production",
    ),
    Provider(
        "xai",
        "https://api.x.ai/v1",
        "XAI_API_KEY",
        docs="https://docs.x.ai/api/integrations",
    ),
    Provider(
        "ollama",
        "http://localhost:11434/v1",
        keyless=True,
        docs="Ollama's docs/openai.md (the key is required by the SDK but ignored)",
        notes="local server: no key",
    ),
    Provider(
        "vllm",
        "http://localhost:8000/v1",
        keyless=True,
        docs="https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html",
        notes="local server: no key unless started with --api-key (then give key_env)",
    ),
)

#: The built-in registry, by name (read-only).
PROVIDERS: Mapping[str, Provider] = types.MappingProxyType({p.name: p for p in _ENTRIES})


def _table(extra: Mapping[str, Provider] | None) -> Mapping[str, Provider]:
    return {**PROVIDERS, **extra} if extra else PROVIDERS


def lookup(name: str, extra: Mapping[str, Provider] | None = None) -> Provider | None:
    """The entry for `name`: a policy's own (`extra`) first, then the built-in one."""
    return _table(extra).get(name)


def known(extra: Mapping[str, Provider] | None = None) -> list[str]:
    """Every provider name, sorted."""
    return sorted(_table(extra))


def suggest(name: str, extra: Mapping[str, Provider] | None = None) -> str | None:
    """The known provider `name` is most likely a typo of (None if none is close)."""
    near = difflib.get_close_matches(str(name).lower(), known(extra), n=1, cutoff=0.6)
    return near[0] if near else None


def merge(
    name: str,
    *,
    base_url: str | None = None,
    key_envs: Iterable[str] | None = None,
    keyless: bool | None = None,
) -> Provider:
    """A policy's ``[providers.<name>]`` entry: the built-in one with the given
    fields replaced (quirks are kept), or a new provider."""
    old = PROVIDERS.get(name)
    if old is None:
        return Provider(
            name, base_url, tuple(key_envs or ()), bool(keyless), docs="the policy's own entry"
        )
    changes: dict[str, Any] = {}
    if base_url is not None:
        changes["base_url"] = base_url
    if key_envs is not None:
        changes["key_envs"] = tuple(key_envs)
    if keyless is not None:
        changes["keyless"] = keyless
    return attrs.evolve(old, **changes)


def _quirks(p: Provider) -> str:
    parts = [f"HTTP {s} is {k.value}" for s, k in sorted(p.status_kinds.items())]
    by_kind: dict[OutcomeKind, list[str]] = {}
    for code, kind in p.error_codes.items():
        by_kind.setdefault(kind, []).append(code)
    parts += [f"error {'/'.join(codes)} is {k.value}" for k, codes in by_kind.items()]
    if p.errors_in_2xx:
        parts.append("errors may come in a 200 reply")
    return "; ".join(parts)


def markdown_table(providers: Iterable[Provider] | None = None) -> str:
    """The registry as the README's Markdown table (one row per provider)."""
    rows = [
        "| provider | base_url | key variable | quirks classification reads |",
        "|---|---|---|---|",
    ]
    for p in providers if providers is not None else PROVIDERS.values():
        keys = ", ".join(f"`{k}`" for k in p.key_envs) or "none (keyless)"
        rows.append(f"| `{p.name}` | `{p.base_url}` | {keys} | {_quirks(p) or '-'} |")
    return "\n".join(rows) + "\n"
