"""Scrub secrets out of text before it reaches a trace, log or exception."""

from __future__ import annotations

import re
from collections.abc import Iterable

# Common API-key shapes: OpenAI/Anthropic style `sk-...`, bearer tokens, `key=` params.
_PATTERNS = re.compile(
    r"(sk-[A-Za-z0-9_\-]{6,})|(Bearer\s+[A-Za-z0-9_\-\.]{8,})|((?:api[_-]?key|token)=[^\s&\"']+)",
    re.IGNORECASE,
)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every known secret and every key-shaped token replaced by ``***``."""
    for s in secrets:
        if s and len(s) >= 4 and s in text:
            text = text.replace(s, "***")
    return _PATTERNS.sub("***", text)
