"""A replay's result: each turn as recorded and as replayed, the totals, and the report text.

Plain data the engine (`fsm.replay.player`) fills in, with its two renderings: the table
`fallgate replay` prints and the JSON of ``--json``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ..trace import TraceEvent
from .assume import UNKNOWN, Assumption

__all__ = ["Path", "ReplayReport", "TurnReport"]


@attrs.frozen(slots=True)
class Path:
    """One turn's run, recorded or replayed."""

    seconds: float
    requests: Mapping[str, int]
    end: str
    waits: tuple[float, ...]
    trace: tuple[TraceEvent, ...] = attrs.field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "requests": dict(self.requests),
            "end": self.end,
            "waits": list(self.waits),
        }


@attrs.frozen(slots=True)
class TurnReport:
    """One turn: as recorded, as replayed, and what the replay assumed."""

    turn: str
    start: float  # seconds after the first turn started
    recorded: Path
    replayed: Path
    assumptions: tuple[Assumption, ...]
    stopped: str | None = None

    @property
    def same_path(self) -> bool:
        """The replay took the recorded transitions, one for one (times aside)."""
        a, b = self.recorded.trace, self.replayed.trace
        return len(a) == len(b) and all(x.same_step(y) for x, y in zip(a, b, strict=True))

    @property
    def saved(self) -> float | None:
        """Seconds the replay answered sooner (None: the replay stopped, unknown)."""
        if self.stopped is not None:
            return None
        return round(self.recorded.seconds - self.replayed.seconds, 6)

    def as_dict(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "start": round(self.start, 6),
            "recorded": self.recorded.as_dict(),
            "replayed": {**self.replayed.as_dict(), "stopped": self.stopped},
            "assumptions": [a.as_dict() for a in self.assumptions],
            "same_path": self.same_path,
            "saved_seconds": self.saved,
        }


def _total(paths: Iterable[Path]) -> dict[str, Any]:
    seconds = 0.0
    requests: dict[str, int] = {}
    ends: dict[str, int] = {}
    for p in paths:
        seconds += p.seconds
        for k, n in p.requests.items():
            requests[k] = requests.get(k, 0) + n
        ends[p.end] = ends.get(p.end, 0) + 1
    return {"seconds": round(seconds, 6), "requests": requests, "ends": ends}


@attrs.frozen(slots=True)
class ReplayReport:
    """Every turn, recorded and replayed, and the totals."""

    turns: tuple[TurnReport, ...]
    seed: int

    @property
    def assumptions(self) -> tuple[Assumption, ...]:
        return tuple(a for t in self.turns for a in t.assumptions)

    @property
    def recorded(self) -> dict[str, Any]:
        """Totals as recorded: seconds (summed over turns), requests per backend, ends."""
        return _total(t.recorded for t in self.turns)

    @property
    def replayed(self) -> dict[str, Any]:
        return _total(t.replayed for t in self.turns)

    def text(self) -> str:
        """The report as a table: per turn and in total, then waits and assumptions."""
        rows = [("turn", "start", "recorded", "replayed", "saved", "requests recorded", "replayed")]

        def reqs(r: Mapping[str, int]) -> str:
            return ", ".join(f"{k} {n}" for k, n in sorted(r.items())) or "-"

        for t in self.turns:
            rows.append(
                (
                    t.turn,
                    f"+{t.start:.1f}s",
                    f"{t.recorded.seconds:.3f}s {t.recorded.end}",
                    f"{t.replayed.seconds:.3f}s {t.replayed.end}",
                    f"{t.saved:.3f}s" if t.saved is not None else "?",
                    reqs(t.recorded.requests),
                    reqs(t.replayed.requests),
                )
            )
        a, b = self.recorded, self.replayed

        def ends(e: Mapping[str, int]) -> str:
            return ", ".join(f"{n} {k}" for k, n in sorted(e.items()))

        rows.append(
            (
                "total",
                "",
                f"{a['seconds']:.3f}s {ends(a['ends'])}",
                f"{b['seconds']:.3f}s {ends(b['ends'])}",
                f"{a['seconds'] - b['seconds']:.3f}s" if UNKNOWN not in b["ends"] else "?",
                reqs(a["requests"]),
                reqs(b["requests"]),
            )
        )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
        waits = [
            f"  {t.turn}: recorded {_list(t.recorded.waits)}; replayed {_list(t.replayed.waits)}"
            for t in self.turns
            if t.recorded.waits or t.replayed.waits
        ]
        if waits:
            lines += ["", "waits (seconds):", *waits]
        same = sum(t.same_path for t in self.turns)
        lines += ["", f"{same} of {len(self.turns)} turns took their recorded path"]
        found = self.assumptions
        lines += ["", f"assumptions ({len(found)}):" if found else "assumptions: none"]
        lines += [f"  {x.turn} +{x.at:.3f}s {x.target} ({x.backend}): {x.what}" for x in found]
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "recorded": self.recorded,
            "replayed": {**self.replayed, "assumptions": [a.as_dict() for a in self.assumptions]},
            "turns": [t.as_dict() for t in self.turns],
        }


def _list(xs: Iterable[float]) -> str:
    return " ".join(f"{x:.3f}" for x in xs) or "-"
