"""Whole-graph analyses, run once the search has built every configuration.

Two properties are about runs rather than single transitions: termination (no cycle
within a turn, no run longer than the policy's bound) and the fallback gate as
reachability (repeating a fallback-triggering outcome must leave the target). The
search hands over its graph: `edges[n]` maps each event fed in configuration `n` to
the configuration it led to, and `kinds[n]` is what `n` waits for, as
``(kind, target)`` with kind "A" (an attempt on target), "W" (a wait), "R" (a
rebuild), "I" (idle, before the start) or "T" (the turn ended).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from ..core.machine import REBUILT, WAITED
from .steps import NEXT_TURN, Step, step

Edges = Sequence[dict[Step, int]]
Kinds = Sequence[tuple[str, int]]


class GraphFinding(NamedTuple):
    """A broken property: `steps` lead there from configuration `at`."""

    prop: str
    why: str
    at: int
    steps: tuple[Step, ...]


def longest_runs(edges: Edges, kinds: Kinds, limit: int) -> list[GraphFinding]:
    """Within a turn, the configuration graph must be acyclic, and its longest run from a
    turn start must stay within `limit` events. Findings in the order found: every cycle
    closed by the depth-first search, then the longest run if it is too long."""
    found: list[GraphFinding] = []
    n = len(kinds)
    longest = [-1] * n  # events to the end of the turn; -1 unknown
    best: list[Step | None] = [None] * n
    on_stack = [False] * n
    nt = NEXT_TURN
    for root in range(n):
        if longest[root] >= 0:
            continue
        stack: list[tuple[int, Iterator[tuple[Step, int]]]] = [(root, iter(edges[root].items()))]
        on_stack[root] = True
        while stack:
            node, it = stack[-1]
            advanced = False
            for ev, child in it:
                if ev[0] == nt:
                    continue
                if on_stack[child]:
                    cycle = cycle_steps(edges, [nid for nid, _ in stack], child, ev)
                    why = "a run can go round a cycle of configurations forever"
                    found.append(GraphFinding("termination", why, child, tuple(cycle)))
                    continue
                if longest[child] < 0:
                    on_stack[child] = True
                    stack.append((child, iter(edges[child].items())))
                    advanced = True
                    break
            if advanced:
                continue
            stack.pop()
            on_stack[node] = False
            top, arg = 0, None
            for ev, child in edges[node].items():
                if ev[0] == nt or longest[child] < 0:
                    continue
                if longest[child] + 1 > top:
                    top, arg = longest[child] + 1, ev
            longest[node] = top
            best[node] = arg
    worst = max(
        (nid for nid, k in enumerate(kinds) if k[0] == "I"),
        key=lambda nid: longest[nid],
        default=None,
    )
    if worst is not None and longest[worst] > limit:
        steps: list[Step] = []
        cur = worst
        while True:
            ev2 = best[cur]
            if ev2 is None:
                break
            steps.append(ev2)
            cur = edges[cur][ev2]
        why = f"a turn can take {longest[worst]} events (bound from the policy: {limit})"
        found.append(GraphFinding("termination", why, worst, tuple(steps)))
    return found


def cycle_steps(edges: Edges, nodes: list[int], entry: int, closing: Step) -> list[Step]:
    """The events round a cycle: from `entry` along the depth-first path `nodes`, then
    `closing` back to `entry`."""
    at = nodes.index(entry)
    steps: list[Step] = []
    for a, b in zip(nodes[at:], nodes[at + 1 :], strict=False):
        for ev, child in edges[a].items():
            if child == b and ev[0] != NEXT_TURN:
                steps.append(ev)
                break
    steps.append(closing)
    return steps


def gate_chains(
    edges: Edges,
    kinds: Kinds,
    per_target: Sequence[int],
    fallback_steps: Sequence[Step],
    names: Sequence[str],
    depth: Callable[[int], int],
) -> GraphFinding | None:
    """From every configuration with an attempt on target i in flight, feeding the same
    fallback-triggering outcome again and again (the host answering waits and rebuilds)
    must reach another target or end the turn within the per-target bound. Returns the
    shortest failing chain (`depth(n)`: events from a turn start to configuration n)."""
    memo: dict[tuple[int, Step], int] = {}
    best: tuple[int, int, Step] | None = None
    waited = step(WAITED)
    rebuilt = step(REBUILT)
    for nid, (k, i) in enumerate(kinds):
        if k != "A":
            continue
        for fb in fallback_steps:
            if (nid, fb) in memo:
                continue
            chain: list[int] = []
            cur = nid
            attempts = 0
            result = 0
            while True:
                kk, ti = kinds[cur]
                m = memo.get((cur, fb))
                if m is not None:
                    result = m
                    break
                if kk == "A":
                    if ti != i:
                        result = 1
                        break
                    attempts += 1
                    if attempts > per_target[i]:
                        result = -1
                        break
                    e = fb
                elif kk == "W":
                    e = waited
                elif kk == "R":
                    e = rebuilt
                else:
                    result = 1
                    break
                nxt = edges[cur].get(e)
                if nxt is None or nxt in chain or nxt == cur:
                    result = -1 if nxt is not None else 1
                    break
                chain.append(cur)
                cur = nxt
            for c in chain:
                memo[(c, fb)] = result
            memo[(nid, fb)] = result
            if result < 0:
                cand = (depth(nid) + len(chain) + 1, nid, fb)
                if best is None or cand[0] < best[0]:
                    best = cand
    if best is None:
        return None
    _, nid, fb = best
    i = kinds[nid][1]
    steps = _chain_steps(edges, kinds, nid, fb, per_target[i])
    why = f"repeating {fb[0]}{_args(fb)} on {names[i]} never reaches a fallback"
    return GraphFinding("fallback_gate", why, nid, tuple(steps))


def _chain_steps(edges: Edges, kinds: Kinds, nid: int, fb: Step, bound: int) -> list[Step]:
    """The events of a failing chain from `nid`, for the report."""
    waited = step(WAITED)
    rebuilt = step(REBUILT)
    steps: list[Step] = []
    cur = nid
    attempts = 0
    seen: set[int] = set()
    while True:
        kk, _ti = kinds[cur]
        if kk == "A":
            attempts += 1
            e = fb
        elif kk == "W":
            e = waited
        else:
            e = rebuilt
        steps.append(e)
        nxt = edges[cur].get(e)
        if nxt is None or nxt in seen or attempts > bound:
            break
        seen.add(cur)
        cur = nxt
    return steps


def _args(st: Step) -> str:
    return f" {dict(st[1])}" if st[1] else ""
