"""Key audit: configurations the search merges must behave alike.

The search identifies configurations by their key (`TurnState.key()`,
`HealthStore.key()` and the checker's own record). A field that steers the machine
but is left out of the key would silently merge configurations that behave
differently, and the search would lose soundness with no property failing. So when a
new configuration is merged into one still waiting to be expanded, and a generic
fingerprint of every field the engine declares as keyed (read slot by slot, not
through `key()`) differs, both are fed every event of the alphabet: the engine must
answer each with the same next state and action. A budget bounds the cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.actions import Action, Attempt, Fail, Rebuild, Wait
from ..core.state import TurnState
from ..core.visit import Visit
from ..policy.model import Credential

if TYPE_CHECKING:
    from .configuration import Live
    from .steps import Step


def _canon(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        return tuple(sorted(map(_canon, value)))
    if isinstance(value, dict):
        return tuple(sorted((k, _canon(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(map(_canon, value))
    if isinstance(value, float):
        return round(value, 6)
    return value.id if isinstance(value, Credential) else value


def fingerprint(live: Live) -> tuple[Any, ...]:
    """Every keyed field of the turn (and of its visit) as it is: no abstraction."""
    s = live.turn.s
    out: list[Any] = [round(live.clock.t, 6)]
    for name in TurnState.KEYED:
        value = getattr(s, name)
        if isinstance(value, Visit):
            out.append(tuple((n, _canon(getattr(value, n))) for n in Visit.KEYED))
        elif name == "outcome":
            out.append(None if value is None else (value.kind, value.retry_after))
        else:
            out.append(_canon(value))
    out.append(_canon(s.health.facts()))
    return tuple(out)


def differing_fields(a: tuple[Any, ...], b: tuple[Any, ...]) -> list[str]:
    """The names of the keyed fields in which two fingerprints differ."""
    names = ["clock", *TurnState.KEYED, "health"]
    out: list[str] = []
    for name, x, y in zip(names, a, b, strict=True):
        if x == y:
            continue
        if name == "visit":
            out += [f"visit.{n}" for (n, u), (_, v) in zip(x, y, strict=True) if u != v]
        else:
            out.append(name)
    return out


def _summary(action: Action) -> tuple[Any, ...]:
    if isinstance(action, Attempt):
        return ("attempt", action.target.index, action.credential.id)
    if isinstance(action, Wait):
        return ("wait", round(action.seconds, 6) if math.isfinite(action.seconds) else "inf")
    if isinstance(action, Rebuild):
        return ("rebuild", action.target.index)
    if isinstance(action, Fail):
        return ("fail", action.error.state)
    return ("finish",)


Feed = Callable[["Live", "Step"], tuple[Any, ...]]
Clone = Callable[["Live"], "Live"]


def summary_of(state: str, action: Action) -> tuple[Any, ...]:
    """What the engine did on one event: its next state and action."""
    return (state, *_summary(action))


class KeyAudit:
    """The merges audited so far, and the first that behaved differently."""

    __slots__ = ("budget", "checked", "clone", "feed", "finding", "where")

    def __init__(self, budget: int, feed: Feed, clone: Clone) -> None:
        """`feed` answers an event on a copy of a configuration; `clone` copies one."""
        self.budget = budget
        self.feed = feed
        self.clone = clone
        self.checked = 0
        self.finding: str | None = None
        self.where: int = -1

    def wants(self) -> bool:
        return self.finding is None and self.checked < self.budget

    def judge(self, rep: Live, new: Live, events: tuple[Step, ...], node: int) -> None:
        """Feed every event to both merged configurations; the first difference is the
        finding, with the field that alone makes it."""
        feed = self.feed
        fa, fb = fingerprint(rep), fingerprint(new)
        if fa == fb:
            return
        self.checked += 1
        for ev in events:
            a, b = feed(rep, ev), feed(new, ev)
            if a != b:
                fields = differing_fields(fa, fb)
                blamed = [f for f in fields if self._blame(rep, new, ev, f, a)]
                self.finding = (
                    f"the key merged two configurations that answer {ev[0]} differently "
                    f"({_show(a)} vs {_show(b)}); they differ in {', '.join(fields)}, and "
                    f"{' and '.join(blamed) or 'no single field'} alone makes the difference: "
                    "a field that steers the machine is missing from its key()"
                )
                self.where = node
                return

    def _blame(self, rep: Live, new: Live, ev: Step, field: str, want: Any) -> bool:
        """Does giving `new` the representative's value of `field` alone make it answer `ev`
        like the representative?"""
        if field in ("clock", "health"):
            return False
        probe = self.clone(new)
        src, dst = rep.turn.s, probe.turn.s
        if field.startswith("visit."):
            name = field[len("visit.") :]
            src, dst = src.visit, dst.visit  # type: ignore[assignment]
        else:
            name = field
        value = getattr(src, name)
        setattr(dst, name, value.copy() if isinstance(value, dict | set | list) else value)
        return bool(self.feed(probe, ev) == want)


def _show(summary: tuple[Any, ...]) -> str:
    return " ".join(str(x) for x in summary)
