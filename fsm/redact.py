"""Scrub secrets out of text before it reaches a trace, log, exception or repr.

Three kinds of leak are handled, because providers and users produce all three:

- a key the policy knows, whole or in the pieces providers print when they echo a
  bad key (``sk-proj-****abcd``, ``sk-pr...abcd``, ``key ending in abcd``);
- anything shaped like a key, known or not (``sk-...``, ``gsk_...``, ``AIza...``, a
  long opaque token, ``Bearer ...``, ``api_key=...``, ``"api_key": "..."``);
- credentials inside a URL (``https://user:pass@host``, ``?key=...``): `safe_url`.

`scrub_exception` applies the same to an exception kept for the caller (its message,
its args and its text attributes such as an SDK error's ``body``), in place.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "MAX_TEXT",
    "looks_like_key",
    "redact",
    "safe_url",
    "scrub_data",
    "scrub_exception",
    "url_repr",
]

MASK = "***"
#: The longest text scrubbed whole (1 MiB of characters). Scrubbing is linear, but a
#: provider can answer with any size of body, and what is kept for a message, trace or
#: exception need not be larger: beyond this the text is cut (see `_bounded`).
MAX_TEXT = 1 << 20
_CUT = "...[{n} more characters cut]"

#: Prefixes that real API keys carry (OpenAI, Anthropic, OpenRouter, xAI, Groq,
#: Google, Hugging Face, Replicate, GitHub, NVIDIA, Cerebras, Fireworks, Perplexity,
#: Together, GitLab, Slack, Google OAuth).
_PREFIX = (
    r"(?:sk|pk|rk|ak)[-_]|xai-|gsk_|AIza|hf_|r8_|gh[pousr]_|github_pat_|nvapi-|csk-|fw_|"
    r"pplx-|tgp_v1_|glpat-|xox[abpr]-|ya29\."
)
_KEY_SHAPED = re.compile(rf"(?<![A-Za-z0-9])(?:{_PREFIX})[A-Za-z0-9_\-.]{{6,}}")
#: A long opaque token: 24+ letters and digits in one run, and what is joined to it
#: (Z.AI's ``<32 hex>.<secret>``, Azure's 32 hex digits).
_OPAQUE = re.compile(
    r"(?<![A-Za-z0-9])(?=[A-Za-z]*[0-9])(?=[0-9]*[A-Za-z])[A-Za-z0-9]{24,}(?:[._\-][A-Za-z0-9]+)*"
)
_BEARER = re.compile(r"(Bearer\s+)[^\s\"',]{4,}", re.IGNORECASE)
_SECRET_NAMES = (
    r"api[_-]?key|apikey|x-api-key|key|token|access[_-]?token|secret|password|sig|signature"
)
#: ``?key=...``, ``&api_key=...`` in URLs and form bodies.
_PARAM = re.compile(rf"([?&;](?:{_SECRET_NAMES})=)[^\s&#\"']+", re.IGNORECASE)
#: ``"api_key": "..."``, ``api-key: ...``, ``token=...`` in echoed JSON, headers, text.
_FIELD = re.compile(
    r"((?:api[_-]?key|apikey|x-api-key|access[_-]?token|secret|password|token)"
    r"[\"']?\s*[:=]\s*[\"']?)([^\s\"',}&]{4,})",
    re.IGNORECASE,
)
#: The scheme is anchored at the start of its run and taken possessively: with a bare
#: ``\b`` a run like ``x-x-x-...`` retried the scheme at every boundary (quadratic).
_USERINFO = re.compile(r"((?<![A-Za-z0-9+.\-_])[A-Za-z][A-Za-z0-9+.\-]*+://)[^/\s@?#]++@")
#: A token that prints part of a key with the rest masked: ``sk-proj-****abcd``,
#: ``sk-ab...wxyz``, ``sk-ab…wxyz``, ``••••abcd``, ``sk-abc****``. Every run is
#: anchored at its start (a lookbehind) and taken possessively, so a long run of key
#: characters, stars or bullets is read once, not once per starting position: linear.
_W = r"[A-Za-z0-9_\-]"
_MASKED = re.compile(
    rf"(?<!{_W}){_W}++(?:(?:\*{{2,}}+|•{{2,}}+|…|\.{{3}}){_W}{{2,}}+|(?<={_W}{{2}})(?:\*{{3,}}+|•{{3,}}+))"
    rf"|(?:(?<!\*)\*{{4,}}+|(?<!•)•{{3,}}+|…|\.{{3}}){_W}{{4,}}+"
)
_TOKEN = re.compile(r"[A-Za-z0-9_\-]{4,}")


def looks_like_key(text: str) -> bool:
    """Is there anything shaped like an API key in `text`?"""
    return bool(_KEY_SHAPED.search(text) or _OPAQUE.search(text) or _BEARER.search(text))


def _pieces(secrets: Iterable[str]) -> list[str]:
    return [s for s in secrets if isinstance(s, str) and len(s) >= 4]


def _bounded(text: str) -> str:
    """`text` cut to `MAX_TEXT` characters, with the run of non-blank characters the cut
    went through dropped too (half a key would no longer look like one)."""
    if len(text) <= MAX_TEXT:
        return text
    head = text[:MAX_TEXT]
    blank = max(head.rfind(c, MAX_TEXT - 512) for c in " \t\r\n\"',")
    if blank > 0:
        head = head[: blank + 1]
    return head + _CUT.format(n=len(text) - len(head))


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every known secret (whole or in printed pieces), every key-shaped
    token and every credential inside a URL replaced by ``***``.

    Linear in the length of `text` (every pattern anchors its runs), and a text
    longer than `MAX_TEXT` is cut first, so no reply can make scrubbing costly."""
    known = _pieces(secrets)
    text = _bounded(text)
    for s in sorted(known, key=len, reverse=True):
        if s in text:
            text = text.replace(s, MASK)
    text = _MASKED.sub(MASK, text)
    text = _USERINFO.sub(rf"\1{MASK}@", text)
    text = _PARAM.sub(rf"\1{MASK}", text)
    text = _FIELD.sub(rf"\1{MASK}", text)
    text = _BEARER.sub(rf"\1{MASK}", text)
    text = _KEY_SHAPED.sub(MASK, text)
    text = _OPAQUE.sub(MASK, text)
    if not known:
        return text

    def fragment(m: re.Match[str]) -> str:
        tok = m.group(0)
        for s in known:
            if len(tok) >= 6 and tok in s and (len(tok) >= 12 or any(c.isdigit() for c in tok)):
                return MASK  # a run of a key's characters, printed without its mask
            if s.endswith(tok) or (len(tok) >= 6 and s.startswith(tok)):
                return MASK  # "ending in abcd", "starts hunter": what providers quote
        return tok

    return _TOKEN.sub(fragment, text)


def safe_url(url: Any) -> Any:
    """`url` without credentials: no ``user:pass@``, no secret query values, no
    key-shaped path segment. Anything that is not a string is returned as is."""
    if not isinstance(url, str):
        return url
    return redact(url)


def url_repr(url: Any) -> str:
    """``repr`` of a URL without its credentials (an attrs field's ``repr=``)."""
    return repr(safe_url(url))


def scrub_data(value: Any, secrets: Iterable[str] = ()) -> Any:
    """Parsed JSON (or any nest of dicts, lists and strings) with every string, keys
    included, `redact`-ed: the text as the reader sees it, escapes decoded."""
    return _scrub_value(value, _pieces(secrets))


def _scrub_value(value: Any, secrets: list[str], depth: int = 0) -> Any:
    if depth > 20:
        return value
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, Mapping):
        return {
            (redact(k, secrets) if isinstance(k, str) else k): _scrub_value(v, secrets, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        items = [_scrub_value(v, secrets, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def scrub_exception(error: BaseException, secrets: Iterable[str] = ()) -> BaseException:
    """Scrub `error` in place, with its causes: its args (what ``str`` and ``repr``
    show) and the text, dict and list attributes it carries (an SDK error's
    ``message``, ``body``, ``code``...). Objects such as an HTTP response are left."""
    known = _pieces(secrets)
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        todo += [e.__cause__, e.__context__]
        try:
            e.args = tuple(_scrub_value(a, known) for a in e.args)
        except (AttributeError, TypeError):  # pragma: no cover - an exotic exception type
            pass
        attrs_of = getattr(e, "__dict__", None)
        if not isinstance(attrs_of, dict):
            continue
        for name, value in list(attrs_of.items()):
            if isinstance(value, BaseException):
                todo.append(value)
            elif isinstance(value, str | Mapping | list | tuple):
                try:
                    setattr(e, name, _scrub_value(value, known))
                except (AttributeError, TypeError):  # pragma: no cover - read-only attribute
                    pass
    return error
