"""Testing aids for the pure core: a fake clock and scripted outcome sequences.

    played = play(policy, ["transport", "transport", "rate_limited:171", "success"])
    assert played.models == ["glm-5.1", "glm-5.1", "glm-5.1", "glm-4.7"]

Waits advance the fake clock instead of sleeping; rebuilds succeed unless told
otherwise. Use `fsm.instant_waits()` for the drivers instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from .actions import Action, Attempt, Fail, Finish, Rebuild, Wait
from .errors import TurnFailed
from .health import HealthStore
from .outcomes import Outcome, OutcomeKind
from .policy import Policy
from .trace import TraceEvent
from .turn import Turn, _TurnBase


class FakeClock:
    """A clock that only moves when told (waits, or `advance`)."""

    __slots__ = ("t",)

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


class ScriptExhausted(AssertionError):
    """The turn asked for more attempts than the script has outcomes."""


def outcome(spec: Outcome | str) -> Outcome:
    """``"kind"`` or ``"kind:retry_after"`` (e.g. ``"rate_limited:171"``) -> Outcome."""
    if isinstance(spec, Outcome):
        return spec
    kind, _, ra = spec.partition(":")
    if kind == "success":
        return Outcome.success(f"answer #{id(spec)}")
    return Outcome(
        OutcomeKind(kind),
        retry_after=float(ra) if ra else None,
        detail=kind,
        partial="partial text" if kind == "stream_interrupted" else None,
    )


@attrs.frozen
class Played:
    """What a scripted turn did."""

    state: str
    calls: tuple[Attempt, ...]
    waits: tuple[float, ...]
    rebuilds: tuple[str, ...]
    trace: tuple[TraceEvent, ...]
    error: TurnFailed | None
    result: object = None

    @property
    def models(self) -> list[str]:
        return [a.target.model for a in self.calls]

    @property
    def targets(self) -> list[str]:
        return [a.target.name for a in self.calls]

    @property
    def credentials(self) -> list[str]:
        return [a.credential.id for a in self.calls]

    @property
    def path(self) -> list[str]:
        return [self.trace[0].source, *(e.dest for e in self.trace)] if self.trace else []


def play(
    policy: Policy,
    outcomes: Iterable[Outcome | str],
    *,
    health: HealthStore | None = None,
    clock: FakeClock | None = None,
    random: float = 1.0,
    rebuild_ok: bool | Sequence[bool] = True,
    attempt_seconds: float = 0.0,
    engine: type[_TurnBase] = Turn,
) -> Played:
    """Run one turn of the pure core against a scripted sequence of outcomes."""
    script = [outcome(o) for o in outcomes]
    clock = clock or FakeClock()
    turn = engine(policy, health=health or HealthStore(), clock=clock, random=lambda: random)
    rebuilds_ok = [rebuild_ok] if isinstance(rebuild_ok, bool) else list(rebuild_ok)
    calls: list[Attempt] = []
    waits: list[float] = []
    rebuilds: list[str] = []
    action: Action = turn.start()
    while True:
        if isinstance(action, Attempt):
            calls.append(action)
            if len(calls) > len(script):
                raise ScriptExhausted(
                    f"attempt {len(calls)} on {action.target.name} but the script has only "
                    f"{len(script)} outcomes; path so far: {[e.dest for e in turn.trace]}"
                )
            clock.advance(attempt_seconds)
            action = turn.feed(script[len(calls) - 1])
        elif isinstance(action, Wait):
            waits.append(action.seconds)
            clock.advance(action.seconds)
            action = turn.waited()
        elif isinstance(action, Rebuild):
            rebuilds.append(action.target.name)
            ok = rebuilds_ok[min(len(rebuilds) - 1, len(rebuilds_ok) - 1)]
            action = turn.rebuilt(ok)
        else:
            break
    err = action.error if isinstance(action, Fail) else None
    res = action.result if isinstance(action, Finish) else None
    return Played(
        turn.state, tuple(calls), tuple(waits), tuple(rebuilds), tuple(turn.trace), err, res
    )
