"""One visit of one target within a turn: what belongs to the stay, replaced whole on a move.

Attempts, the fault streak, rotations, spent keys and not-before times of the target the
turn is on live in one `Visit` value; `TurnState` replaces it when the turn moves, so no
counter of the previous target survives the move. Like `TurnState` it has `copy()` and a
canonical `key()` for the model checker, with the fields that cannot matter listed in
`NOT_KEYED`.
"""

from __future__ import annotations

import math
from typing import Any, Final

from ..health.store import relative
from ..policy.model import Credential, Target

__all__ = ["NOWHERE", "Visit"]


class Visit:
    """The turn's facts about the target it is on (replaced whole on every move)."""

    __slots__ = (
        "attempts",
        "credential",
        "index",
        "key_not_before",
        "not_before",
        "pool_start",
        "probe",
        "recovered",
        "refused",
        "rotations",
        "spent",
        "streak",
        "target",
        "verdicts",
    )

    #: Fields in `key()`; the rest of `__slots__` is in NOT_KEYED with a reason.
    KEYED: Final = (
        "index",
        "credential",
        "attempts",
        "streak",
        "recovered",
        "rotations",
        "pool_start",
        "spent",
        "not_before",
        "key_not_before",
        "probe",
        "verdicts",
    )
    NOT_KEYED: Final[dict[str, str]] = {
        "target": "the chain entry at `index` (keyed by it)",
        "refused": "words: how many of `attempts` the store refused unsent (no guard reads it)",
    }

    def __init__(self, index: int, pool_start: int, target: Target) -> None:
        self.index = index  # the target's position in the chain
        self.target = target  # ... and the entry there (read on every event: kept at hand)
        self.credential: Credential | None = None  # the key of the last attempt
        self.attempts = 0  # attempts on this target in this turn
        self.refused = 0  # ... of them refused by the health store, never sent
        self.streak = 0  # consecutive transport faults
        self.recovered = False  # transport recovery (client rebuild) used
        self.rotations = 0  # credential rotations on this target
        self.pool_start = pool_start  # round-robin: the pool slot this visit starts at
        self.spent: set[str] = set()  # keys never to be retried in this turn
        self.not_before = 0.0  # a server's Retry-After on the whole target
        self.key_not_before: dict[str, float] = {}  # per key: Retry-After / bench end
        self.probe = False  # an attempt on it probed its half-open breaker
        self.verdicts = 0  # waits for its breaker's verdict (`guards.VERDICT_WAITS` at most)

    def copy(self) -> Visit:
        v = Visit.__new__(Visit)
        v.index = self.index
        v.target = self.target
        v.credential = self.credential
        v.attempts = self.attempts
        v.refused = self.refused
        v.streak = self.streak
        v.recovered = self.recovered
        v.rotations = self.rotations
        v.pool_start = self.pool_start
        v.spent = self.spent.copy()
        v.not_before = self.not_before
        v.key_not_before = self.key_not_before.copy()
        v.probe = self.probe
        v.verdicts = self.verdicts
        return v

    def __eq__(self, other: object) -> bool:
        """Equal facts (two fresh visits are equal: a new turn starts like any other)."""
        if not isinstance(other, Visit):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in Visit.KEYED)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def key(self, now: float, horizon: float = math.inf) -> tuple[Any, ...]:
        """Canonical identity; times relative to `now`."""
        nb = self.key_not_before
        return (
            self.index,
            self.credential.id if self.credential is not None else None,
            self.attempts,
            self.streak,
            self.recovered,
            self.rotations,
            self.pool_start,
            tuple(sorted(self.spent)) if self.spent else (),
            relative(self.not_before, now, horizon),
            tuple(sorted((c, relative(v, now, horizon)) for c, v in nb.items() if v > now))
            if nb
            else (),
            self.probe,
            self.verdicts,
        )


#: The visit of a turn that has not entered a target yet. Shared (one allocation less per
#: turn, which the core bench's happy turn shows); never mutated: only outcomes mutate a
#: visit, and no outcome is declared before the first attempt.
NOWHERE: Final = Visit(-1, 0, None)  # type: ignore[arg-type]  # no target: index -1
