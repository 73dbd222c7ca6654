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
  each taken edge is labelled with its step numbers, in order.

`to_mermaid_overview` is the compact picture for a README: the primary's phases
in full, every other target as one box in chain order (see its docstring).

Mermaid state ids are generated (``s_<name>``, only ``[A-Za-z0-9_]``) and
the real names shown through ``state "label" as id``, so names with dots,
dashes or reserved words (``end``, ``state``) cannot break the parser.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable, Sequence
from typing import Final

import attrs

from .guards import RESET_STREAK, SOONEST_IS, observation_text
from .machine import (
    ABORTED,
    CANCELLED,
    DONE,
    FAILED,
    IDLE,
    START,
    Declaration,
    Transition,
)
from .policy import Policy
from .trace import TraceEvent
from .traits import FAULT_KINDS, TRAITS, Phase

__all__ = [
    "DiagramError",
    "Step",
    "path_steps",
    "to_dot",
    "to_markdown",
    "to_mermaid",
]

#: Short name for the set of outcome kinds that the policy lets fall back.
FALLBACK_ALIAS: Final = "fault*"

_CIRCLED: Final = "".join(chr(c) for c in range(0x2460, 0x2474))  # (1) .. (20)

# Colours (shared by both renderers so the two pictures read the same way).
_TAKEN: Final = "#e8590c"
_TAKEN_FILL: Final = "#fff3bf"
_FALLBACK: Final = "#1c7ed6"
_FAIL: Final = "#c92a2a"
_FINISH: Final = "#2f9e44"
_PLAIN: Final = "#868e96"
_TERMINAL_FILL: Final = {DONE: "#d3f9d8", FAILED: "#ffe3e3", ABORTED: "#e9ecef"}


class DiagramError(ValueError):
    """A trace does not fit the machine being drawn (names the step and the state)."""


@attrs.frozen(slots=True)
class Step:
    """One step of a turn's path, as drawn: its number and the label text."""

    n: int
    source: str
    event: str
    dest: str
    guard: str  # the guard text of the declared transition taken ("" if unguarded)
    wait: float | None

    def marker(self) -> str:
        return _CIRCLED[self.n - 1] if 1 <= self.n <= len(_CIRCLED) else f"({self.n})"

    def lines(self) -> list[str]:
        out = [f"{self.marker()} {self.event}"]
        if self.guard:
            out.append(f"[{self.guard}]")
        if self.wait is not None:
            out.append(f"wait {_seconds(self.wait)}")
        return out


@attrs.frozen(slots=True)
class _Node:
    """One drawn box. `failed`/`done` are drawn once per target (key ``failed@N``)."""

    key: str
    state: str
    label: str
    group: int | None  # target index whose box this node sits in


@attrs.frozen(slots=True)
class _Edge:
    source: str  # node keys
    dest: str
    lines: tuple[str, ...]
    kind: str  # plain | fallback | fail | finish | cancel
    steps: tuple[Step, ...] = ()


@attrs.frozen(slots=True)
class _Group:
    target: int
    title: str
    nodes: tuple[str, ...]  # node keys: the target's states, then its exits


@attrs.frozen(slots=True)
class _Graph:
    """Everything both renderers need, computed once from the declaration."""

    title: str
    nodes: dict[str, _Node]  # key -> node, in drawing order
    ids: dict[str, str]  # key -> safe id
    groups: tuple[_Group, ...]
    edges: tuple[_Edge, ...]
    visited: dict[str, tuple[int, ...]]  # node key -> step numbers that arrive (0 = start)
    legend: tuple[str, ...]
    cancel_sources: int


# -- building the graph -------------------------------------------------------------------------


def _seconds(x: float) -> str:
    if x >= 10:
        return f"{x:.0f}s"
    if x >= 0.01 or x == 0:
        return f"{x:.2f}s".replace(".00s", "s")
    return f"{x * 1000:.1f}ms"


def _guard_text(t: Transition, policy: Policy) -> str:
    return "" if t.guard is None else t.guard.label(policy, t.arg)


def _fallback_kinds(policy: Policy) -> frozenset[str]:
    return frozenset(k.value for k in FAULT_KINDS if policy.rule(k).fall_back)


def _trigger_list(triggers: Sequence[str], alias: frozenset[str]) -> str:
    if len(alias) > 2 and set(triggers) == alias:
        return FALLBACK_ALIAS
    return ", ".join(triggers)


def _edge_lines(
    group: Sequence[Transition], decl: Declaration, counts: dict[tuple[str, str], int]
) -> list[str]:
    """One line per guard: 'trigger, trigger [guard]'; last resorts as 'otherwise: ...'."""
    policy = decl.policy
    alias = _fallback_kinds(policy)
    buckets: dict[str, list[str]] = {}
    for t in group:
        if t.guard is not None:
            key = f"[{_guard_text(t, policy)}]"
        elif counts[(t.source, t.trigger)] > 1:
            key = "otherwise"
        else:
            key = ""
        triggers = buckets.setdefault(key, [])
        if t.trigger not in triggers:
            triggers.append(t.trigger)
    lines: list[str] = []
    for key, triggers in buckets.items():
        text = _trigger_list(triggers, alias)
        if key == "otherwise":
            lines += _wrap(f"otherwise: {text}")
        else:
            lines += _wrap(text)
            if key:
                lines.append(key)
    return lines


def _wrap(text: str, width: int = 44) -> list[str]:
    """Break a comma-separated list into lines of about `width` characters."""
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]


def _kind(source: str, dest: str, decl: Declaration) -> str:
    if dest == DONE:
        return "finish"
    if dest == FAILED:
        return "fail"
    if dest == ABORTED:
        return "cancel"
    src, dst = decl.state(source), decl.state(dest)
    if src.target is not None and dst.target is not None and src.target != dst.target:
        return "fallback"
    return "plain"


def path_steps(decl: Declaration, trace: Iterable[TraceEvent]) -> list[Step]:
    """The trace as drawable steps; raises `DiagramError` if it does not fit `decl`."""
    names = {s.name for s in decl.states}
    groups = decl.groups()
    steps = []
    for n, ev in enumerate(trace, 1):
        for role, name in (("from", ev.source), ("to", ev.dest)):
            if name not in names:
                raise DiagramError(
                    f"trace step {n}: state {name!r} ({role}) is not in this policy's machine "
                    "(was the trace recorded with another policy?)"
                )
        if ev.target is not None and ev.model is not None:
            mine = next((t.model for t in decl.policy.targets if t.name == ev.target), None)
            if mine != ev.model:
                here = f"{mine!r} in this policy" if mine else "absent from this policy"
                raise DiagramError(
                    f"trace step {n}: target {ev.target} is model {ev.model!r} in the trace "
                    f"but {here} (draw it with the policy the trace was recorded with)"
                )
        declared = [t for t in groups.get((ev.source, ev.event), ()) if t.dest == ev.dest]
        if not declared:
            raise DiagramError(
                f"trace step {n}: {ev.source} --{ev.event}--> {ev.dest} is not declared "
                "by this policy's machine"
            )
        steps.append(
            Step(n, ev.source, ev.event, ev.dest, _guard_text(declared[0], decl.policy), ev.wait)
        )
    return steps


def _safe_id(name: str, taken: set[str]) -> str:
    base = "s_" + re.sub(r"[^A-Za-z0-9_]", "_", name)
    ident, k = base, 2
    while ident in taken:
        ident, k = f"{base}_{k}", k + 1
    taken.add(ident)
    return ident


def observe_notes(decl: Declaration) -> list[str]:
    """What each outcome kind records before any guard, one line per observation."""
    by_text: dict[str, list[str]] = {}
    for kind in FAULT_KINDS:
        for ob in decl.observes.get(kind.value, ()):
            if ob is not RESET_STREAK:
                text = observation_text(ob, TRAITS[kind])
                by_text.setdefault(text, []).append(kind.value)
    return [f"on {', '.join(kinds)}, first: {text}" for text, kinds in by_text.items()]


def _graph(decl: Declaration, trace: Iterable[TraceEvent] | None, title: str | None) -> _Graph:
    policy = decl.policy
    steps = path_steps(decl, trace) if trace is not None else []

    nodes: dict[str, _Node] = {}
    for s in decl.states:
        nodes[s.name] = _Node(s.name, s.name, s.name, s.target)
    exits: dict[int, list[str]] = {}

    def key_of(source: str, dest: str) -> str:
        """Where an edge lands: the target's own copy of done/failed."""
        grp = decl.state(source).target
        if dest not in (DONE, FAILED) or grp is None:
            return dest
        key = f"{dest}@{grp}"
        if key not in nodes:
            nodes[key] = _Node(key, dest, dest, grp)
            exits.setdefault(grp, []).append(key)
        return key

    counts: dict[tuple[str, str], int] = {}
    for t in decl.edges():
        counts[(t.source, t.trigger)] = counts.get((t.source, t.trigger), 0) + 1

    by_pair: dict[tuple[str, str], list[Step]] = {}
    visited: dict[str, list[int]] = {}
    for st in steps:
        by_pair.setdefault((st.source, st.dest), []).append(st)
        visited.setdefault(key_of(st.source, st.dest), []).append(st.n)
    if steps:
        visited.setdefault(steps[0].source, [])

    pairs: dict[tuple[str, str], list[Transition]] = {}
    cancel_sources = 0
    summarised = 0
    for t in decl.edges():
        if (t.source, t.dest) not in by_pair:
            if t.trigger == CANCELLED:
                cancel_sources += 1
                continue
            if t.guard is SOONEST_IS or decl.state(t.source).phase is Phase.COOLING:
                summarised += t.guard is SOONEST_IS
                continue
        pairs.setdefault((t.source, t.dest), []).append(t)
    edges = []
    for (src, dst), group in pairs.items():
        edges.append(
            _Edge(
                src,
                key_of(src, dst),
                tuple(_edge_lines(group, decl, counts)),
                _kind(src, dst, decl),
                tuple(by_pair.get((src, dst), ())),
            )
        )

    groups = []
    for tg in policy.targets:
        own = [
            s.name
            for s in decl.states
            if s.target == tg.index and (s.phase is not Phase.COOLING or s.name in visited)
        ]
        title_ = f"{tg.name}: {tg.provider} · {tg.model}"
        groups.append(_Group(tg.index, title_, (*own, *exits.get(tg.index, ()))))
    used = {e.source for e in edges} | {e.dest for e in edges} | {IDLE}
    if cancel_sources:
        used.add(ABORTED)
    ordered: dict[str, _Node] = {}
    for s in decl.states:
        if s.target is None and s.name in used:
            ordered[s.name] = nodes[s.name]
    for grp in groups:
        for k in grp.nodes:
            ordered[k] = nodes[k]
    taken: set[str] = set()
    ids = {k: _safe_id(k, taken) for k in ordered}

    alias = _fallback_kinds(policy)
    legend = []
    if len(alias) > 2:
        kinds = ", ".join(k.value for k in FAULT_KINDS if k.value in alias)
        legend.append(f"{FALLBACK_ALIAS} = {kinds} (the faults this policy lets fall back)")
    legend.append(f"{DONE} and {FAILED} are drawn once per target")
    legend.append(f"{CANCELLED} leads to {ABORTED} from every running state")
    if summarised:
        legend.append(
            f"{START} with every target cooling: wait in the soonest one's "
            "_cooling state (within the Retry-After cap)"
        )
    legend += observe_notes(decl)
    chain = " → ".join(t.model for t in policy.targets)
    if title is None:
        title = f"fallgate turn machine: {chain}"
        if steps:
            n = len(steps)
            title = f"path of a turn, {n} step{'' if n == 1 else 's'} to {steps[-1].dest}: {chain}"
    return _Graph(
        title=title,
        nodes=ordered,
        ids=ids,
        groups=tuple(groups),
        edges=tuple(edges),
        visited={k: tuple(sorted(set(v))) for k, v in visited.items()},
        legend=tuple(legend),
        cancel_sources=cancel_sources,
    )


# -- Mermaid ------------------------------------------------------------------------------------


#: Characters the Mermaid parser or HTML would eat, and what a label says instead. One pass,
#: so the ``#`` and ``;`` of an entity just written are never escaped again.
_MERMAID_ESCAPES: Final = str.maketrans(
    {
        "#": "#35;",
        '"': "#quot;",
        ";": "#59;",
        "<": "#lt;",
        ">": "#gt;",
        "%": "#37;",
        "{": "(",
        "}": ")",
    }
)


def _m(text: str) -> str:
    """Text safe inside a Mermaid label (entity codes for what the parser or HTML would eat)."""
    return text.translate(_MERMAID_ESCAPES)


def _edge_label(e: _Edge) -> list[str]:
    return [ln for st in e.steps for ln in st.lines()] if e.steps else list(e.lines)


def to_mermaid(
    decl: Declaration, trace: Iterable[TraceEvent] | None = None, *, title: str | None = None
) -> str:
    """The machine as a Mermaid ``stateDiagram-v2`` (path highlighted when `trace` is given)."""
    g = _graph(decl, trace, title)
    ids = g.ids
    out = ["stateDiagram-v2", f"    %% {_m(g.title)}", "    direction LR"]
    for key, node in g.nodes.items():
        if node.group is None:
            out.append(f'    state "{_m(node.label)}" as {ids[key]}')
    for grp in g.groups:
        out.append(f'    state "{_m(grp.title)}" as g_{grp.target} {{')
        for key in grp.nodes:
            out.append(f'        state "{_m(g.nodes[key].label)}" as {ids[key]}')
        out.append("    }")
    out.append(f"    [*] --> {ids[IDLE]}")
    for e in g.edges:
        label = "<br/>".join(_m(x) for x in _edge_label(e))
        out.append(f"    {ids[e.source]} --> {ids[e.dest]} : {label}")
    if g.cancel_sources:
        out.append(f"    {ids[IDLE]} --> {ids[ABORTED]} : {_m(CANCELLED)} (from any running state)")
    out.append(f"    note right of {ids[IDLE]}")
    out += [f"        {_m(x.strip()).replace(':', '#58;')}" for x in g.legend]
    out.append("    end note")
    styles = {
        DONE: f"fill:{_TERMINAL_FILL[DONE]},stroke:{_FINISH},stroke-width:2px",
        FAILED: f"fill:{_TERMINAL_FILL[FAILED]},stroke:{_FAIL},stroke-width:2px",
        ABORTED: f"fill:{_TERMINAL_FILL[ABORTED]},stroke:{_PLAIN},stroke-width:2px",
    }
    for name, style in styles.items():
        members = [ids[k] for k, n in g.nodes.items() if n.state == name and k not in g.visited]
        if members:
            out.append(f"    classDef {name} {style}")
            out.append(f"    class {','.join(members)} {name}")
    if g.visited:
        out.append(
            f"    classDef taken fill:{_TAKEN_FILL},stroke:{_TAKEN},stroke-width:3px,"
            "font-weight:bold"
        )
        out.append(f"    class {','.join(ids[k] for k in g.nodes if k in g.visited)} taken")
    return "\n".join(out) + "\n"


def to_markdown(
    decl: Declaration,
    trace: Iterable[TraceEvent] | None = None,
    *,
    title: str | None = None,
    intro: str = "",
) -> str:
    """A Markdown page with the Mermaid diagram in a fence (renders on GitHub)."""
    events = list(trace) if trace is not None else None
    g = _graph(decl, events, title)
    parts = [f"# {g.title}", ""]
    if intro:
        parts += [intro.strip(), ""]
    parts += ["```mermaid", to_mermaid(decl, events, title=title).rstrip("\n"), "```", ""]
    if events:
        steps = path_steps(decl, events)
        parts += ["| step | from | event | to | wait |", "|---:|---|---|---|---:|"]
        for st in steps:
            wait = _seconds(st.wait) if st.wait is not None else ""
            parts.append(f"| {st.n} | {st.source} | {st.event} | {st.dest} | {wait} |")
        parts.append("")
    return "\n".join(parts)


# -- Graphviz DOT -------------------------------------------------------------------------------


def _q(text: str) -> str:
    """A DOT double-quoted string; newlines become centred line breaks."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


_EDGE_STYLE: Final = {
    "plain": f'color="{_PLAIN}", fontcolor="#495057"',
    "fallback": f'color="{_FALLBACK}", fontcolor="{_FALLBACK}", penwidth=1.5',
    "fail": f'color="{_FAIL}", fontcolor="{_FAIL}", style=dashed',
    "finish": f'color="{_FINISH}", fontcolor="{_FINISH}"',
    "cancel": f'color="{_PLAIN}", fontcolor="{_PLAIN}", style=dotted',
}


def to_dot(
    decl: Declaration, trace: Iterable[TraceEvent] | None = None, *, title: str | None = None
) -> str:
    """The machine as Graphviz DOT (path highlighted when `trace` is given)."""
    g = _graph(decl, trace, title)
    ids = g.ids
    font = "DejaVu Sans"
    out = [
        "digraph fallgate {",
        f"    graph [rankdir=TB, compound=true, newrank=true, fontname={_q(font)}, fontsize=16,",
        f"           labelloc=t, label={_q(g.title)}, nodesep=0.3, ranksep=0.45, pad=0.3];",
        '    node [shape=box, style="rounded,filled", fillcolor="#ffffff", color="#495057",',
        f"          fontname={_q(font)}, fontsize=11];",
        f"    edge [fontname={_q(font)}, fontsize=9, arrowsize=0.7];",
    ]

    def node(key: str, indent: str) -> str:
        n = g.nodes[key]
        a = [f"label={_q(n.label)}"]
        if n.state in _TERMINAL_FILL:
            a.append(f'fillcolor="{_TERMINAL_FILL[n.state]}", penwidth=2')
        if n.state == IDLE:
            a.append("shape=ellipse")
        if key in g.visited:
            a.append(
                f'fillcolor="{_TAKEN_FILL}", color="{_TAKEN}", penwidth=3, fontcolor="{_TAKEN}"'
            )
            if g.visited[key]:
                a.append(f"xlabel={_q(','.join(str(x) for x in g.visited[key]))}")
        return f"{indent}{ids[key]} [{', '.join(a)}];"

    out.append("    subgraph cluster_running {")
    out.append(f'        label=""; style="dashed,rounded"; color="{_PLAIN}";')
    out.append(node(IDLE, "        "))
    for grp in g.groups:
        out.append(f"        subgraph cluster_t{grp.target} {{")
        out.append(
            f"            label={_q(grp.title)}; labeljust=l; fontsize=13; "
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
        if e.steps:
            style = f'color="{_TAKEN}", fontcolor="{_TAKEN}", penwidth=3.5'
        else:
            style = _EDGE_STYLE[e.kind]
        label = "\n".join(_edge_label(e))
        out.append(f"    {ids[e.source]} -> {ids[e.dest]} [label={_q(label)}, {style}];")
    if g.cancel_sources:
        out.append(
            f"    {ids[IDLE]} -> {ids[ABORTED]} [ltail=cluster_running, "
            f"label={_q(CANCELLED + ' (from any running state)')}, {_EDGE_STYLE['cancel']}];"
        )
    legend = "".join(
        _q(line)[1:-1] + "\\l"
        for entry in g.legend
        for line in textwrap.wrap(entry, 64, subsequent_indent="    ", break_on_hyphens=False)
    )
    out.append(
        '    legend [shape=note, style=filled, fillcolor="#fff9db", fontsize=10, '
        f'label="{legend}"];'
    )
    out.append("}")
    return "\n".join(out) + "\n"
