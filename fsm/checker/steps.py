"""Steps: what a host feeds a turn, printable, JSON-able and replayable.

A counterexample is a list of steps; `replay` feeds it to fresh turns of the same
policy on one health store and one virtual clock, so it can be pasted into a test and
reproduces exactly what the checker saw.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from ..clock import VirtualClock
from ..core.actions import Action, Attempt, Wait
from ..core.guards import Effect, Guard
from ..core.machine import CANCELLED, DENIED, REBUILT, WAITED, Declaration
from ..core.turn import Turn, TurnBase
from ..health.store import HealthStore
from ..kinds import TRAITS, Outcome, OutcomeKind
from ..policy.model import Policy, Target
from .pacing import HEADROOM, NO_HEADROOM, needs_grant, tell, took_last

#: Host-side steps of a counterexample besides the machine's triggers.
NEXT_TURN: Final = "next_turn"
ADVANCE: Final = "advance"  # time passes between turns
COOL_TARGET: Final = "cool_target"
COOL_CREDENTIAL: Final = "cool_credential"

#: Where every virtual clock starts (any positive time; cooldowns are relative to it).
START_TIME: Final = 1000.0

Args = tuple[tuple[str, Any], ...]
Step = tuple[str, Args]
Executor = type[TurnBase]

KINDS: Final = {k.value: k for k in OutcomeKind}


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
    status = TRAITS[kind].sample_status
    return Outcome(
        kind,
        status=status,
        retry_after=args.get("retry_after"),
        detail=kind.value,
        partial=args.get("partial"),
        client_side=bool(args.get("client_side", False)),
        uncontinuable=UNCONTINUABLE if args.get("uncontinuable") else None,
    )


#: Why a broken stream's `uncontinuable` outcome cannot be continued (the host's words).
UNCONTINUABLE: Final = "the stream delivered more than text: a text prefix cannot continue it"

#: The host's reply to a Wait or a Rebuild that overran the turn's deadline (a late
#: wake-up, a slow rebuild): it comes a whole deadline later.
LATE: Final = "late"
#: An outcome step's flag: the attempt took its whole bound (`Attempt.timeout`), a
#: target that accepted the request and never answered (``transport``, silent=True).
SILENT: Final = "silent"


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


def event_time(
    policy: Policy,
    action: object,
    trigger: str,
    args: Args | Mapping[str, Any],
    attempt_seconds: float = 0.0,
) -> float:
    """How far the clock moves before an event is fed: a host reply's `host_time`; an
    outcome's attempt takes `attempt_seconds`, a silent one its whole timeout."""
    if trigger in (WAITED, REBUILT):
        return host_time(policy, action, trigger, args)
    if trigger not in KINDS or trigger == CANCELLED:
        return 0.0
    if isinstance(action, Attempt) and dict(args).get(SILENT):
        return action.timeout
    return attempt_seconds


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
        clock: VirtualClock | None = None,
        attempt_seconds: float = 0.0,
        executor: Executor = Turn,
        declaration: Declaration | None = None,
        guards: Mapping[Guard, Guard] | None = None,
        effects: Mapping[Effect, Effect] | None = None,
    ) -> None:
        self.policy = policy
        self.health = health if health is not None else HealthStore()
        self.clock = clock if clock is not None else VirtualClock(START_TIME)
        self.attempt_seconds = attempt_seconds
        self.executor = executor
        self.declaration = declaration
        self.guards = guards
        self.effects = effects
        self.turns: list[TurnBase] = []
        self._asked: Action | None = None  # the attempt whose grant was asked for
        self._refused: str | None = None

    def new_turn(self) -> TurnBase:
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
        if trigger == NO_HEADROOM:
            t = self._target(args["target"])
            cid = str(args["credential"])
            hid = next((c.health_id for c in t.pool() if c.id == cid), cid)
            tell(self.health, t.key, hid, int(args["left"]), float(args["seconds"]), self.clock())
            return None
        if trigger == ADVANCE:
            self.clock.advance(float(args["seconds"]))
            return None
        if trigger == NEXT_TURN or not self.turns:
            turn = self.new_turn()
            if trigger == NEXT_TURN:
                return None
        turn = self.turns[-1]
        a = turn.s.action
        if trigger == DENIED and HEADROOM in args and isinstance(a, Attempt):
            took_last(self.health, a, float(args[HEADROOM]), self.clock())
        why = self.ask_grant(turn) if trigger != CANCELLED else None
        if trigger == DENIED:
            return turn.deny(why or "refused")
        if why is not None:
            raise ValueError(f"the health store refused the attempt ({why}): feed {DENIED!r}")
        self.clock.advance(
            event_time(self.policy, turn.s.action, trigger, args, self.attempt_seconds)
        )
        return turn.fire(trigger, outcome_for(trigger, args))

    def ask_grant(self, turn: TurnBase) -> str | None:
        """As a host does before making an attempt: ask the store's grant (once per
        attempt); returns why it was refused, or None."""
        a = turn.s.action
        if not isinstance(a, Attempt):
            return None
        if not (a.probe or a.retry or needs_grant(self.health, turn.s, a)):
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


def replay(policy: Policy, steps: Iterable[Step], **kw: Any) -> list[TurnBase]:
    """Feed a counterexample to fresh turns; returns the turns (the last may be running).

    Keyword arguments are those of `Replay` (health, clock, attempt_seconds,
    executor, declaration, guards, effects).
    """
    r = Replay(policy, **kw)
    for st in steps:
        r.feed(st)
    return r.turns
