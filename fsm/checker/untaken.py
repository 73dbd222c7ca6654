"""Declared but never taken: each such edge as a finding, with why it was not taken.

An edge whose guard can never hold for a policy is not declared for it (a one-key
target has no rotation edge; a context overflow has no fallback edge to a later target
known to be no larger), so what the search leaves untaken is one of:

* ``other turns``: a wait for the breaker's verdict. Its guard needs the target's
  breaker opened, or its probe taken, by another turn while this one is on it (a turn
  opens a breaker only as it leaves the target), which one turn on its own store never
  shows; the concurrent-turn check (``fallgate check --turns 2``) runs turns side by
  side on one store.
* ``gap``: anything else. The search did not reach it, and the reason is said as far as
  the search can tell it: its source state is never entered, or entered only by a next
  turn (followed a few events from its start, so what comes later is not explored), or
  neither (the initial configurations or the alphabet do not lead there). A gap is
  what the checker does not prove; it is reported, never hidden.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from ..core.guards import AWAIT_VERDICT, AWAIT_VERDICT_AFTER
from ..core.machine import Transition
from ..policy.model import Policy
from .report import describe

OTHER_TURNS: Final = "other turns"
GAP: Final = "gap"

_VERDICT_GUARDS: Final = frozenset(
    g for base in (AWAIT_VERDICT, AWAIT_VERDICT_AFTER) for g in (base, base.base) if g is not None
)


@attrs.frozen
class Untaken:
    """A declared edge the search never took, and why."""

    edge: str  # `describe`d
    finding: str  # OTHER_TURNS or GAP
    why: str
    short: str = ""  # source --trigger--> dest (the report's text lists it so)

    def to_json(self) -> dict[str, str]:
        return {"edge": self.edge, "finding": self.finding, "why": self.why}


def untaken(
    policy: Policy,
    edges: Iterable[Transition],
    taken: Iterable[tuple[str, str, str]],
    entered: Mapping[str, int],
    follow_events: int,
) -> tuple[Untaken, ...]:
    """The edges of `edges` not in `taken`, each with its finding; `entered` maps each
    state the search entered to the first turn (1, 2, ...) that entered it."""
    done = set(taken)
    out: list[Untaken] = []
    for t in edges:
        if (t.source, t.trigger, t.dest) in done:
            continue
        text = describe(t, policy)
        short = f"{t.source} --{t.trigger}--> {t.dest}"
        if t.guard is not None and t.guard in _VERDICT_GUARDS:
            why = (
                "waits for the breaker's verdict: needs the target's breaker opened or its "
                "probe taken by another turn while this one is on it (a turn opens a breaker "
                "only as it leaves the target); one turn never shows that, `--turns 2` runs "
                "concurrent turns on one store"
            )
            out.append(Untaken(text, OTHER_TURNS, why, short))
            continue
        first = entered.get(t.source, 0) if t.source != "idle" else 1
        if first == 0:
            why = f"its source state {t.source} is never entered"
        elif first > 1:
            why = (
                f"{t.source} is entered only by a next turn, which the check follows "
                f"{follow_events} events from its start"
            )
        else:
            why = (
                "never taken from any explored configuration: the initial configurations "
                "and the outcome alphabet do not lead there"
            )
        out.append(Untaken(text, GAP, why, short))
    return tuple(out)
