"""The objects an edge of the declaration is made of: `Guard`, `Effect`, `Observation`.

Each carries its code *and* its words, so a diagram label and the predicate it names
cannot drift: a guard's label is formatted from the policy fields it reads
(`{field}` placeholders, rendered here from the policy). The guards, effects and
observations themselves are `fsm.core.guards` and `fsm.core.observations`.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import attrs

from ..kinds import Outcome
from ..policy.model import Backoff, Breaker, Cooldown, Policy, RetryBudget
from .actions import Action

if TYPE_CHECKING:
    from .state import TurnState

_SECONDS: Final = frozenset({"deadline", "retry_after_cap", "attempt_timeout"})


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


class _Words(dict[str, str]):
    """Renders `{field}` placeholders from a policy (and `{target}` from the edge)."""

    def __init__(self, policy: Policy, arg: int) -> None:
        super().__init__()
        self.policy = policy
        self.arg = arg

    def __missing__(self, name: str) -> str:
        if name == "target":
            return self.policy.targets[self.arg].name if self.arg >= 0 else "?"
        if name == "attempt_bound":
            return f"{_num(max(self.policy.attempt_bound(t) for t in self.policy.targets))}s"
        if name == "group_reserve":  # only an edge into a group's member says it
            t = self.policy.targets[self.arg] if self.arg >= 0 else None
            if t is None or t.group is None:
                return ""
            bound, reserve = self.__missing__("attempt_bound"), self.__missing__("reserve")
            return f"; from a member of its group: then ≤{bound} more leaves {reserve}"
        if name == "reserve":
            r = self.policy.reserve
            if r is False:
                return "no reserve"
            room = "an attempt" if isinstance(r, str) else f"{_num(r)}s"
            return f"the next target {room}"
        value = getattr(self.policy, name)
        if name == "pacing":
            return "pacing on" if value else "pacing off"
        if isinstance(value, Backoff):
            return f"backoff ≤{_num(value.cap)}s"
        if isinstance(value, Cooldown):
            return f"cooldown from {_num(value.initial)}s"
        if isinstance(value, Breaker):
            return f"≤{_num(value.max_open)}s"
        if isinstance(value, RetryBudget):
            return f"a retry token (of {_num(value.size)})" if value.enabled else "(no budget)"
        if name in _SECONDS:
            return f"{_num(value)}s"
        return _num(value) if isinstance(value, int | float) else str(value)


def placeholders(text: str) -> frozenset[str]:
    """The `{names}` a template uses."""
    return frozenset(f for _, f, _, _ in string.Formatter().parse(text) if f)


@attrs.frozen(slots=True)
class Guard:
    """A pure predicate over the turn state; `arg` is the target index an edge is about."""

    name: str
    check: Callable[[TurnState, int], bool] = attrs.field(repr=False, eq=False)
    text: str  # `{policy_field}` / `{target}` placeholders: what the predicate reads
    #: The same guard without the time reserve (`reserved`), for a guard that keeps it.
    base: Guard | None = attrs.field(default=None, repr=False, eq=False)

    def label(self, policy: Policy, arg: int = -1) -> str:
        return self.text.format_map(_Words(policy, arg))

    @property
    def reads(self) -> frozenset[str]:
        """The policy fields the label names (the predicate may read no others)."""
        names = placeholders(self.text) - {"target"}
        if "group_reserve" in names:  # the reserve a move between members keeps
            names = (names - {"group_reserve"}) | {"reserve", "attempt_bound"}
        return names


@attrs.frozen(slots=True)
class Effect:
    """What taking an edge does to the turn; returns the next action."""

    name: str
    run: Callable[[TurnState, int], Action] = attrs.field(repr=False, eq=False)
    text: str


@attrs.frozen(slots=True)
class Observation:
    """What an outcome records before any guard reads the state."""

    name: str
    apply: Callable[[TurnState, Outcome], None] = attrs.field(repr=False, eq=False)
    text: str
