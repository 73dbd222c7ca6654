"""Well-known OpenAI-compatible providers, as data: where each one lives, which
environment variables hold its keys, and what its error replies say that the
HTTP status alone does not.

Pure data and lookup (no I/O, no environment reads). `fsm.policy.model` uses it to
make every target's endpoint and credentials explicit; `providers.openai.exceptions`
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

from ..kinds import OutcomeKind
from ..redact import safe_url, url_repr

__all__ = [
    "PREFIX_STYLES",
    "PROVIDERS",
    "Provider",
    "known",
    "lookup",
    "markdown_table",
    "merge",
    "suggest",
]

_O = OutcomeKind

#: How a continuation request marks the delivered text (`Provider.prefix_style`).
PREFIX_STYLES = ("trailing", "flag", "vllm")


def _frozen_map(value: Mapping[Any, OutcomeKind] | None) -> Mapping[Any, OutcomeKind]:
    return types.MappingProxyType(dict(value or {}))


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@attrs.frozen(slots=True)
class Provider:
    """One OpenAI-compatible provider.

    Resolution (`fsm.policy.model`): a target of this provider that gives no
    ``base_url`` gets `base_url`; one that gives no credential gets a pool of
    `key_envs` (read at use time), or none at all when `keyless`.

    Classification quirks (`fsm.catalogue.classify`), consulted before the generic
    status table:

    - `error_codes`: the value of the error object's ``code``, ``type`` or
      ``status`` field (as a string) -> outcome, for providers whose error
      bodies carry a more precise code than their HTTP status;
    - `status_kinds`: an HTTP status that means something else at this provider.

    `errors_in_2xx` and `notes` describe further behaviour for people (the
    table in docs/policy.md, ``fallgate providers``); `docs` is where the entry was checked.
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
    #: A broken stream may be continued here: a request whose last message is the
    #: assistant's delivered text is answered with the rest of it (`prefix_style` says
    #: how that message is marked). What a target of this provider does unless its entry
    #: says ``assistant_prefix``.
    assistant_prefix: bool = False
    #: How a continuation marks the delivered text (`PREFIX_STYLES`): ``"trailing"``, a
    #: last assistant message; ``"flag"``, that message with ``"prefix": true`` (DeepSeek
    #: beta, Mistral); ``"vllm"``, ``continue_final_message`` in the body.
    prefix_style: str = "trailing"
    #: Which rate-limit headers its replies carry (`fsm.catalogue.ratelimit.DIALECTS`;
    #: None: not documented, every dialect is read), and where that is documented.
    ratelimit: str | None = None
    ratelimit_docs: str = ""

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
            "assistant_prefix": self.assistant_prefix,
            "prefix_style": self.prefix_style,
            "ratelimit": self.ratelimit,
            "ratelimit_docs": self.ratelimit_docs,
        }


_ENTRIES = (
    Provider(
        "openai",
        "https://api.openai.com/v1",
        "OPENAI_API_KEY",
        docs="the openai SDK's own default (openai-python, lib/_client_auth.py)",
        notes="429 insufficient_quota is quota (generic rule)",
        ratelimit="openai",
        ratelimit_docs=(
            "https://platform.openai.com/docs/guides/rate-limits (rate limits in headers: "
            "x-ratelimit-*-requests/-tokens, reset as a duration such as 1s, 6m0s, 20ms)"
        ),
    ),
    Provider(
        "openrouter",
        "https://openrouter.ai/api/v1",
        "OPENROUTER_API_KEY",
        docs="https://openrouter.ai/docs/quickstart, https://openrouter.ai/docs/errors",
        # "403: Your chosen model requires moderation and your input was flagged"
        status_kinds={403: _O.CONTENT_FILTERED},
        errors_in_2xx=True,
        # the API reference's "Assistant Prefill": a last assistant message is completed
        # by the model (https://openrouter.ai/docs); a routed model that does not take it
        # answers 400, which fallgate never shows in place of the cut
        assistant_prefix=True,
        notes="once the model has started, errors arrive in a 200 body or as an SSE "
        "event whose error.code is the HTTP status",
        ratelimit="openrouter",
        ratelimit_docs=(
            "https://openrouter.ai/docs/api-reference/limits "
            "(X-RateLimit-Limit/-Remaining/-Reset, the reset a Unix time in ms)"
        ),
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
            "1261": _O.CONTEXT_TOO_LONG,  # "Prompt exceeds max length"
            "1308": _O.QUOTA,  # the plan's 5-hour usage limit, with its reset time
            "1310": _O.QUOTA,  # the plan's weekly/monthly limit, with its reset time
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
        ratelimit="openai",
        ratelimit_docs=(
            "https://console.groq.com/docs/rate-limits (x-ratelimit-*-requests (per day) and "
            "-tokens (per minute), reset as a duration such as 2m59.56s, 7.66s)"
        ),
    ),
    Provider(
        "deepseek",
        "https://api.deepseek.com",
        "DEEPSEEK_API_KEY",
        docs="https://api-docs.deepseek.com/, "
        "https://api-docs.deepseek.com/quick_start/error_codes",
        notes="402 insufficient balance, 503 server overloaded (generic rules); chat prefix "
        "completion needs base_url https://api.deepseek.com/beta: give that and "
        "assistant_prefix = true to continue broken streams there",
        # "Chat Prefix Completion (Beta)": the last message is the assistant's with
        # "prefix": true, on base_url https://api.deepseek.com/beta only
        # (https://api-docs.deepseek.com/news/news0725, the API guide's "Chat Prefix
        # Completion (Beta)"): off at the default base_url
        prefix_style="flag",
        ratelimit=None,
        ratelimit_docs=(
            "https://api-docs.deepseek.com/quick_start/rate_limit (DeepSeek does not constrain "
            "the rate: no rate-limit headers; every dialect is read in case a proxy adds some)"
        ),
    ),
    Provider(
        "together",
        "https://api.together.ai/v1",
        "TOGETHER_API_KEY",
        docs="https://docs.together.ai/docs/inference/openai-compatibility",
        ratelimit="together",
        ratelimit_docs=(
            "https://support.together.ai/en/articles/8988956-rate-limits (x-ratelimit-limit, "
            "x-ratelimit-remaining, x-ratelimit-reset: requests; x-tokenlimit-*: tokens)"
        ),
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
        # a last assistant message with "prefix": true is continued; without the flag
        # the chat API answers "Expected last role User or Tool (or Assistant with
        # prefix True)" (third-party: https://docs.litellm.ai/docs/completion/prefix)
        assistant_prefix=True,
        prefix_style="flag",
    ),
    Provider(
        "gemini",
        "https://generativelanguage.googleapis.com/v1beta/openai",
        "GEMINI_API_KEY",
        docs="https://ai.google.dev/gemini-api/docs/openai",
        error_codes={"UNAVAILABLE": _O.OVERLOADED},
        notes="429 RESOURCE_EXHAUSTED covers per-minute and per-day quotas alike: the "
        "QuotaFailure quota id tells them apart (generic rules, fsm.catalogue.error_body); "
        "a bad key "
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
        notes="529 overloaded; the compatibility layer is meant for testing, not production; "
        "Claude 4.6+ refuses an assistant prefill (400): a broken stream then goes to the "
        "next target that continues, or fails with the cut",
        # prefill: a last assistant message is continued
        # (https://docs.anthropic.com/en/docs/build-with-claude/prompt-engineering/prefill-claudes-response)
        assistant_prefix=True,
        ratelimit="anthropic",
        ratelimit_docs=(
            "https://docs.anthropic.com/en/api/rate-limits "
            "(anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-"
            "{limit,remaining,reset}, "
            "reset in RFC 3339)"
        ),
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
        notes="local server: no key unless started with --api-key (then give key_env); "
        "continues a stream with continue_final_message",
        # extra chat parameters continue_final_message = true, add_generation_prompt = false:
        # "the model will continue this message rather than starting a new one"
        # (https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html)
        assistant_prefix=True,
        prefix_style="vllm",
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
    """The registry as docs/policy.md's Markdown table (one row per provider)."""
    rows = [
        "| provider | base_url | key variable | quirks classification reads |",
        "|---|---|---|---|",
    ]
    for p in providers if providers is not None else PROVIDERS.values():
        keys = ", ".join(f"`{k}`" for k in p.key_envs) or "none (keyless)"
        rows.append(f"| `{p.name}` | `{p.base_url}` | {keys} | {_quirks(p) or '-'} |")
    return "\n".join(rows) + "\n"
