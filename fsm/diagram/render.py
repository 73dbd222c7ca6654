"""Draw a declared turn machine as Mermaid or Graphviz DOT, optionally with a turn's path.

Pure: functions take a `Declaration` (and optionally a trace) and return
text. The picture is read off the declaration, so it always shows the
user's actual chain and guards:

* each target's phase states are grouped (a Mermaid composite state, a DOT
  cluster) under the target's name, provider and model — never a key;
* all triggers between the same two states collapse into one edge whose
  label lists them, grouped by guard (`[...]`); ``otherwise`` marks the
  last-resort candidate of a group that has guarded alternatives;
* the `cancelled -> aborted` edge that every running state has is drawn once;
* with a trace, the states visited and the edges taken are highlighted, and
  each taken edge is labelled with its step numbers, in order;
* with two traces (``traces=[...]``, e.g. a turn as recorded and as replayed under
  another policy) both paths are overlaid, each in its colour with its own
  numerals (① …, ❶ …), and what both took is drawn in both colours; a legend
  names each path and says where it ended.

The pieces live apart: `fsm.diagram.paths` checks a trace against the machine,
`fsm.diagram.graph` computes the boxes, edges and legend once, `fsm.diagram.style`
holds the colours and escaping, `fsm.diagram.overlay` what only a two-path picture draws;
this module renders them.

`fsm.diagram.overview.to_mermaid_overview` is the compact picture for a README: the
primary's phases in full, every other target as one box in chain order.

Mermaid state ids are generated (``s_<name>``, only ``[A-Za-z0-9_]``) and
the real names shown through ``state "label" as id``, so names with dots,
dashes or reserved words (``end``, ``state``) cannot break the parser.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import Final

from ..core.machine import ABORTED, CANCELLED, DONE, FAILED, IDLE, Declaration
from ..trace import TraceEvent
from .graph import Edge, build_graph
from .overlay import (
    overlay_edge_lines,
    overlay_edge_style,
    overlay_heading,
    overlay_legend,
    overlay_mermaid_classes,
    overlay_mermaid_legend,
    overlay_node_attrs,
    overlay_table,
)
from .paths import DiagramError, Step, TracePath, Traces, drawn_paths, path_steps
from .style import (
    FAIL,
    FALLBACK,
    FINISH,
    MAX_PATHS,
    PLAIN,
    TAKEN,
    TAKEN_FILL,
    TERMINAL_FILL,
    dot_string,
    fmt_seconds,
    mermaid_text,
)

__all__ = [
    "MAX_PATHS",
    "DiagramError",
    "Step",
    "TracePath",
    "path_steps",
    "to_dot",
    "to_markdown",
    "to_mermaid",
]


_EDGE_STYLE: Final = {
    "plain": f'color="{PLAIN}", fontcolor="#495057"',
    "fallback": f'color="{FALLBACK}", fontcolor="{FALLBACK}", penwidth=1.5',
    "fail": f'color="{FAIL}", fontcolor="{FAIL}", style=dashed',
    "finish": f'color="{FINISH}", fontcolor="{FINISH}"',
    "cancel": f'color="{PLAIN}", fontcolor="{PLAIN}", style=dotted',
}


# -- Mermaid ------------------------------------------------------------------------------------


def _edge_label(e: Edge, overlay: bool = False) -> list[str]:
    if overlay and e.steps:
        return overlay_edge_lines(e)
    return [ln for st in e.steps for ln in st.lines()] if e.steps else list(e.lines)


def to_mermaid(
    decl: Declaration,
    trace: Iterable[TraceEvent] | None = None,
    *,
    traces: Traces | None = None,
    title: str | None = None,
) -> str:
    """The machine as a Mermaid ``stateDiagram-v2``.

    With `trace` the path is highlighted; with `traces` (up to `MAX_PATHS`) the paths
    are overlaid: a state's colour says which path visited it (``both``: the first
    path's fill, the second's border) and each edge lists every path's steps in that
    path's numerals (Mermaid cannot colour a state diagram's edges).
    """
    g = build_graph(decl, drawn_paths(decl, trace, traces), title)
    ids = g.ids
    out = ["stateDiagram-v2", f"    %% {mermaid_text(g.title)}", "    direction LR"]
    for key, node in g.nodes.items():
        if node.group is None:
            out.append(f'    state "{mermaid_text(node.label)}" as {ids[key]}')
    for grp in g.groups:
        out.append(f'    state "{mermaid_text(grp.title)}" as g_{grp.target} {{')
        for key in grp.nodes:
            out.append(f'        state "{mermaid_text(g.nodes[key].label)}" as {ids[key]}')
        out.append("    }")
    out.append(f"    [*] --> {ids[IDLE]}")
    for e in g.edges:
        label = "<br/>".join(mermaid_text(x) for x in _edge_label(e, g.overlay))
        out.append(f"    {ids[e.source]} --> {ids[e.dest]} : {label}")
    if g.cancel_sources:
        out.append(
            f"    {ids[IDLE]} --> {ids[ABORTED]} : "
            f"{mermaid_text(CANCELLED)} (from any running state)"
        )
    legend = overlay_mermaid_legend(g) if g.overlay else list(g.legend)
    out.append(f"    note right of {ids[IDLE]}")
    out += [f"        {mermaid_text(x.strip()).replace(':', '#58;')}" for x in legend]
    out.append("    end note")
    styles = {
        DONE: f"fill:{TERMINAL_FILL[DONE]},stroke:{FINISH},stroke-width:2px",
        FAILED: f"fill:{TERMINAL_FILL[FAILED]},stroke:{FAIL},stroke-width:2px",
        ABORTED: f"fill:{TERMINAL_FILL[ABORTED]},stroke:{PLAIN},stroke-width:2px",
    }
    for name, style in styles.items():
        members = [ids[k] for k, n in g.nodes.items() if n.state == name and k not in g.visited]
        if members:
            out.append(f"    classDef {name} {style}")
            out.append(f"    class {','.join(members)} {name}")
    if g.visited and g.overlay:
        out += overlay_mermaid_classes(g)
    elif g.visited:
        out += [
            f"    classDef taken fill:{TAKEN_FILL},stroke:{TAKEN},stroke-width:3px,"
            "font-weight:bold",
            f"    class {','.join(ids[k] for k in g.nodes if k in g.visited)} taken",
        ]
    return "\n".join(out) + "\n"


def to_markdown(
    decl: Declaration,
    trace: Iterable[TraceEvent] | None = None,
    *,
    traces: Traces | None = None,
    title: str | None = None,
    intro: str = "",
) -> str:
    """A Markdown page with the Mermaid diagram in a fence (renders on GitHub), then each
    path's steps as a table (an overlay first compares the paths in one table)."""
    events = list(trace) if trace is not None else None
    given = [t if isinstance(t, TracePath) else tuple(t) for t in traces] if traces else traces
    paths = drawn_paths(decl, events, given)
    g = build_graph(decl, paths, title)
    parts = [f"# {g.title}", ""]
    if intro:
        parts += [intro.strip(), ""]
    mermaid = to_mermaid(decl, events, traces=given, title=title).rstrip("\n")
    parts += ["```mermaid", mermaid, "```", ""]
    if g.overlay:
        parts += overlay_table(paths)
    for p in paths:
        if not p.steps:
            continue
        if g.overlay:
            parts += overlay_heading(p)
        parts += ["| step | from | event | to | wait |", "|---:|---|---|---|---:|"]
        for st in p.steps:
            wait = fmt_seconds(st.wait) if st.wait is not None else ""
            n = st.marker() if g.overlay else str(st.n)
            parts.append(f"| {n} | {st.source} | {st.event} | {st.dest} | {wait} |")
        parts.append("")
    return "\n".join(parts)


# -- Graphviz DOT -------------------------------------------------------------------------------


def to_dot(
    decl: Declaration,
    trace: Iterable[TraceEvent] | None = None,
    *,
    traces: Traces | None = None,
    title: str | None = None,
) -> str:
    """The machine as Graphviz DOT: a path highlighted when `trace` is given, paths
    overlaid with `traces` (each in its colour; both colours side by side on an edge
    both took; a state both visited has the first path's fill and the second's border)."""
    g = build_graph(decl, drawn_paths(decl, trace, traces), title)
    ids = g.ids
    font = "DejaVu Sans"
    out = [
        "digraph fallgate {",
        "    graph [rankdir=TB, compound=true, newrank=true, "
        f"fontname={dot_string(font)}, fontsize=16,",
        f"           labelloc=t, label={dot_string(g.title)}, nodesep=0.3, ranksep=0.45, pad=0.3];",
        '    node [shape=box, style="rounded,filled", fillcolor="#ffffff", color="#495057",',
        f"          fontname={dot_string(font)}, fontsize=11];",
        f"    edge [fontname={dot_string(font)}, fontsize=9, arrowsize=0.7];",
    ]

    def node(key: str, indent: str) -> str:
        n = g.nodes[key]
        a = [f"label={dot_string(n.label)}"]
        if n.state in TERMINAL_FILL:
            a.append(f'fillcolor="{TERMINAL_FILL[n.state]}", penwidth=2')
        if n.state == IDLE:
            a.append("shape=ellipse")
        if key in g.visited and g.overlay:
            a.append(overlay_node_attrs(g.visited[key]))
        elif key in g.visited:
            a.append(f'fillcolor="{TAKEN_FILL}", color="{TAKEN}", penwidth=3, fontcolor="{TAKEN}"')
            if g.visited[key][0]:
                a.append(f"xlabel={dot_string(','.join(str(x) for x in g.visited[key][0]))}")
        return f"{indent}{ids[key]} [{', '.join(a)}];"

    out.append("    subgraph cluster_running {")
    out.append(f'        label=""; style="dashed,rounded"; color="{PLAIN}";')
    out.append(node(IDLE, "        "))
    for grp in g.groups:
        out.append(f"        subgraph cluster_t{grp.target} {{")
        out.append(
            f"            label={dot_string(grp.title)}; labeljust=l; fontsize=13; "
            'style="rounded,filled"; fillcolor="#f1f3f5"; color="#adb5bd";'
        )
        for key in grp.nodes:
            out.append(node(key, "            "))
        out.append("        }")
    out.append("    }")
    for key, n in g.nodes.items():
        if n.group is None and key != IDLE:
            out.append(node(key, "    "))

    # Stack the targets' boxes: every node of box i sits above box i+1's entry state.
    for grp, nxt in zip(g.groups, g.groups[1:], strict=False):
        entry = ids[decl.policy.targets[nxt.target].name]
        for key in grp.nodes[1:]:
            out.append(f"    {ids[key]} -> {entry} [style=invis, weight=0];")
    for e in g.edges:
        if e.steps and g.overlay:
            out.append(f"    {ids[e.source]} -> {ids[e.dest]} [{overlay_edge_style(e)}];")
            continue
        if e.steps:
            style = f'color="{TAKEN}", fontcolor="{TAKEN}", penwidth=3.5'
        else:
            style = _EDGE_STYLE[e.kind]
        label = "\n".join(_edge_label(e))
        out.append(f"    {ids[e.source]} -> {ids[e.dest]} [label={dot_string(label)}, {style}];")
    if g.cancel_sources:
        out.append(
            f"    {ids[IDLE]} -> {ids[ABORTED]} [ltail=cluster_running, "
            f"label={dot_string(CANCELLED + ' (from any running state)')}, "
            f"{_EDGE_STYLE['cancel']}];"
        )
    if g.overlay:
        out.append(
            '    legend [shape=note, style=filled, fillcolor="#fff9db", fontsize=10, '
            f"label=<{overlay_legend(g)}>];"
        )
    else:
        legend = "".join(
            dot_string(line)[1:-1] + "\\l"
            for entry in g.legend
            for line in textwrap.wrap(entry, 64, subsequent_indent="    ", break_on_hyphens=False)
        )
        out.append(
            '    legend [shape=note, style=filled, fillcolor="#fff9db", fontsize=10, '
            f'label="{legend}"];'
        )
    out.append("}")
    return "\n".join(out) + "\n"
