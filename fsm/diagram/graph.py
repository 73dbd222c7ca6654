"""The drawing of a declared machine, computed once for every renderer: boxes, edges, legend.

Reads the declaration (and the paths to highlight) into a `DiagramGraph`: one box per
target with its phase states, one edge per (source, destination) whose label lists
its triggers grouped by guard, which states each path visited, and the legend lines.
Mermaid and DOT (`fsm.diagram.render`) and the overlay (`fsm.diagram.overlay`) only format it.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from typing import Final

import attrs

from ..core.guards import SOONEST_IS, WAIT_VERDICT
from ..core.machine import (
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
from ..core.observations import RESET_STREAK, observation_text
from ..kinds import FAULT_KINDS, TRAITS, Phase
from ..policy.model import Policy
from .paths import DiagramPath, Step, guard_text

#: Short name for the set of outcome kinds that the policy lets fall back.
FALLBACK_ALIAS: Final = "fault*"


@attrs.frozen(slots=True)
class _Node:
    """One drawn box. `failed`/`done` are drawn once per target (key ``failed@N``)."""

    key: str
    state: str
    label: str
    group: int | None  # target index whose box this node sits in


@attrs.frozen(slots=True)
class Edge:
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
class DiagramGraph:
    """Everything both renderers need, computed once from the declaration."""

    title: str
    nodes: dict[str, _Node]  # key -> node, in drawing order
    ids: dict[str, str]  # key -> safe id
    groups: tuple[_Group, ...]
    edges: tuple[Edge, ...]
    visited: dict[str, dict[int, tuple[int, ...]]]  # node key -> path -> step numbers arriving
    legend: tuple[str, ...]
    cancel_sources: int
    paths: tuple[DiagramPath, ...]

    @property
    def overlay(self) -> bool:
        return len(self.paths) > 1


def fallback_kinds(policy: Policy) -> frozenset[str]:
    """The triggers that fall back: the faults the policy lets, and a refused attempt."""
    return frozenset(k.value for k in FAULT_KINDS if policy.rule(k).fall_back) | {DENIED}


def _trigger_list(triggers: Sequence[str], alias: frozenset[str]) -> str:
    if len(alias) > 2 and set(triggers) == alias:
        return FALLBACK_ALIAS
    return ", ".join(triggers)


def guard_buckets(
    group: Sequence[Transition], policy: Policy, counts: dict[tuple[str, str], int]
) -> dict[str, list[str]]:
    """An edge's triggers by guard, each once: ``[guard text]``, ``otherwise`` (a last
    resort of a trigger that has guarded alternatives) or ``""`` (unguarded)."""
    buckets: dict[str, list[str]] = {}
    for t in group:
        if t.guard is not None:
            key = f"[{guard_text(t, policy)}]"
        elif counts[(t.source, t.trigger)] > 1:
            key = "otherwise"
        else:
            key = ""
        triggers = buckets.setdefault(key, [])
        if t.trigger not in triggers:
            triggers.append(t.trigger)
    return buckets


def _edge_lines(
    group: Sequence[Transition], decl: Declaration, counts: dict[tuple[str, str], int]
) -> list[str]:
    """One line per guard: 'trigger, trigger [guard]'; last resorts as 'otherwise: ...'."""
    alias = fallback_kinds(decl.policy)
    lines: list[str] = []
    for key, triggers in guard_buckets(group, decl.policy, counts).items():
        text = _trigger_list(triggers, alias)
        if key == "otherwise":
            lines += wrap_label(f"otherwise: {text}")
        else:
            lines += wrap_label(text)
            if key:
                lines.append(key)
    return lines


def wrap_label(text: str, width: int = 44) -> list[str]:
    """Break a comma-separated list into lines of about `width` characters."""
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]


def edge_kind(source: str, dest: str, decl: Declaration) -> str:
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


def safe_id(name: str, taken: set[str]) -> str:
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


def build_graph(decl: Declaration, paths: Sequence[DiagramPath], title: str | None) -> DiagramGraph:
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
    verdict = verdict_waits(decl)
    cancel_sources = 0
    summarised = 0
    for t in decl.edges():
        if (t.source, t.dest) not in by_pair:
            if t.trigger == CANCELLED:
                cancel_sources += 1
                continue
            if t.guard is SOONEST_IS or (
                decl.state(t.source).phase is Phase.COOLING and t.source not in verdict
            ):
                summarised += t.guard is SOONEST_IS
                continue
        pairs.setdefault((t.source, t.dest), []).append(t)
    edges = []
    for (src, dst), group in pairs.items():
        edges.append(
            Edge(
                src,
                key_of(src, dst),
                tuple(_edge_lines(group, decl, counts)),
                edge_kind(src, dst, decl),
                tuple(by_pair.get((src, dst), ())),
            )
        )

    groups = []
    for tg in policy.targets:
        own = [
            s.name
            for s in decl.states
            if s.target == tg.index
            and (s.phase is not Phase.COOLING or s.name in visited or s.name in verdict)
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
    ids = {k: safe_id(k, taken) for k in ordered}

    alias = fallback_kinds(policy)
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
    return DiagramGraph(
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


def verdict_waits(decl: Declaration) -> frozenset[str]:
    """The cooling states a refused attempt waits in for its breaker's verdict: drawn like
    any phase (a cooling state only the turn start enters is summarised in a note)."""
    return frozenset(t.dest for t in decl.edges() if t.effect is WAIT_VERDICT)
