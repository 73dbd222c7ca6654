"""The host loops' observation hook: who may watch a turn, and what its caller tells them.

The host loops (`fsm.host.loop`) check `ACTIVE` once per turn: None (the default) costs
nothing more; an `Observer` is handed the turn and the attempt callable and gives back the
ones to run (the same protocol, recorded). `fsm.telemetry.otel.enable` installs its
instruments here: the hook lives with the host loops, below the tools that use it, so the
loops never import telemetry.

`Telemetry` is what a turn's caller knows beyond the engine (its GenAI operation, how to
read a reply's usage); `AttemptFacts` is what one reply said.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol

import attrs

from ..core.actions import Attempt
from ..kinds import Outcome

if TYPE_CHECKING:
    from ..core.turn import TurnBase

__all__ = ["ACTIVE", "AttemptFacts", "Observer", "Telemetry"]


class AttemptFacts(NamedTuple):
    """What an attempt's reply said, as far as the caller can tell (None: unknown)."""

    response_model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


@attrs.frozen(slots=True)
class Telemetry:
    """What a turn's caller knows beyond the engine, for its telemetry.

    `operation` is the GenAI operation name (``"chat"``, ``"embeddings"``): with it
    the turn's span is named ``"{operation} {model}"``, without it ``fallgate.turn``.
    `describe(outcome)` says what an attempt's reply reported (response model, token
    usage); without it the reply (or a billed error's ``completion``) is read the
    way the openai SDK shapes it (``model``, ``usage``).
    """

    operation: str | None = None
    describe: Callable[[Outcome], AttemptFacts] | None = None


class Observer(Protocol):
    """Watches turns: wraps a turn (and its attempt callable) in ones that record them."""

    def observe(
        self,
        turn: TurnBase,
        attempt: Callable[[Attempt], Outcome] | None,
        telemetry: Telemetry | None,
    ) -> tuple[TurnBase, Callable[[Attempt], Outcome] | None]: ...

    def aobserve(
        self,
        turn: TurnBase,
        attempt: Callable[[Attempt], Awaitable[Outcome]] | None,
        telemetry: Telemetry | None,
    ) -> tuple[TurnBase, Callable[[Attempt], Awaitable[Outcome]] | None]: ...


#: The observer in force, or None (the host loops' one check per turn).
ACTIVE: Observer | None = None
