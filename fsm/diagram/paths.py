"""A turn's path as the diagrams draw it: traces checked against the machine, as numbered steps.

A trace that does not fit the policy being drawn (an unknown state, another model,
an undeclared transition) is refused here with a `DiagramError` naming the step, so
the renderers only ever see steps the declaration has. Up to `MAX_PATHS` labelled
`TracePath`s can be given for an overlay.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from ..core.machine import Declaration, Transition
from ..policy.checks import name_problem
from ..policy.model import Policy
from ..trace import TraceEvent
from .style import MAX_PATHS, PATH_STYLES, PathStyle, fmt_seconds, step_marker


class DiagramError(ValueError):
    """A trace does not fit the machine being drawn (names the path, the step and the state).

    `reason` is the bare problem; `step` the 1-based position of the event in its
    trace, `seq` the event's own sequence number and `path` the path's label (None
    for a single trace), so a caller that knows the file can name its line.
    """

    def __init__(
        self,
        reason: str,
        *,
        step: int | None = None,
        seq: int | None = None,
        path: str | None = None,
    ) -> None:
        text = reason if step is None else f"trace step {step}: {reason}"
        super().__init__(f"{path}: {text}" if path else text)
        self.reason = reason
        self.step = step
        self.seq = seq
        self.path = path


def _label(value: object) -> str:
    problem = name_problem(value)  # a newline would break the Mermaid/DOT source
    if problem is not None:
        raise ValueError(f"TracePath.label {problem}, not {value!r}")
    return value  # type: ignore[return-value]


def _events(value: Iterable[TraceEvent]) -> tuple[TraceEvent, ...]:
    return tuple(value)


@attrs.frozen(slots=True)
class TracePath:
    """A turn's path and the name the legend gives it (its file, "recorded", "replayed")."""

    label: str = attrs.field(converter=_label)
    events: tuple[TraceEvent, ...] = attrs.field(converter=_events)


#: Type of the `traces` argument: each path a `TracePath` (labelled) or a plain trace.
Traces = Sequence[TracePath | Iterable[TraceEvent]]


@attrs.frozen(slots=True)
class Step:
    """One step of a turn's path, as drawn: its number and the label text."""

    n: int
    source: str
    event: str
    dest: str
    guard: str  # the guard text of the declared transition taken ("" if unguarded)
    wait: float | None
    path: int = 0  # which path of an overlay (0: the first, or the only one)

    def marker(self) -> str:
        return step_marker(self.n, self.path)

    def lines(self) -> list[str]:
        out = [f"{self.marker()} {self.event}"]
        if self.guard:
            out.append(f"[{self.guard}]")
        if self.wait is not None:
            out.append(f"wait {fmt_seconds(self.wait)}")
        return out


def guard_text(t: Transition, policy: Policy) -> str:
    return "" if t.guard is None else t.guard.label(policy, t.arg)


def path_steps(decl: Declaration, trace: Iterable[TraceEvent], *, path: int = 0) -> list[Step]:
    """The trace as drawable steps; raises `DiagramError` if it does not fit `decl`.

    `path` is the trace's place in an overlay (it picks the steps' numerals).
    """
    names = {s.name for s in decl.states}
    groups = decl.groups()
    steps = []
    for n, ev in enumerate(trace, 1):
        for role, name in (("from", ev.source), ("to", ev.dest)):
            if name not in names:
                raise DiagramError(
                    f"state {name!r} ({role}) is not in this policy's machine "
                    "(was the trace recorded with another policy?)",
                    step=n,
                    seq=ev.seq,
                )
        if ev.target is not None and ev.model is not None:
            mine = next((t.model for t in decl.policy.targets if t.name == ev.target), None)
            if mine != ev.model:
                here = f"{mine!r} in this policy" if mine else "absent from this policy"
                raise DiagramError(
                    f"target {ev.target} is model {ev.model!r} in the trace "
                    f"but {here} (draw it with the policy the trace was recorded with)",
                    step=n,
                    seq=ev.seq,
                )
        declared = [t for t in groups.get((ev.source, ev.event), ()) if t.dest == ev.dest]
        if not declared:
            raise DiagramError(
                f"{ev.source} --{ev.event}--> {ev.dest} is not declared by this policy's machine",
                step=n,
                seq=ev.seq,
            )
        steps.append(
            Step(
                n,
                ev.source,
                ev.event,
                ev.dest,
                guard_text(declared[0], decl.policy),
                ev.wait,
                path,
            )
        )
    return steps


@attrs.frozen(slots=True)
class DiagramPath:
    """One drawn path: its legend label (None for a lone trace), its steps, how it went."""

    label: str | None
    steps: tuple[Step, ...]
    seconds: float  # the turn's clock at its last transition
    requests: int  # attempts that went out
    waited: float  # seconds the machine chose to wait

    @property
    def style(self) -> PathStyle:
        return PATH_STYLES[self.steps[0].path if self.steps else 0]

    def numerals(self) -> str:
        return f"{self.style.digits[0]} {self.style.digits[1]} …"

    def summary(self) -> str:
        """'7 steps to done at 0.76s, 4 requests, waited 0.25s'."""
        n = len(self.steps)
        text = f"{n} step{'' if n == 1 else 's'} to {self.steps[-1].dest} at "
        plural = "" if self.requests == 1 else "s"
        text += f"{fmt_seconds(self.seconds)}, {self.requests} request{plural}"
        return text + (f", waited {fmt_seconds(self.waited)}" if self.waited else "")


def _drawn_path(
    decl: Declaration, events: Sequence[TraceEvent], label: str | None, path: int
) -> DiagramPath:
    try:
        steps = path_steps(decl, events, path=path)
    except DiagramError as e:
        if label is None:
            raise
        raise DiagramError(e.reason, step=e.step, seq=e.seq, path=label) from None
    return DiagramPath(
        label,
        tuple(steps),
        events[-1].time if events else 0.0,
        sum(1 for ev in events if ev.action == "Attempt"),
        sum(ev.wait or 0.0 for ev in events),
    )


def drawn_paths(
    decl: Declaration,
    trace: Iterable[TraceEvent] | None,
    traces: Sequence[TracePath | Iterable[TraceEvent]] | None,
) -> list[DiagramPath]:
    """The paths to draw: none, a lone trace, or an overlay of up to `MAX_PATHS`."""
    if trace is not None and traces is not None:
        raise TypeError("give trace (one path) or traces (an overlay), not both")
    if traces is None:
        return [] if trace is None else [_drawn_path(decl, list(trace), None, 0)]
    given = [
        t if isinstance(t, TracePath) else TracePath(f"path {i}", t)
        for i, t in enumerate(traces, 1)
    ]
    if not given:
        raise DiagramError("traces is empty: give at least one path (or leave traces out)")
    if len(given) > MAX_PATHS:
        raise DiagramError(
            f"{len(given)} paths given: one diagram overlays at most {MAX_PATHS} "
            "(each needs its own colour and numerals to stay readable)"
        )
    labels: list[str] = []
    for tp in given:
        label, k = tp.label, 2
        while label in labels:
            label, k = f"{tp.label} ({k})", k + 1
        labels.append(label)
    out = []
    for i, (tp, label) in enumerate(zip(given, labels, strict=True)):
        if not tp.events:
            raise DiagramError("the path is empty (no transitions)", path=label)
        out.append(_drawn_path(decl, tp.events, label, i))
    return out
