"""What the core asks its host to do next.

Drivers carry these out and feed back what happened: an `Outcome` after an
`Attempt`, `waited` after a `Wait`, `rebuilt`/`rebuild_failed` after a
`Rebuild`. `Finish` and `Fail` end the turn.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from .errors import TurnFailed
    from .policy import Credential, Target


@attrs.frozen(slots=True)
class Attempt:
    """Call `target` with `credential`; `timeout` is what is left of the deadline.

    `probe`: the target's breaker is half-open and this attempt probes it; `retry`: another
    attempt on the same target in this turn (it spends the retry budget). Either needs the
    health store's grant before it goes out (`HealthStore.grant`; refused: feed
    ``denied``). `until_deadline`: the seconds left of the turn's deadline (at least
    `timeout`): a host that holds the attempt back before it starts (a client that limits
    its attempts in flight) holds it at most this long."""

    target: Target
    credential: Credential
    timeout: float
    number: int  # 1-based attempt number within the turn
    probe: bool = False
    retry: bool = False
    until_deadline: float = math.inf


@attrs.frozen(slots=True)
class Wait:
    """Sleep `seconds` (interruptibly), then feed `waited`."""

    seconds: float
    reason: str


@attrs.frozen(slots=True)
class Rebuild:
    """Close and recreate `target`'s client (transport recovery), then feed `rebuilt`."""

    target: Target


@attrs.frozen(slots=True)
class Finish:
    """The turn is done; `result` is the successful attempt's value."""

    result: Any = attrs.field(repr=False)


@attrs.frozen(slots=True)
class Fail:
    """The turn ended in `failed` or `aborted`; `error` says why, per target."""

    error: TurnFailed


Action = Attempt | Wait | Rebuild | Finish | Fail
