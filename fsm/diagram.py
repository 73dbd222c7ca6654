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
    DENIED,
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
    "MAX_PATHS",
    "DiagramError",
    "Step",
    "TracePath",
    "path_steps",
    "to_dot",
    "to_markdown",
    "to_mermaid",
]

#: Short name for the set of outcome kinds that the policy lets fall back.
FALLBACK_ALIAS: Final = "fault*"

_CIRCLED: Final = "".join(chr(c) for c in range(0x2460, 0x2474))  # (1) .. (20)
#: A second path's numerals: negative circled 1 .. 20.
_NEGATIVE_CIRCLED: Final = "".join(chr(c) for c in (*range(0x2776, 0x2780), *range(0x24EB, 0x24F5)))

# Colours (shared by both renderers so the two pictures read the same way).
_TAKEN: Final = "#e8590c"
_TAKEN_FILL: Final = "#fff3bf"
_FALLBACK: Final = "#1c7ed6"
_FAIL: Final = "#c92a2a"
_FINISH: Final = "#2f9e44"
_PLAIN: Final = "#868e96"
_TERMINAL_FILL: Final = {DONE: "#d3f9d8", FAILED: "#ffe3e3", ABORTED: "#e9ecef"}
_INK: Final = "#212529"


@attrs.frozen(slots=True)
class _PathStyle:
    """How one overlaid path is drawn: its colour, its states' fill, its numerals."""

    name: str
    colour: str
    fill: str
    digits: str
    brackets: str  # around a step number past the numerals: "()", "[]"


#: One style per path of an overlay, in order; the first is the single-path highlight.
_PATH_STYLES: Final = (
    _PathStyle("orange", _TAKEN, _TAKEN_FILL, _CIRCLED, "()"),
    _PathStyle("violet", "#7048e8", "#e5dbff", _NEGATIVE_CIRCLED, "[]"),
)

#: The most paths one picture overlays. Each needs a colour apart from the others and
#: from the machine's own (grey, blue, red, green), and numerals that tell its steps
#: apart without colour, because Mermaid's state diagrams cannot colour an edge: ① and ❶
#: are the two numbered series the diagram font (DejaVu Sans) draws. A third path would
#: also stack a third set of labels on every shared edge, past reading.
MAX_PATHS: Final = len(_PATH_STYLES)


class DiagramError(ValueError):
    """A trace does not fit the machine being drawn (names the path, the step and the state).

    `reason` is the bare problem; `step` the 1-based position of the event in its
    trace, `seq` the event's own sequence number and `path` the path's label (None
    for a single trace), so a caller that knows the file can name its line.
    """

    def __init__(
        self,
        reason: str,
        *,
        step: int | None = None,
        seq: int | None = None,
        path: str | None = None,
    ) -> None:
        text = reason if step is None else f"trace step {step}: {reason}"
        super().__init__(f"{path}: {text}" if path else text)
        self.reason = reason
        self.step = step
        self.seq = seq
        self.path = path


def _label(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"TracePath.label must be a non-empty string, not {value!r}")
    return value


def _events(value: Iterable[TraceEvent]) -> tuple[TraceEvent, ...]:
    return tuple(value)


@attrs.frozen(slots=True)
class TracePath:
    """A turn's path and the name the legend gives it (its file, "recorded", "replayed")."""

    label: str = attrs.field(converter=_label)
    events: tuple[TraceEvent, ...] = attrs.field(converter=_events)


@attrs.frozen(slots=True)
class Step:
    """One step of a turn's path, as drawn: its number and the label text."""

    n: int
    source: str
    event: str
    dest: str
    guard: str  # the guard text of the declared transition taken ("" if unguarded)
    wait: float | None
    path: int = 0  # which path of an overlay (0: the first, or the only one)

    def marker(self) -> str:
        return _marker(self.n, self.path)

    def lines(self) -> list[str]:
        out = [f"{self.marker()} {self.event}"]
        if self.guard:
            out.append(f"[{self.guard}]")
        if self.wait is not None:
            out.append(f"wait {_seconds(self.wait)}")
        return out


def _marker(n: int, path: int = 0) -> str:
    """Step `n` of path `path` in that path's numerals: ①, ❶; past them (21), [21]."""
    style = _PATH_STYLES[path]
    if 1 <= n <= len(style.digits):
        return style.digits[n - 1]
    return f"{style.brackets[0]}{n}{style.brackets[1]}"


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
    visited: dict[str, dict[int, tuple[int, ...]]]  # node key -> path -> step numbers arriving
    legend: tuple[str, ...]
    cancel_sources: int
    paths: tuple[_Path, ...]

    @property
    def overlay(self) -> bool:
        return len(self.paths) > 1


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
    """The triggers that fall back: the faults the policy lets, and a refused attempt."""
    return frozenset(k.value for k in FAULT_KINDS if policy.rule(k).fall_back) | {DENIED}


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


def path_steps(decl: Declaration, trace: Iterable[TraceEvent], *, path: int = 0) -> list[Step]:
    """The trace as drawable steps; raises `DiagramError` if it does not fit `decl`.

    `path` is the trace's place in an overlay (it picks the steps' numerals).
    """
    names = {s.name for s in decl.states}
    groups = decl.groups()
    steps = []
    for n, ev in enumerate(trace, 1):
        for role, name in (("from", ev.source), ("to", ev.dest)):
            if name not in names:
                raise DiagramError(
                    f"state {name!r} ({role}) is not in this policy's machine "
                    "(was the trace recorded with another policy?)",
                    step=n,
                    seq=ev.seq,
                )
        if ev.target is not None and ev.model is not None:
            mine = next((t.model for t in decl.policy.targets if t.name == ev.target), None)
            if mine != ev.model:
                here = f"{mine!r} in this policy" if mine else "absent from this policy"
                raise DiagramError(
                    f"target {ev.target} is model {ev.model!r} in the trace "
                    f"but {here} (draw it with the policy the trace was recorded with)",
                    step=n,
                    seq=ev.seq,
                )
        declared = [t for t in groups.get((ev.source, ev.event), ()) if t.dest == ev.dest]
        if not declared:
            raise DiagramError(
                f"{ev.source} --{ev.event}--> {ev.dest} is not declared by this policy's machine",
                step=n,
                seq=ev.seq,
            )
        steps.append(
            Step(
                n,
                ev.source,
                ev.event,
                ev.dest,
                _guard_text(declared[0], decl.policy),
                ev.wait,
                path,
            )
        )
    return steps


@attrs.frozen(slots=True)
class _Path:
    """One drawn path: its legend label (None for a lone trace), its steps, how it went."""

    label: str | None
    steps: tuple[Step, ...]
    seconds: float  # the turn's clock at its last transition
    requests: int  # attempts that went out
    waited: float  # seconds the machine chose to wait

    @property
    def style(self) -> _PathStyle:
        return _PATH_STYLES[self.steps[0].path if self.steps else 0]

    def numerals(self) -> str:
        return f"{self.style.digits[0]} {self.style.digits[1]} …"

    def summary(self) -> str:
        """'7 steps to done at 0.76s, 4 requests, waited 0.25s'."""
        n = len(self.steps)
        text = f"{n} step{'' if n == 1 else 's'} to {self.steps[-1].dest} at "
        text += (
            f"{_seconds(self.seconds)}, {self.requests} request{'' if self.requests == 1 else 's'}"
        )
        return text + (f", waited {_seconds(self.waited)}" if self.waited else "")


def _drawn_path(
    decl: Declaration, events: Sequence[TraceEvent], label: str | None, path: int
) -> _Path:
    try:
        steps = path_steps(decl, events, path=path)
    except DiagramError as e:
        if label is None:
            raise
        raise DiagramError(e.reason, step=e.step, seq=e.seq, path=label) from None
    return _Path(
        label,
        tuple(steps),
        events[-1].time if events else 0.0,
        sum(1 for ev in events if ev.action == "Attempt"),
        sum(ev.wait or 0.0 for ev in events),
    )


def _paths(
    decl: Declaration,
    trace: Iterable[TraceEvent] | None,
    traces: Sequence[TracePath | Iterable[TraceEvent]] | None,
) -> list[_Path]:
    """The paths to draw: none, a lone trace, or an overlay of up to `MAX_PATHS`."""
    if trace is not None and traces is not None:
        raise TypeError("give trace (one path) or traces (an overlay), not both")
    if traces is None:
        return [] if trace is None else [_drawn_path(decl, list(trace), None, 0)]
    given = [
        t if isinstance(t, TracePath) else TracePath(f"path {i}", t)
        for i, t in enumerate(traces, 1)
    ]
    if not given:
        raise DiagramError("traces is empty: give at least one path (or leave traces out)")
    if len(given) > MAX_PATHS:
        raise DiagramError(
            f"{len(given)} paths given: one diagram overlays at most {MAX_PATHS} "
            "(each needs its own colour and numerals to stay readable)"
        )
    labels: list[str] = []
    for tp in given:
        label, k = tp.label, 2
        while label in labels:
            label, k = f"{tp.label} ({k})", k + 1
        labels.append(label)
    out = []
    for i, (tp, label) in enumerate(zip(given, labels, strict=True)):
        if not tp.events:
            raise DiagramError("the path is empty (no transitions)", path=label)
        out.append(_drawn_path(decl, tp.events, label, i))
    return out


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


def _graph(decl: Declaration, paths: Sequence[_Path], title: str | None) -> _Graph:
    policy = decl.policy
    steps = [st for p in paths for st in p.steps]

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
    visited: dict[str, dict[int, list[int]]] = {}
    for p in paths:
        if p.steps:
            visited.setdefault(p.steps[0].source, {}).setdefault(p.steps[0].path, [])
    for st in steps:
        by_pair.setdefault((st.source, st.dest), []).append(st)
        visited.setdefault(key_of(st.source, st.dest), {}).setdefault(st.path, []).append(st.n)

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
    if len(paths) > 1:
        for p in paths:
            legend.append(f"{p.numerals()} ({p.style.name}): {p.label}, {p.summary()}")
    if len(alias) > 2:
        kinds = ", ".join(k.value for k in FAULT_KINDS if k.value in alias)
        legend.append(
            f"{FALLBACK_ALIAS} = {kinds}, {DENIED} (the faults this policy lets fall back, and "
            "an attempt the health store refused: probe lease taken, no retry token)"
        )
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
        if len(paths) > 1:
            vs = " vs ".join(f"{p.style.digits[0]} {p.label}" for p in paths)
            title = f"paths of a turn, {vs}: {chain}"
        elif steps:
            n = len(steps)
            title = f"path of a turn, {n} step{'' if n == 1 else 's'} to {steps[-1].dest}: {chain}"
    return _Graph(
        title=title,
        nodes=ordered,
        ids=ids,
        groups=tuple(groups),
        edges=tuple(edges),
        visited={
            k: {p: tuple(sorted(set(v))) for p, v in sorted(by.items())}
            for k, by in visited.items()
        },
        legend=tuple(legend),
        cancel_sources=cancel_sources,
        paths=tuple(paths),
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


def _edge_label(e: _Edge, overlay: bool = False) -> list[str]:
    if overlay and e.steps:
        return [ln for group in _step_groups(e.steps) for ln in _group_lines(group)]
    return [ln for st in e.steps for ln in st.lines()] if e.steps else list(e.lines)


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


#: Type of the `traces` argument: each path a `TracePath` (labelled) or a plain trace.
Traces = Sequence[TracePath | Iterable[TraceEvent]]


def _mermaid_classes(g: _Graph) -> list[str]:
    """The visited states' classes: ``taken`` for a lone path; in an overlay ``path1``,
    ``path2`` for a state one path visited and ``both`` (the first path's fill, the
    second's border) for one both visited."""
    ids = g.ids
    if not g.overlay:
        return [
            f"    classDef taken fill:{_TAKEN_FILL},stroke:{_TAKEN},stroke-width:3px,"
            "font-weight:bold",
            f"    class {','.join(ids[k] for k in g.nodes if k in g.visited)} taken",
        ]
    members: dict[str, list[str]] = {}
    for k in g.nodes:
        if k in g.visited:
            by = g.visited[k]
            name = "both" if len(by) > 1 else f"path{next(iter(by)) + 1}"
            members.setdefault(name, []).append(ids[k])
    first, second = _PATH_STYLES[0], _PATH_STYLES[1]
    styles = {f"path{i}": (st.fill, st.colour) for i, st in enumerate(_PATH_STYLES, 1)}
    styles["both"] = (first.fill, second.colour)
    out = []
    for name, (fill, stroke) in styles.items():
        if name in members:
            out.append(
                f"    classDef {name} fill:{fill},stroke:{stroke},stroke-width:3px,font-weight:bold"
            )
            out.append(f"    class {','.join(members[name])} {name}")
    return out


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
    g = _graph(decl, _paths(decl, trace, traces), title)
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
        label = "<br/>".join(_m(x) for x in _edge_label(e, g.overlay))
        out.append(f"    {ids[e.source]} --> {ids[e.dest]} : {label}")
    if g.cancel_sources:
        out.append(f"    {ids[IDLE]} --> {ids[ABORTED]} : {_m(CANCELLED)} (from any running state)")
    legend = list(g.legend)
    if g.overlay:
        legend.insert(
            len(g.paths),
            f"a state both paths visited: {_PATH_STYLES[0].name} fill, "
            f"{_PATH_STYLES[1].name} border; an edge both took lists both paths' steps",
        )
    out.append(f"    note right of {ids[IDLE]}")
    out += [f"        {_m(x.strip()).replace(':', '#58;')}" for x in legend]
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
        out += _mermaid_classes(g)
    return "\n".join(out) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


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
    paths = _paths(decl, events, given)
    g = _graph(decl, paths, title)
    parts = [f"# {g.title}", ""]
    if intro:
        parts += [intro.strip(), ""]
    mermaid = to_mermaid(decl, events, traces=given, title=title).rstrip("\n")
    parts += ["```mermaid", mermaid, "```", ""]
    if g.overlay:
        parts += [
            "| path | numerals | steps | ends | at | requests | waited |",
            "|---|---|---:|---|---:|---:|---:|",
        ]
        for p in paths:
            parts.append(
                f"| {_md_cell(p.label or '')} ({p.style.name}) | {p.numerals()} | "
                f"{len(p.steps)} | {p.steps[-1].dest} | {_seconds(p.seconds)} | "
                f"{p.requests} | {_seconds(p.waited)} |"
            )
        parts.append("")
    for p in paths:
        if not p.steps:
            continue
        if g.overlay:
            parts += [f"**{p.style.digits[0]} {_md_cell(p.label or '')}** ({p.style.name})", ""]
        parts += ["| step | from | event | to | wait |", "|---:|---|---|---|---:|"]
        for st in p.steps:
            wait = _seconds(st.wait) if st.wait is not None else ""
            n = st.marker() if g.overlay else str(st.n)
            parts.append(f"| {n} | {st.source} | {st.event} | {st.dest} | {wait} |")
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


def _h(text: str) -> str:
    """Text safe inside a DOT HTML-like label."""
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


def _coloured(colour: str, lines: Iterable[str], align: str = "") -> str:
    """HTML-like label lines in one colour (`align`: ``left`` for a left-justified block,
    ``none`` for text with no line break)."""
    br = {"": "<br/>", "none": ""}.get(align, f'<br align="{align}"/>')
    return f'<font color="{colour}">' + "".join(_h(x) + br for x in lines) + "</font>"


def _overlay_edge_style(e: _Edge) -> str:
    """An edge of an overlay: in the colour of the path that took it, or, taken by both,
    both colours side by side, each step's numeral in its path's colour."""
    paths = sorted({st.path for st in e.steps})
    if len(paths) == 1:
        c = _PATH_STYLES[paths[0]].colour
        label = _q("\n".join(_edge_label(e, overlay=True)))
        return f'label={label}, color="{c}", fontcolor="{c}", penwidth=3.5'
    html = []
    for group in _step_groups(e.steps):
        mine = {st.path for st in group}
        ink = _PATH_STYLES[group[0].path].colour if len(mine) == 1 else _INK
        marks = "".join(
            f'<font color="{_PATH_STYLES[st.path].colour}">{_h(st.marker())}</font>' for st in group
        )
        first, *rest = _group_lines(group)
        event = first.split(" ", 1)[1]
        html.append(f'{marks}<font color="{ink}"> {_h(event)}</font><br/>')
        if rest:
            html.append(_coloured(ink, rest))
    colours = ":".join(_PATH_STYLES[p].colour for p in paths)
    return f'label=<{"".join(html)}>, color="{colours}", fontcolor="{_INK}", penwidth=2.5'


def _overlay_node_attrs(by: dict[int, tuple[int, ...]]) -> str:
    """A state of an overlay, given the step numbers each path arrived with: in that
    path's colour, or, visited by both, the first path's fill and the second's border;
    its xlabel lists each path's arrivals in that path's numerals and colour."""
    first, last = _PATH_STYLES[min(by)], _PATH_STYLES[max(by)]
    ink = first.colour if len(by) == 1 else _INK
    attrs_ = f'fillcolor="{first.fill}", color="{last.colour}", penwidth=3, fontcolor="{ink}"'
    marks = " ".join(
        _coloured(_PATH_STYLES[p].colour, ["".join(_marker(x, p) for x in nums)], "none")
        for p, nums in by.items()
        if nums
    )
    return attrs_ + (f", xlabel=<{marks}>" if marks else "")


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
    g = _graph(decl, _paths(decl, trace, traces), title)
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
        if key in g.visited and g.overlay:
            a.append(_overlay_node_attrs(g.visited[key]))
        elif key in g.visited:
            a.append(
                f'fillcolor="{_TAKEN_FILL}", color="{_TAKEN}", penwidth=3, fontcolor="{_TAKEN}"'
            )
            if g.visited[key][0]:
                a.append(f"xlabel={_q(','.join(str(x) for x in g.visited[key][0]))}")
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
        if e.steps and g.overlay:
            out.append(f"    {ids[e.source]} -> {ids[e.dest]} [{_overlay_edge_style(e)}];")
            continue
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
    if g.overlay:
        out.append(
            '    legend [shape=note, style=filled, fillcolor="#fff9db", fontsize=10, '
            f"label=<{_overlay_legend(g)}>];"
        )
    else:
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


def _overlay_legend(g: _Graph) -> str:
    """The legend of an overlay as an HTML-like label: each path's line in its colour."""
    first, second = _PATH_STYLES[0], _PATH_STYLES[1]
    shared = (
        f"a state both paths visited: {first.name} fill, {second.name} border; "
        "an edge both took: both colours side by side"
    )
    entries = [(p.style.colour, g.legend[i]) for i, p in enumerate(g.paths)]
    entries.append((_INK, shared))
    entries += [(_INK, x) for x in g.legend[len(g.paths) :]]
    return "".join(
        _coloured(
            colour,
            textwrap.wrap(text, 64, subsequent_indent="    ", break_on_hyphens=False),
            "left",
        )
        for colour, text in entries
    )
