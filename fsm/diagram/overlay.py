"""Two paths of one turn in one picture (``--trace A --trace B``): what only the overlay draws.

A single path is drawn in one colour with plain step numbers; an overlay must also
say which path took each edge and visited each state, and show what both took in
both colours, in Mermaid (which cannot colour a state diagram's edges, hence the
per-path numerals ① and ❶) and in DOT. The renderers in `fsm.diagram.render` call these
helpers when the graph holds more than one path; nothing here is public.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from .graph import DiagramGraph, Edge
from .paths import DiagramPath, Step
from .style import INK, PATH_STYLES, coloured, dot_html, dot_string, fmt_seconds, step_marker


def _step_groups(steps: Sequence[Step]) -> list[list[Step]]:
    """An overlay edge's steps that read alike (event, guard, wait), in order of first
    appearance: each group is one label line, ``③⑤❸ waited``, not three."""
    groups: dict[tuple[str, str, float | None], list[Step]] = {}
    for st in steps:
        groups.setdefault((st.event, st.guard, st.wait), []).append(st)
    return list(groups.values())


def _group_lines(group: Sequence[Step]) -> list[str]:
    lines = group[0].lines()
    lines[0] = "".join(st.marker() for st in group) + " " + group[0].event
    return lines


def overlay_edge_lines(e: Edge) -> list[str]:
    """A taken edge's label in an overlay: one line per group of steps that read alike."""
    return [ln for group in _step_groups(e.steps) for ln in _group_lines(group)]


# -- Mermaid ------------------------------------------------------------------------------------


def overlay_mermaid_classes(g: DiagramGraph) -> list[str]:
    """The visited states' classes of an overlay: ``path1``, ``path2`` for a state one
    path visited and ``both`` (the first path's fill, the second's border) for one both
    visited."""
    ids = g.ids
    members: dict[str, list[str]] = {}
    for k in g.nodes:
        if k in g.visited:
            by = g.visited[k]
            name = "both" if len(by) > 1 else f"path{next(iter(by)) + 1}"
            members.setdefault(name, []).append(ids[k])
    first, second = PATH_STYLES[0], PATH_STYLES[1]
    styles = {f"path{i}": (st.fill, st.colour) for i, st in enumerate(PATH_STYLES, 1)}
    styles["both"] = (first.fill, second.colour)
    out = []
    for name, (fill, stroke) in styles.items():
        if name in members:
            out.append(
                f"    classDef {name} fill:{fill},stroke:{stroke},stroke-width:3px,font-weight:bold"
            )
            out.append(f"    class {','.join(members[name])} {name}")
    return out


def overlay_mermaid_legend(g: DiagramGraph) -> list[str]:
    """The legend of an overlay's Mermaid note: after each path's line, what the shared
    colours mean."""
    legend = list(g.legend)
    legend.insert(
        len(g.paths),
        f"a state both paths visited: {PATH_STYLES[0].name} fill, "
        f"{PATH_STYLES[1].name} border; an edge both took lists both paths' steps",
    )
    return legend


# -- Markdown -----------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def overlay_table(paths: Sequence[DiagramPath]) -> list[str]:
    """The paths compared in one Markdown table: numerals, steps, end, time, requests."""
    parts = [
        "| path | numerals | steps | ends | at | requests | waited |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for p in paths:
        parts.append(
            f"| {_md_cell(p.label or '')} ({p.style.name}) | {p.numerals()} | "
            f"{len(p.steps)} | {p.steps[-1].dest} | {fmt_seconds(p.seconds)} | "
            f"{p.requests} | {fmt_seconds(p.waited)} |"
        )
    parts.append("")
    return parts


def overlay_heading(p: DiagramPath) -> list[str]:
    """The heading over one path's steps table: its first numeral, label and colour."""
    return [f"**{p.style.digits[0]} {_md_cell(p.label or '')}** ({p.style.name})", ""]


# -- Graphviz DOT -------------------------------------------------------------------------------


def overlay_edge_style(e: Edge) -> str:
    """An edge of an overlay: in the colour of the path that took it, or, taken by both,
    both colours side by side, each step's numeral in its path's colour."""
    paths = sorted({st.path for st in e.steps})
    if len(paths) == 1:
        c = PATH_STYLES[paths[0]].colour
        label = dot_string("\n".join(overlay_edge_lines(e)))
        return f'label={label}, color="{c}", fontcolor="{c}", penwidth=3.5'
    html = []
    for group in _step_groups(e.steps):
        mine = {st.path for st in group}
        ink = PATH_STYLES[group[0].path].colour if len(mine) == 1 else INK
        marks = "".join(
            f'<font color="{PATH_STYLES[st.path].colour}">{dot_html(st.marker())}</font>'
            for st in group
        )
        first, *rest = _group_lines(group)
        event = first.split(" ", 1)[1]
        html.append(f'{marks}<font color="{ink}"> {dot_html(event)}</font><br/>')
        if rest:
            html.append(coloured(ink, rest))
    colours = ":".join(PATH_STYLES[p].colour for p in paths)
    return f'label=<{"".join(html)}>, color="{colours}", fontcolor="{INK}", penwidth=2.5'


def overlay_node_attrs(by: dict[int, tuple[int, ...]]) -> str:
    """A state of an overlay, given the step numbers each path arrived with: in that
    path's colour, or, visited by both, the first path's fill and the second's border;
    its xlabel lists each path's arrivals in that path's numerals and colour."""
    first, last = PATH_STYLES[min(by)], PATH_STYLES[max(by)]
    ink = first.colour if len(by) == 1 else INK
    attrs_ = f'fillcolor="{first.fill}", color="{last.colour}", penwidth=3, fontcolor="{ink}"'
    marks = " ".join(
        coloured(PATH_STYLES[p].colour, ["".join(step_marker(x, p) for x in nums)], "none")
        for p, nums in by.items()
        if nums
    )
    return attrs_ + (f", xlabel=<{marks}>" if marks else "")


def overlay_legend(g: DiagramGraph) -> str:
    """The legend of an overlay as an HTML-like label: each path's line in its colour."""
    first, second = PATH_STYLES[0], PATH_STYLES[1]
    shared = (
        f"a state both paths visited: {first.name} fill, {second.name} border; "
        "an edge both took: both colours side by side"
    )
    entries = [(p.style.colour, g.legend[i]) for i, p in enumerate(g.paths)]
    entries.append((INK, shared))
    entries += [(INK, x) for x in g.legend[len(g.paths) :]]
    return "".join(
        coloured(
            colour,
            textwrap.wrap(text, 64, subsequent_indent="    ", break_on_hyphens=False),
            "left",
        )
        for colour, text in entries
    )
