"""Where a continuation meets the stream it continues: the repeat trimmed at the seam.

A provider that continues from an assistant prefix sometimes starts by repeating the
prefix's end. The repeat is dropped (`repeat`) when it is `SEAM_MIN` characters at least,
or the whole delivered text; while a continuation's first output may still be such a
repeat it is held (`may_repeat`). What is cut from a chunk's text is cut from what goes
with it: its logprobs (`past`, `drop_logprobs`) and content parts (`parts_past`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "SEAM_MIN",
    "SEAM_WINDOW",
    "drop_logprobs",
    "may_repeat",
    "part_text",
    "parts_past",
    "past",
    "repeat",
]

#: A continuation's text that repeats the end of what was delivered is trimmed at the
#: seam when the repeat is this many characters at least (or the whole delivered text):
#: a shorter match may be the answer itself (" the" after " the").
SEAM_MIN = 8
#: How much of the delivered text's end a repeat is looked for in (characters).
SEAM_WINDOW = 4096


def may_repeat(seam: str, said: str) -> bool:
    """Could `said` still be the start of a repeat of `seam`'s end (one not yet whole)?"""
    n = len(seam)
    at = seam.find(said)
    while at >= 0:
        if n - at > len(said) and (n - at >= SEAM_MIN or at == 0):
            return True
        at = seam.find(said, at + 1)
    return False


def repeat(seam: str, said: str) -> int:
    """How many of `said`'s first characters repeat `seam`'s end (0: none, or too few)."""
    for size in range(min(len(seam), len(said)), 0, -1):
        if (size >= SEAM_MIN or size == len(seam)) and seam.endswith(said[:size]):
            return size
    return 0


def drop_logprobs(choice: Any, cut: int) -> None:
    """Drop the first tokens of a chat `choice`'s logprobs that spell its content's first
    `cut` characters (`past`)."""
    logprobs: Any = getattr(choice, "logprobs", None)
    tokens = getattr(logprobs, "content", None)
    if cut > 0 and isinstance(tokens, list):
        logprobs.content = past(tokens, cut)


def past(tokens: list[Any], cut: int) -> list[Any]:
    """The logprobs of `tokens` after the first `cut` characters they spell (a token that
    straddles the cut goes too: it was not delivered whole)."""
    at = 0
    while at < len(tokens) and cut > 0:
        cut -= len(getattr(tokens[at], "token", "") or "")
        at += 1
    return tokens[at:]


def parts_past(parts: list[Any], cut: int) -> list[Any]:
    """Content `parts` less the first `cut` characters of their text (a text part cut
    away whole is dropped; other parts are kept)."""
    out = []
    for part in parts:
        text = part_text(part)
        if cut > 0 and text:
            if cut >= len(text):
                cut -= len(text)
                continue
            part, cut = {**part, "text": text[cut:]}, 0
        out.append(part)
    return out


def part_text(part: Any) -> str:
    """The text of one content part of a chat delta (``{"type": "text", "text": ...}``;
    a thinking part says no text)."""
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return str(part["text"])
    return ""
