"""Errors fallgate raises to its users. Their text never holds a secret."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from .kinds import Outcome
    from .trace import TraceEvent


@attrs.frozen(slots=True)
class Problem:
    """One bad field of a policy: where it is, what it held, what is wrong."""

    path: str
    value: str  # a repr: key fields never shown, key-shaped values masked (fsm.redact)
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        shown = f" = {self.value}" if self.value else ""
        return f"{where}{self.path}{shown}: {self.message}"


class PolicyError(ValueError):
    """A policy failed validation; lists every bad field at once."""

    def __init__(self, problems: Sequence[Problem], source: str | None = None) -> None:
        self.problems = tuple(problems)
        self.source = source
        head = f"invalid policy{f' in {source}' if source else ''}"
        n = len(self.problems)
        lines = [f"{head} ({n} problem{'s' if n != 1 else ''}):"]
        lines += [f"  {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class MissingCredential(LookupError):
    """A credential's environment variable is not set (the name is safe to show)."""

    def __init__(self, env: str, target: str, why: str = "is not set or empty") -> None:
        self.env = env
        self.target = target
        super().__init__(f"environment variable {env!r} (credential of target {target!r}) {why}")


class TurnFailed(Exception):
    """A turn ended in `failed` (or `aborted`).

    `reasons` maps every target of the chain to why it did not answer: the
    last outcome it produced in this turn, or why it was not eligible.
    `partial` holds text already delivered by a committed, broken stream.
    """

    def __init__(
        self,
        summary: str,
        *,
        state: str = "failed",
        reasons: Mapping[str, str] | None = None,
        last_outcome: Outcome | None = None,
        partial: str | None = None,
        trace: Sequence[TraceEvent] = (),
    ) -> None:
        self.summary = summary
        self.state = state
        self.reasons = dict(reasons or {})
        self.last_outcome = last_outcome
        self.partial = partial
        self.trace: tuple[TraceEvent, ...] = tuple(trace)
        super().__init__(self._text())

    def _text(self) -> str:
        parts = [f"turn {self.state}: {self.summary}"]
        for target, why in self.reasons.items():
            parts.append(f"  {target}: {why}")
        if self.partial:
            n = len(self.partial)
            parts.append(f"  partial output: {n} character{'s' if n != 1 else ''} delivered")
        return "\n".join(parts)

    @property
    def last_error(self) -> BaseException | None:
        """The exception behind the last outcome, if any (may hold provider text)."""
        return None if self.last_outcome is None else self.last_outcome.error

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_turn_failed, (self.summary, self.state, self.reasons, self.partial))


def _rebuild_turn_failed(
    summary: str, state: str, reasons: dict[str, str], partial: str | None
) -> TurnFailed:
    return TurnFailed(summary, state=state, reasons=reasons, partial=partial)
