"""How the diagrams look: colours, each overlaid path's style and numerals, label escaping.

Shared by the full diagram (`fsm.diagram.render`), its two-path overlay (`fsm.diagram.overlay`) and
the compact overview (`fsm.diagram.overview`), so the pictures read the same way and one
escaping rule serves each output language (Mermaid labels, DOT strings and HTML-like
labels).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import attrs

from ..core.machine import ABORTED, DONE, FAILED

_CIRCLED: Final = "".join(chr(c) for c in range(0x2460, 0x2474))  # (1) .. (20)
#: A second path's numerals: negative circled 1 .. 20.
_NEGATIVE_CIRCLED: Final = "".join(chr(c) for c in (*range(0x2776, 0x2780), *range(0x24EB, 0x24F5)))

# Colours (shared by both renderers so the two pictures read the same way).
TAKEN: Final = "#e8590c"
TAKEN_FILL: Final = "#fff3bf"
FALLBACK: Final = "#1c7ed6"
FAIL: Final = "#c92a2a"
FINISH: Final = "#2f9e44"
PLAIN: Final = "#868e96"
TERMINAL_FILL: Final = {DONE: "#d3f9d8", FAILED: "#ffe3e3", ABORTED: "#e9ecef"}
INK: Final = "#212529"


@attrs.frozen(slots=True)
class PathStyle:
    """How one overlaid path is drawn: its colour, its states' fill, its numerals."""

    name: str
    colour: str
    fill: str
    digits: str
    brackets: str  # around a step number past the numerals: "()", "[]"


#: One style per path of an overlay, in order; the first is the single-path highlight.
PATH_STYLES: Final = (
    PathStyle("orange", TAKEN, TAKEN_FILL, _CIRCLED, "()"),
    PathStyle("violet", "#7048e8", "#e5dbff", _NEGATIVE_CIRCLED, "[]"),
)

#: The most paths one picture overlays. Each needs a colour apart from the others and
#: from the machine's own (grey, blue, red, green), and numerals that tell its steps
#: apart without colour, because Mermaid's state diagrams cannot colour an edge: ① and ❶
#: are the two numbered series the diagram font (DejaVu Sans) draws. A third path would
#: also stack a third set of labels on every shared edge, past reading.
MAX_PATHS: Final = len(PATH_STYLES)


def step_marker(n: int, path: int = 0) -> str:
    """Step `n` of path `path` in that path's numerals: ①, ❶; past them (21), [21]."""
    style = PATH_STYLES[path]
    if 1 <= n <= len(style.digits):
        return style.digits[n - 1]
    return f"{style.brackets[0]}{n}{style.brackets[1]}"


def fmt_seconds(x: float) -> str:
    if x >= 10:
        return f"{x:.0f}s"
    if x >= 0.01 or x == 0:
        return f"{x:.2f}s".replace(".00s", "s")
    return f"{x * 1000:.1f}ms"


#: Characters the Mermaid parser or HTML would eat, and what a label says instead. One pass,
#: so the ``#`` and ``;`` of an entity just written are never escaped again.
_MERMAID_ESCAPES: Final = str.maketrans(
    {
        "#": "#35;",
        "&": "#38;",  # else HTML reads "&lt;" in a name as "<"
        '"': "#quot;",
        ";": "#59;",
        "<": "#lt;",
        ">": "#gt;",
        "%": "#37;",
        "{": "#123;",
        "}": "#125;",
    }
)


def mermaid_text(text: str) -> str:
    """Text safe inside a Mermaid label (entity codes for what the parser or HTML would eat)."""
    return text.translate(_MERMAID_ESCAPES)


def dot_string(text: str) -> str:
    """A DOT double-quoted string; newlines become centred line breaks."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def dot_html(text: str) -> str:
    """Text safe inside a DOT HTML-like label."""
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


def coloured(colour: str, lines: Iterable[str], align: str = "") -> str:
    """HTML-like label lines in one colour (`align`: ``left`` for a left-justified block,
    ``none`` for text with no line break)."""
    br = {"": "<br/>", "none": ""}.get(align, f'<br align="{align}"/>')
    return f'<font color="{colour}">' + "".join(dot_html(x) + br for x in lines) + "</font>"
