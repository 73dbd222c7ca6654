"""The compact overview of a turn machine, for a README at 900 px.

One target's phases drawn in full (the primary's; every target has the same), the
other chain entries as single boxes in chain order, `done` and `failed` once each:
read off the same declaration as the full diagram (`fsm.diagram.render`), never by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from ..core.guards import SOONEST_IS
from ..core.machine import ABORTED, CANCELLED, DONE, FAILED, IDLE, START, Declaration, Transition
from ..kinds import FAULT_KINDS, Phase
from .graph import (
    FALLBACK_ALIAS,
    edge_kind,
    fallback_kinds,
    guard_buckets,
    safe_id,
    verdict_waits,
    wrap_label,
)
from .style import FAIL, FALLBACK, FINISH, TERMINAL_FILL, mermaid_text

__all__ = ["to_mermaid_overview"]

#: Edge labels of the overview are wrapped at this many characters (about 200 px, the
#: width Mermaid wraps an edge label at anyway, so the two wraps agree).
_OVERVIEW_WRAP: Final = 24
_OVERVIEW_INIT: Final = (
    '%%{init: {"flowchart": {"nodeSpacing": 24, "rankSpacing": 30, "wrappingWidth": 400, '
    '"subGraphTitleMargin": {"top": 4, "bottom": 10}}}}%%'
)
#: The guard of a fall-back fan-out (`NEXT_IS` for each later target), drawn as one edge.
_NEXT_ELIGIBLE: Final = "[next eligible target]"
#: Text on the light fills, so it stays readable under a dark theme (GitHub's dark mode).
INK: Final = "#212529"
_OVERVIEW_LINK: Final = {"fallback": FALLBACK, "fail": FAIL, "finish": FINISH}


def _uniq(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _alias_triggers(triggers: Sequence[str], alias: frozenset[str]) -> list[str]:
    """The triggers, with the fall-back set written `fault*` when all of it is there."""
    if len(alias) > 2 and alias <= set(triggers):
        return [FALLBACK_ALIAS, *(t for t in triggers if t not in alias)]
    return list(triggers)


def _overview_lines(
    group: Sequence[Transition],
    decl: Declaration,
    counts: dict[tuple[str, str], int],
    width: int = _OVERVIEW_WRAP,
) -> list[str]:
    """`_edge_lines`, with `fault*` inside longer lists, wrapped for the overview."""
    alias = fallback_kinds(decl.policy)
    buckets = guard_buckets(group, decl.policy, counts)
    lines: list[str] = []
    # the last resort reads last: "these fail at once; otherwise (no guard held) these"
    for key, triggers in sorted(buckets.items(), key=lambda kv: kv[0] == "otherwise"):
        text = ", ".join(_alias_triggers(triggers, alias))
        if key == "otherwise":
            lines += wrap_label(f"otherwise: {text}", width)
        else:
            lines += wrap_label(text, width)
            if key:
                lines += wrap_label(key, width)
    return lines


def to_mermaid_overview(decl: Declaration, *, title: str | None = None) -> str:
    """A compact overview of the machine, as a Mermaid flowchart that reads at README width.

    The primary is drawn in full: its states (not the turn-start ``_cooling`` waits)
    and every edge between them with its guard, an edge and its way back as one
    double-headed arrow, a self-loop (key rotation) written inside its state.
    Every other target is one box, in chain order; an edge into another target is
    drawn to the next box of the chain (the next *eligible* target may be further
    down), and a target's ways out to ``done`` / ``failed`` are one edge each.
    What is summarised (the fall-back set, turn start, cancellation) is listed in
    a note. Read off the same declaration as `to_mermaid`; the whole machine, with
    every guard of every target, is `to_mermaid` / `to_dot`.
    """
    policy = decl.policy
    targets = policy.targets
    alias = fallback_kinds(policy)
    counts: dict[tuple[str, str], int] = {}
    for t in decl.edges():
        counts[(t.source, t.trigger)] = counts.get((t.source, t.trigger), 0) + 1

    taken: set[str] = set()
    ids = {s.name: safe_id(s.name, taken) for s in decl.states}
    group_id = "g_0"

    def node(state: str) -> str:
        """The drawn node a state belongs to: the primary's own states are drawn, every
        other target is its box (the id of its calling state)."""
        s = decl.state(state)
        if s.target is None or s.target == 0:
            return ids[state]
        return ids[targets[s.target].name]

    inner: dict[tuple[str, str], list[Transition]] = {}
    loops: dict[str, list[Transition]] = {}
    outer: dict[tuple[str, str], list[Transition]] = {}
    starts: dict[str, list[Transition]] = {}  # turn start into a box (drawn if need be)
    cancels = starts_elsewhere = summarised = 0
    verdict = verdict_waits(decl)
    for t in decl.edges():
        src, dst = decl.state(t.source), decl.state(t.dest)
        if t.trigger == CANCELLED:
            cancels += 1
        elif t.guard is SOONEST_IS or (src.phase is Phase.COOLING and t.source not in verdict):
            summarised += 1
        elif src.target is None:  # turn start
            if dst.target == 0:
                outer.setdefault((ids[IDLE], group_id), []).append(t)
            else:
                starts_elsewhere += 1
                if dst.target is not None:
                    starts.setdefault(node(t.dest), []).append(t)
        elif src.target == dst.target:
            if src.target != 0:
                continue  # the other targets' phases are the primary's, not drawn again
            if t.source == t.dest:
                loops.setdefault(t.source, []).append(t)
            else:
                inner.setdefault((t.source, t.dest), []).append(t)
        else:
            here = group_id if src.target == 0 else node(t.source)
            if dst.target is not None:  # a fall-back: to the next box of the chain
                there = ids[targets[src.target + 1].name]
            else:
                there = ids[t.dest]
            outer.setdefault((here, there), []).append(t)

    # A box no fall-back leads to (the policy lets nothing fall back) is still entered
    # when the targets before it are cooling: draw that start edge, not a floating box.
    entered = {b for _, b in outer}
    for box, group in starts.items():
        if box not in entered:
            outer[(ids[IDLE], box)] = group

    def label(lines: Iterable[str]) -> str:
        return "<br/>".join(mermaid_text(x) for x in lines)

    first = targets[0]
    chain = " → ".join(t.model for t in targets)
    out = [
        _OVERVIEW_INIT,
        "flowchart TB",
        f"    %% {mermaid_text(title or 'fallgate overview: ' + chain)}",
    ]
    out.append(f'    {ids[IDLE]}(["{mermaid_text(IDLE)}"])')
    heading = mermaid_text(f"{first.name}: {first.provider} · {first.model}")
    out.append(f'    subgraph {group_id} ["{heading}"]')
    out.append("        direction LR")
    for s in decl.states:
        if s.target == 0 and (s.phase is not Phase.COOLING or s.name in verdict):
            lines = [s.name]
            loop = loops.get(s.name, ())
            if loop:
                rest = _overview_lines(loop, decl, counts, _OVERVIEW_WRAP + 4)
                lines += [f"↻ {rest[0]}", *rest[1:], *_uniq(t.effect.text for t in loop)]
            out.append(f'        {ids[s.name]}["{label(lines)}"]')
    links: list[str] = []
    drawn: set[tuple[str, str]] = set()
    for (a, b), group in inner.items():
        if (a, b) in drawn:
            continue
        lines = _overview_lines(group, decl, counts)
        back = inner.get((b, a))
        arrow = "-->"
        if back:
            drawn.add((b, a))
            rest = _overview_lines(back, decl, counts)
            lines += [f"← {rest[0]}", *rest[1:]]
            arrow = "<-->"
        links.append(f'        {ids[a]} {arrow}|"{label(lines)}"| {ids[b]}')
    out += links
    out.append("    end")
    for tg in targets[1:]:
        text = label([tg.name, f"{tg.provider} · {tg.model}"])
        out.append(f'    {ids[tg.name]}["{text}"]')
    for name in (DONE, FAILED):
        out.append(f'    {ids[name]}(["{mermaid_text(name)}"])')
    styles = []
    for (a, b), group in outer.items():
        t = group[0]
        kind = edge_kind(t.source, t.dest, decl)
        if kind == "fallback":  # the fan-out to every later target, as one edge
            triggers = _alias_triggers(_uniq(x.trigger for x in group), alias)
            lines = wrap_label(", ".join(triggers), _OVERVIEW_WRAP)
            if a == group_id:
                lines.append(_NEXT_ELIGIBLE)
        elif a in (group_id, ids[IDLE]):
            lines = _overview_lines(group, decl, counts)
        elif kind == "fail":
            lines = ["otherwise"]  # a box's reasons to fail are the primary's, drawn above
        else:
            lines = wrap_label(", ".join(_uniq(x.trigger for x in group)), _OVERVIEW_WRAP)
        colour = _OVERVIEW_LINK.get(kind)
        if colour:
            styles.append(f"    linkStyle {len(links)} stroke:{colour},stroke-width:1.5px")
        links.append(f'    {a} -->|"{label(lines)}"| {b}')
        out.append(links[-1])
    out += styles

    legend = []
    if len(alias) > 2:
        kinds = ", ".join(k.value for k in FAULT_KINDS if k.value in alias)
        legend.append(f"{FALLBACK_ALIAS} = {kinds}")
    if len(targets) > 1:
        legend.append(f"each fallback has the same phases as {first.name}")
    if starts_elsewhere:
        text = f"{START}: the first target not cooling"
        if summarised:
            text += "; all cooling: wait for the soonest"
        legend.append(text)
    if cancels:
        legend.append(f"{CANCELLED}: {ABORTED}, from any running state")
    if legend:
        out.append(f'    legend["{label(legend)}"]')
        out.append(f"    {ids[DONE]} ~~~ legend")
        out.append(f"    classDef legend fill:#fff9db,stroke:#e0c95c,color:{INK}")
        out.append("    class legend legend")
    for name in (DONE, FAILED):
        out.append(
            f"    classDef {name} fill:{TERMINAL_FILL[name]},"
            f"stroke:{FINISH if name == DONE else FAIL},stroke-width:2px,color:{INK}"
        )
        out.append(f"    class {ids[name]} {name}")
    return "\n".join(out) + "\n"
