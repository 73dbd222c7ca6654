"""The record of one transition that the properties judge, and what they return.

A record is built once per transition of the search and never changed: the
properties are pure functions of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from ..core.actions import Action
from ..health.backend import Record
from ..health.records import count, num
from ..health.store import HealthStore
from ..kinds import Outcome, OutcomeKind
from ..trace import TraceEvent
from .context import Context
from .oracle import Obs
from .steps import Step


class Finding(NamedTuple):
    """A property broken on one transition, and why (in words for the report)."""

    prop: str
    why: str


#: A health store's facts: target cooldowns, credential cooldowns, failure streaks.
Facts = tuple[Mapping[Any, float], Mapping[Any, float], Mapping[Any, float]]


#: One health fact a transition changed: (which, key, old, new); which is 0 for a target
#: cooldown, 1 for a credential cooldown (key: (target key, credential id)), 2 for a
#: failure streak. A plain tuple: most transitions change one or two.
HealthChange = tuple[int, Any, float, float]


class TransitionRecord(NamedTuple):
    """One transition as the checker saw it (the health store as right after it)."""

    ctx: Context
    event: Step
    trigger: str
    kind: OutcomeKind | None  # the outcome class of the event (None: a host reply)
    outcome: Outcome | None
    source: str
    dest: str
    action: Action
    te: TraceEvent  # the trace record the transition made
    before: Obs  # the checker's record of the turn before the event
    known: Obs  # ... with what the event told it (see `oracle.observe`)
    after: Obs  # ... and the attempt the action started
    then: float  # the clock when the event came
    now: float  # the clock after it (a wait or an attempt takes time)
    health: HealthStore
    changes: tuple[HealthChange, ...]


class Before(NamedTuple):
    """A health store's facts before a transition, and its records then (`raw`)."""

    facts: Facts
    raw: tuple[dict[Any, Any], dict[Any, float]]

    @classmethod
    def of(cls, h: HealthStore) -> Before:
        return cls(h.facts(), h.raw_facts())


def health_changes(before: Before, h: HealthStore) -> tuple[HealthChange, ...]:
    """Every health fact the transition changed. Records are replaced, never changed in
    place (`HealthStore.copy` shares them), so equal records mean equal facts: half the
    transitions change none, and are told so without working the facts out; of the
    others, a plain store's are worked out from the records replaced (`_replaced`)."""
    targets, creds = h.raw_facts(copy=False)
    if targets == before.raw[0] and creds == before.raw[1]:
        return ()
    if type(h) is HealthStore:
        found = _replaced(before, targets, creds)
        if found is not None:
            return found
    post: Facts = h.facts(copy=False)
    pre = before.facts
    if pre[0] == post[0] and pre[1] == post[1] and pre[2] == post[2]:
        return ()
    out: list[HealthChange] = []
    for which in range(3):
        a = pre[which]
        b = post[which]
        for k in a.keys() | b.keys():
            old, new = a.get(k, 0), b.get(k, 0)
            if old != new:
                out.append((which, k, old, new))
    return tuple(out)


def _replaced(
    before: Before, targets: Mapping[Any, Record], creds: Mapping[Any, float]
) -> tuple[HealthChange, ...] | None:
    """`health_changes` from the target records the transition replaced alone (a third of
    the checker's time per transition went to working out every fact of the store), when
    it changed at most one open span and one failure count: in the order the whole diff
    gives (None for more: that order is the whole diff's to give)."""
    pre = before.raw[0]
    span: list[HealthChange] = []
    fails: list[HealthChange] = []
    for k in pre.keys() | targets.keys():
        r0, r1 = pre.get(k), targets.get(k)
        if r0 is r1:
            continue
        u0, f0 = _facts(r0)
        u1, f1 = _facts(r1)
        if u0 != u1:
            span.append((0, k, u0, u1))
        if f0 != f1:
            fails.append((2, k, f0, f1))
    if len(span) > 1 or len(fails) > 1:
        return None
    keys: list[HealthChange] = []
    a = before.facts[1]
    if creds != a:
        for k in a.keys() | creds.keys():
            old, new = a.get(k, 0), creds.get(k, 0)
            if old != new:
                keys.append((1, k, old, new))
    return (*span, *keys, *fails)


def _facts(r: Record | None) -> tuple[float, int]:
    """A target record's open span and failure count as `HealthStore.facts` has them (0:
    not there)."""
    if not r:
        return 0, 0
    until = num(r, "until") if r.get("until") else 0
    fails = count(r, "opens") * 1000 + count(r, "fails") if r.get("opens") or r.get("fails") else 0
    return until, fails
