"""Token usage across a turn: per attempt, and the total.

A turn may make several attempts (retries, rotations, fallbacks), and more
than one of them may be billed: a reply stopped by the content filter, a
stream that broke after delivering chunks. `Ledger` notes one `AttemptUsage`
per attempt (target name, model, `Usage` or None when the provider reported
none), and `total` sums those that reported usage.

Where a caller reads it: `GateResult` (what ``gate.run(...)`` and the
namespaces' ``run(...)`` return: a `fsm.TurnResult` plus ``attempts_usage``
and ``usage``), the stream objects (``stream.attempts_usage``,
``stream.usage``, complete once the stream has ended), and a `fsm.TurnFailed`
raised by a wrapper (the same two attributes). The SDK object that
``create()`` returns is left as the SDK made it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import attrs

from ...fsm import Outcome, OutcomeKind, Target, TurnResult
from ...fsm.core.actions import Attempt
from ...fsm.host.observe import AttemptFacts, Telemetry

__all__ = ["AttemptUsage", "GateResult", "Ledger", "Usage", "total", "usage_of"]


@attrs.frozen(slots=True)
class Usage:
    """Token counts in one shape for every API: chat completions and embeddings say
    prompt/completion, the Responses API says input/output (the same numbers)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @property
    def input_tokens(self) -> int:
        return self.prompt_tokens

    @property
    def output_tokens(self) -> int:
        return self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.total_tokens + other.total_tokens,
        )


class AttemptUsage(NamedTuple):
    """One attempt of a turn: which target and model, and what it reported (or None)."""

    target: str
    model: str
    usage: Usage | None


def _count(raw: Any, *names: str) -> int | None:
    for name in names:
        v = raw.get(name) if isinstance(raw, dict) else getattr(raw, name, None)
        if isinstance(v, int) and type(v) is not bool and v >= 0:  # bool: no subclasses
            return v
    return None


def usage_of(reply: Any) -> Usage | None:
    """The usage an SDK object reports: a ChatCompletion or chunk (``usage``), a
    Response or a ``response.completed`` event (``response.usage``), embeddings,
    an error carrying the billed ``completion``; None when there is none."""
    if reply is None:
        return None
    raw = getattr(reply, "usage", None)
    if raw is None:
        inner = getattr(reply, "response", None) or getattr(reply, "completion", None)
        raw = getattr(inner, "usage", None) if inner is not None else None
    if raw is None:
        return None
    prompt = _count(raw, "prompt_tokens", "input_tokens")
    completion = _count(raw, "completion_tokens", "output_tokens")
    everything = _count(raw, "total_tokens")
    if prompt is None and completion is None and everything is None:
        return None
    p, c = prompt or 0, completion or 0
    return Usage(p, c, everything if everything is not None else p + c)


def total(attempts: Iterable[AttemptUsage]) -> Usage | None:
    """The sum over the attempts that reported usage (None when none did)."""
    found = [a.usage for a in attempts if a.usage is not None]
    if not found:
        return None
    out = found[0]
    for u in found[1:]:
        out = out + u
    return out


@attrs.frozen(slots=True)
class GateResult(TurnResult):
    """A `fsm.TurnResult` of a wrapper's turn, with the turn's token usage:
    ``attempts_usage`` (one `AttemptUsage` per attempt, in order) and ``usage``
    (their total over the attempts that reported usage; None when none did)."""

    attempts_usage: tuple[AttemptUsage, ...] = ()

    @property
    def usage(self) -> Usage | None:
        return total(self.attempts_usage)


#: (constructor argument, attribute) of each `TurnResult` field, read once.
_RESULT_FIELDS = tuple((str(f.alias), f.name) for f in attrs.fields(TurnResult))


class Ledger:
    """The attempts of one turn as they happen (one turn: no locking needed)."""

    __slots__ = ("attempts", "target")

    def __init__(self) -> None:
        self.attempts: list[AttemptUsage] = []
        #: The target of the latest attempt (whose provider's quirks classify its failure).
        self.target: Target | None = None

    def begin(self, a: Attempt) -> None:
        self.attempts.append(AttemptUsage(a.target.name, a.target.model, None))
        self.target = a.target

    def note(self, usage: Usage | None) -> None:
        """What the current attempt reported (the latest report wins: some providers
        send running totals)."""
        if usage is not None and self.attempts:
            target, model, _ = self.attempts[-1]
            self.attempts[-1] = AttemptUsage(target, model, usage)

    @property
    def usage(self) -> Usage | None:
        return total(self.attempts)

    def result(self, r: TurnResult) -> GateResult:
        fields = {alias: getattr(r, name) for alias, name in _RESULT_FIELDS}
        return GateResult(**fields, attempts_usage=tuple(self.attempts))

    def telemetry(self, operation: str, *, raw: bool = False) -> Telemetry:
        """The turn's OpenTelemetry description: its GenAI operation, and per attempt
        the usage noted here and the reply's model (`raw`: replies are raw responses)."""

        def describe(o: Outcome) -> AttemptFacts:
            usage = self.attempts[-1].usage if self.attempts else None
            model = None
            if o.kind is OutcomeKind.SUCCESS:
                reply = o.value.parse() if raw else o.value  # the SDK caches the parse
                model = getattr(reply, "model", None)
            return AttemptFacts(
                model if isinstance(model, str) else None,
                usage.prompt_tokens if usage is not None else None,
                usage.completion_tokens if usage is not None else None,
            )

        return Telemetry(operation, describe)

    def attach(self, e: BaseException) -> None:
        """Put the turn's usage on the `TurnFailed` it ended with."""
        attempts = tuple(self.attempts)
        setattr(e, "attempts_usage", attempts)  # noqa: B010 - TurnFailed declares neither
        setattr(e, "usage", total(attempts))  # noqa: B010
