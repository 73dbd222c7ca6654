"""Testing aids for the pure core: scripted outcome sequences on virtual time.

    played = play(policy, ["transport", "transport", "rate_limited:171", "success"])
    assert played.models == ["glm-5.1", "glm-5.1", "glm-5.1", "glm-4.7"]

``"silent"`` is a target that accepted the request and never answered: a transport
fault that takes the attempt's whole timeout (`Attempt.timeout`) of the clock.

`play` runs the turn on the host loop (`fsm.host.loop`) with a `VirtualClock`:
waits advance it instead of sleeping; rebuilds succeed unless told otherwise.
For the drivers and the openai wrappers pass ``clock=VirtualClock()`` or use
`fsm.instant_waits()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from ..clock import VirtualClock
from ..core.actions import Attempt, Fail, Finish
from ..core.turn import Turn, TurnBase
from ..errors import TurnFailed
from ..health.store import HealthStore
from ..kinds import Outcome, OutcomeKind
from ..policy.model import Policy, Target
from ..trace import TraceEvent
from .loop import host_loop


class ScriptExhausted(AssertionError):
    """The turn asked for more attempts than the script has outcomes."""


_KINDS = ", ".join(k.value for k in OutcomeKind)
#: The script word for an attempt that gets no answer before its timeout.
SILENT = "silent"


def outcome(spec: Outcome | str) -> Outcome:
    """``"kind"`` or ``"kind:retry_after"`` (e.g. ``"rate_limited:171"``) -> Outcome;
    anything else is a ValueError that names it and the kinds there are."""
    if isinstance(spec, Outcome):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"an outcome is an Outcome or 'kind[:retry_after]', got {spec!r:.40}")
    if spec == SILENT:
        return Outcome(OutcomeKind.TRANSPORT, detail="no answer before the attempt's timeout")
    kind, _, ra = spec.partition(":")
    if kind not in OutcomeKind._value2member_map_:
        raise ValueError(f"outcome {spec!r:.40}: {kind!r:.40} is not one of {_KINDS}")
    try:
        retry_after = float(ra) if ra else None
    except ValueError:
        why = f"outcome {spec!r:.40}: the Retry-After {ra!r:.20} is not a number"
        raise ValueError(why) from None
    if kind == "success":
        return Outcome.success(f"answer #{id(spec)}")
    return Outcome(
        OutcomeKind(kind),
        retry_after=retry_after,
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
    clock: VirtualClock | None = None,
    random: float = 1.0,
    rebuild_ok: bool | Sequence[bool] = True,
    attempt_seconds: float = 0.0,
    engine: type[TurnBase] = Turn,
) -> Played:
    """Run one turn of the pure core against a scripted sequence of outcomes.

    `health` defaults to a fresh store (not the process-wide one), `clock` to
    a fresh `VirtualClock`; each attempt takes `attempt_seconds` of it (a ``"silent"``
    one its whole timeout).
    """
    if isinstance(outcomes, str | Outcome):  # one outcome, not a sequence of them
        raise TypeError(f"outcomes must be a list of outcomes, got {outcomes!r:.40}")
    script = []
    silent: set[int] = set()
    for i, o in enumerate(outcomes):
        if o == SILENT:
            silent.add(i)
        try:
            script.append(outcome(o))
        except ValueError as e:
            raise ValueError(f"outcomes[{i}]: {e}") from None
    clock = clock if clock is not None else VirtualClock()
    turn = engine(
        policy,
        health=health if health is not None else HealthStore(),
        clock=clock.now,
        random=lambda: random,
    )
    rebuilds_ok = [rebuild_ok] if isinstance(rebuild_ok, bool) else list(rebuild_ok)
    calls: list[Attempt] = []
    rebuilds: list[str] = []

    def attempt(a: Attempt) -> Outcome:
        calls.append(a)
        if len(calls) > len(script):
            raise ScriptExhausted(
                f"attempt {len(calls)} on {a.target.name} but the script has only "
                f"{len(script)} outcome{'s' if len(script) != 1 else ''}; "
                f"path so far: {[e.dest for e in turn.trace]}"
            )
        clock.advance(a.timeout if len(calls) - 1 in silent else attempt_seconds)
        return script[len(calls) - 1]

    def rebuild(target: Target) -> None:
        rebuilds.append(target.name)
        if not rebuilds_ok[min(len(rebuilds) - 1, len(rebuilds_ok) - 1)]:
            raise _RebuildRefused(target.name)

    action = next(host_loop(turn, clock=clock, rebuild=rebuild, attempt=attempt))
    trace = tuple(turn.trace)
    waits = tuple(e.wait for e in trace if e.action == "Wait" and e.wait is not None)
    err = action.error if isinstance(action, Fail) else None
    res = action.result if isinstance(action, Finish) else None
    return Played(turn.state, tuple(calls), waits, tuple(rebuilds), trace, err, res)


class _RebuildRefused(Exception):
    """The script says this rebuild fails."""
