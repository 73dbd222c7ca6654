"""Steps: what a host feeds a turn, printable, JSON-able and replayable.

A counterexample is a list of steps; `replay` feeds it to fresh turns of the same
policy on one health store and one virtual clock, so it can be pasted into a test and
reproduces exactly what the checker saw.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from ..actions import Action, Attempt, Wait
from ..guards import Effect, Guard
from ..health import HealthStore
from ..machine import CANCELLED, DENIED, REBUILT, WAITED, Declaration
from ..outcomes import Outcome, OutcomeKind
from ..policy import Policy, Target
from ..testing import FakeClock
from ..turn import Turn, _TurnBase

#: Host-side steps of a counterexample besides the machine's triggers.
NEXT_TURN: Final = "next_turn"
ADVANCE: Final = "advance"  # time passes between turns
COOL_TARGET: Final = "cool_target"
COOL_CREDENTIAL: Final = "cool_credential"

#: Where every virtual clock starts (any positive time; cooldowns are relative to it).
START_TIME: Final = 1000.0

Args = tuple[tuple[str, Any], ...]
Step = tuple[str, Args]
Executor = type[_TurnBase]

KINDS: Final = {k.value: k for k in OutcomeKind}
_STATUS: Final = {
    OutcomeKind.RATE_LIMITED: 429,
    OutcomeKind.QUOTA: 429,
    OutcomeKind.OVERLOADED: 503,
    OutcomeKind.AUTH: 401,
    OutcomeKind.NOT_FOUND: 404,
    OutcomeKind.CONTEXT_TOO_LONG: 400,
    OutcomeKind.CONTENT_FILTERED: 400,
    OutcomeKind.BAD_REQUEST: 400,
}


def step(trigger: str, **args: Any) -> Step:
    """One event of a counterexample: ``step("rate_limited", retry_after=61.0)``."""
    return (trigger, tuple(sorted(args.items())))


def steps_to_json(steps: Iterable[Step]) -> list[list[Any]]:
    return [[t, dict(a)] for t, a in steps]


def steps_from_json(data: Iterable[Sequence[Any]]) -> list[Step]:
    return [step(str(item[0]), **(dict(item[1]) if len(item) > 1 else {})) for item in data]


def format_steps(steps: Sequence[Step]) -> str:
    """Steps as Python source: ``[("start", {}), ("transport", {}), ...]``."""
    inner = ", ".join(f"({t!r}, {dict(a)!r})" for t, a in steps)
    return f"[{inner}]"


def outcome_for(trigger: str, args: Mapping[str, Any]) -> Outcome | None:
    """The `Outcome` an outcome step stands for (None for host replies)."""
    kind = KINDS.get(trigger)
    if kind is None:
        return None
    if kind is OutcomeKind.SUCCESS:
        return Outcome(kind, status=200, value="answer")
    if kind is OutcomeKind.CANCELLED:
        return Outcome(kind, detail="cancelled")
    status = _STATUS.get(kind)
    return Outcome(
        kind,
        status=status,
        retry_after=args.get("retry_after"),
        detail=kind.value,
        partial=args.get("partial"),
        client_side=bool(args.get("client_side", False)),
    )


#: The host's reply to a Wait or a Rebuild that overran the turn's deadline (a late
#: wake-up, a slow rebuild): it comes a whole deadline later.
LATE: Final = "late"


def host_time(
    policy: Policy, action: object, trigger: str, args: Args | Mapping[str, Any]
) -> float:
    """How far the clock moves before a host reply: a wait's seconds, plus (for a
    ``late`` reply) the policy's whole deadline, so the deadline has surely passed."""
    seconds = 0.0
    if trigger == WAITED and isinstance(action, Wait) and action.seconds > 0:
        if math.isfinite(action.seconds):
            seconds = action.seconds
    if dict(args).get(LATE):
        seconds += policy.deadline
    return seconds


def worst_jitter() -> float:
    """The random source of every checked turn: full jitter, so waits are the longest."""
    return 1.0


class Replay:
    """Feeds steps to turns of one policy on one health store and one virtual clock."""

    def __init__(
        self,
        policy: Policy,
        *,
        health: HealthStore | None = None,
        clock: FakeClock | None = None,
        attempt_seconds: float = 0.0,
        executor: Executor = Turn,
        declaration: Declaration | None = None,
        guards: Mapping[Guard, Guard] | None = None,
        effects: Mapping[Effect, Effect] | None = None,
    ) -> None:
        self.policy = policy
        self.health = health if health is not None else HealthStore()
        self.clock = clock if clock is not None else FakeClock(START_TIME)
        self.attempt_seconds = attempt_seconds
        self.executor = executor
        self.declaration = declaration
        self.guards = guards
        self.effects = effects
        self.turns: list[_TurnBase] = []
        self._asked: Action | None = None  # the attempt whose grant was asked for
        self._refused: str | None = None

    def new_turn(self) -> _TurnBase:
        kw: dict[str, Any] = {}
        if self.declaration is not None or self.guards is not None or self.effects is not None:
            if self.executor is not Turn:
                raise ValueError("broken declarations, guards and effects need the Turn executor")
            kw = {"declaration": self.declaration, "guards": self.guards, "effects": self.effects}
        t = self.executor(
            self.policy, health=self.health, clock=self.clock, random=worst_jitter, **kw
        )
        self.turns.append(t)
        return t

    def feed(self, st: Step) -> Action | None:
        """Apply one step; returns the turn's next action (None for setup steps)."""
        trigger, raw = st
        args = dict(raw)
        if trigger == COOL_TARGET:
            t = self._target(args["target"])
            now = self.clock()
            self.health.open_target(t.key, now + float(args["seconds"]), now)
            return None
        if trigger == COOL_CREDENTIAL:
            t = self._target(args["target"])
            now = self.clock()
            cid = str(args["credential"])
            hid = next((c.health_id for c in t.pool() if c.id == cid), cid)
            self.health.cool_credential(t.key, hid, now + float(args["seconds"]), now)
            return None
        if trigger == ADVANCE:
            self.clock.advance(float(args["seconds"]))
            return None
        if trigger == NEXT_TURN or not self.turns:
            turn = self.new_turn()
            if trigger == NEXT_TURN:
                return None
        turn = self.turns[-1]
        why = self.ask_grant(turn) if trigger != CANCELLED else None
        if trigger == DENIED:
            return turn.deny(why or "refused")
        if why is not None:
            raise ValueError(f"the health store refused the attempt ({why}): feed {DENIED!r}")
        if trigger in (WAITED, REBUILT):
            self.clock.advance(host_time(self.policy, turn.s.action, trigger, args))
        elif trigger in KINDS and trigger != CANCELLED and self.attempt_seconds:
            self.clock.advance(self.attempt_seconds)
        return turn.fire(trigger, outcome_for(trigger, args))

    def ask_grant(self, turn: _TurnBase) -> str | None:
        """As a host does before making an attempt: ask the store's grant (once per
        attempt); returns why it was refused, or None."""
        a = turn.s.action
        if not isinstance(a, Attempt) or not (a.probe or a.retry):
            return None
        if self._asked is not a:
            self._asked = a
            self._refused = self.health.grant(turn.s, a)
        return self._refused

    def _target(self, name: str) -> Target:
        for t in self.policy.targets:
            if t.name == name:
                return t
        raise ValueError(f"no target named {name!r} in the policy")


def replay(policy: Policy, steps: Iterable[Step], **kw: Any) -> list[_TurnBase]:
    """Feed a counterexample to fresh turns; returns the turns (the last may be running).

    Keyword arguments are those of `Replay` (health, clock, attempt_seconds,
    executor, declaration, guards, effects).
    """
    r = Replay(policy, **kw)
    for st in steps:
        r.feed(st)
    return r.turns
