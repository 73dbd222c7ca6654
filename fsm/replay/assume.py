"""What a replay assumes where the recording cannot answer: the ``--assume`` rules, and each
assumption made.

`Assume` is the rule a user gives per target (``recorded``, ``unknown`` or
``KIND:SECONDS[:RETRY_AFTER]``), parsed and validated here so the command line and
the Python API refuse the same bad rules with the same words; `Assumption` is what
the report lists for every answer that was not the recorded one. The order in which
a replay tries the recording and then these rules is `fsm.replay.player`'s docstring.
"""

from __future__ import annotations

import math
from typing import Any, Final

import attrs

from ..kinds import OutcomeKind

__all__ = ["UNKNOWN", "Assume", "Assumption"]

KIND_NAMES: Final = frozenset(k.value for k in OutcomeKind)
UNKNOWN: Final = "unknown"


def _seconds(text: str, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{what} must be a number of seconds, not {text!r}") from None
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{what} must be a finite number of seconds >= 0, not {text!r}")
    return v


@attrs.frozen(slots=True)
class Assume:
    """What to assume for a request the recording cannot answer (see the module)."""

    kind: str
    latency: float = 0.0
    retry_after: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.kind not in KIND_NAMES | {"recorded", UNKNOWN} or self.kind == "cancelled":
            raise ValueError(
                f"assumption {self.kind!r}: expected recorded, unknown or an outcome kind "
                f"({', '.join(sorted(KIND_NAMES - {'cancelled'}))})"
            )

    @classmethod
    def parse(cls, text: str | Assume) -> Assume:
        """``recorded``, ``unknown``, ``KIND:SECONDS`` or ``KIND:SECONDS:RETRY_AFTER``."""
        if isinstance(text, Assume):
            return text
        parts = text.strip().split(":")
        if parts[0] in ("recorded", UNKNOWN):
            if len(parts) > 1:
                raise ValueError(f"assumption {text!r}: {parts[0]} takes no seconds")
            return cls(parts[0])
        if not 2 <= len(parts) <= 3:
            raise ValueError(
                f"assumption {text!r}: expected KIND:SECONDS[:RETRY_AFTER] (e.g. success:0.4), "
                "recorded or unknown"
            )
        ra = _seconds(parts[2], "Retry-After") if len(parts) == 3 else None
        return cls(parts[0], _seconds(parts[1], "the latency"), ra)

    def __str__(self) -> str:
        if self.kind in ("recorded", UNKNOWN):
            return self.kind
        ra = f":{self.retry_after:g}" if self.retry_after is not None else ""
        return f"{self.kind}:{self.latency:g}{ra}"


@attrs.frozen(slots=True)
class Assumption:
    """A request the recording did not answer as such, and what the replay assumed."""

    turn: str
    at: float  # seconds into the turn
    target: str  # the replayed policy's target name
    backend: str  # its label (model, or model@endpoint)
    what: str

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)
