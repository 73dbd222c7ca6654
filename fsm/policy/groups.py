"""Deployment groups: one chain entry held by several equivalent deployments.

A group is a run of consecutive targets of the chain with the same `Target.group`
label (the loader expands an entry's ``members = [...]`` into such a run). Each
member is a target like any other (its own base_url, keys, health record, state
names ``<entry>_m1``, ``<entry>_m2``, ...), so the declaration, the diagrams and the
checker see every member and every move between members as what it is: an attempt
on another target, with the same guards (the fallback gate, no ping-pong, the time
reserve) as a move down the chain. What makes the run a group:

- it keeps one place in the chain (`Target.entry`: the fallbacks after it are
  numbered by entries, not by targets);
- its members are not identical to one another (`Target.same_as`), and no two of
  them reach one backend (refused here: that is one deployment with two keys);
- the order its members are tried in is chosen per turn, from the health store
  (`fsm.core.members.route`), never fixed by the file.

Here: the checks and the numbering, done once per policy (`assign`), and the spans
the router reads (`spans`).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .checks import Problems
from .targets import Target

__all__ = ["assign", "spans"]


def assign(targets: Sequence[Target], ps: Problems) -> tuple[Target, ...]:
    """`targets` (resolved, indexed) with each one's `entry` and `member` set; every
    problem with a group reported on `ps` (paths ``targets[i].group`` ...)."""
    runs: list[list[int]] = []
    ended: dict[str, int] = {}  # group label -> the last target of its run
    for i, t in enumerate(targets):
        if runs and t.group is not None and targets[runs[-1][0]].group == t.group:
            runs[-1].append(i)
            continue
        if t.group is not None and t.group in ended:
            ps.add(
                f"targets[{i}].group",
                t.group,
                f"the members of a group are consecutive in the chain (group {t.group!r} "
                f"ended at targets[{ended[t.group]}]); give the two groups other names",
            )
        runs.append([i])
        if t.group is not None:
            ended[t.group] = i
    out = list(targets)
    for entry, run in enumerate(runs):
        members = [targets[i] for i in run]
        if members[0].group is None:
            out[run[0]] = _placed(members[0], entry, 0)
            continue
        numbers = _numbers(members, run, ps)
        backends: dict[tuple[str, str], int] = {}
        for i, m, n in zip(run, members, numbers, strict=True):
            if m.key in backends:
                ps.add(
                    f"targets[{i}].base_url",
                    m.base_url,
                    f"member {n} of group {m.group!r} reaches the same backend (base_url "
                    f"and model) as member {backends[m.key]}: that is one deployment; give "
                    "its keys to one member (key_envs)",
                )
            backends.setdefault(m.key, n)
            out[i] = _placed(m, entry, n)
    return tuple(out)


def _numbers(members: list[Target], run: list[int], ps: Problems) -> list[int]:
    """The members' numbers: 1..n in declared order, or the ones they carry (a routed
    order of a policy already numbered), which must be 1..n once each."""
    given = [m.member for m in members]
    if not any(given):
        return list(range(1, len(members) + 1))
    if sorted(given) != list(range(1, len(members) + 1)):
        ps.add(
            f"targets[{run[0]}].member",
            given,
            f"the members of group {members[0].group!r} are numbered 1..{len(members)} "
            "once each, or not at all",
        )
    return given


def _placed(t: Target, entry: int, member: int) -> Target:
    if t.entry == entry and t.member == member:
        return t
    return attrs.evolve(t, entry=entry, member=member)


def spans(targets: Sequence[Target]) -> tuple[range, ...]:
    """The index range of each group of the chain, in chain order (a run of targets
    with one group label; `assign` keeps a label to one run)."""
    out: list[range] = []
    i, n = 0, len(targets)
    while i < n:
        j = i + 1
        label = targets[i].group
        if label is not None:
            while j < n and targets[j].group == label:
                j += 1
            out.append(range(i, j))
        i = j
    return tuple(out)
