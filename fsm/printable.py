"""Text from outside (trace ids, model names, error bodies) made safe for a terminal.

A trace id or a model name is whatever a caller or a recording said: an ESC sequence
in one would clear the screen, move the cursor or retitle the window when a command
prints it. `printable` escapes every control and format character (``\\x1b``,
``\\u202e``...) as Python would write it, and keeps newlines (and tabs) where asked.
"""

from __future__ import annotations

import unicodedata

__all__ = ["printable"]

_SAFE_CONTROLS = frozenset("\n\t")


def _escape(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def printable(text: str, keep: frozenset[str] = _SAFE_CONTROLS) -> str:
    """`text` with each control/format/separator character other than `keep` escaped."""
    if text.isprintable():
        return text  # the common case, one pass in C
    return "".join(
        c
        if c in keep or c == " " or not unicodedata.category(c).startswith(("C", "Z"))
        else _escape(c)
        for c in text
    )
