"""What each outcome kind means to the machine (one row per kind), and its fixed names.

Policy validation (what may be configured), the declaration (which edges a kind
gets, in which order), `observe` (what is recorded before any guard), the
diagrams, the model checker's event alphabet and the property fuzzers all read
`TRAITS`. Adding an outcome kind means adding its `OutcomeKind` member and its row
here; a kind without a row fails at import.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

import attrs

from .outcomes import OutcomeKind


class Phase(enum.StrEnum):
    """Where a turn is on one target; the state name is ``<target>_<phase>``."""

    CALLING = ""  # an attempt is in flight (the state is named after the target alone)
    TRANSPORT_BACKOFF = "transport_backoff"  # backing off after a timeout / connection fault
    RECOVERING = "recovering"  # closing and rebuilding the target's client
    RATE_LIMITED = "rate_limited"  # waiting out a Retry-After (or a credential's cooldown)
    SERVER_BACKOFF = "server_backoff"  # backing off after a server error / overload
    CONTINUING = "continuing"  # resending a committed stream (opt-in continuation)
    COOLING = "cooling"  # turn start: every target cooling, waiting for this, the soonest


class Level(enum.Enum):
    """Whose fault an outcome is: decides what gets benched and whether rotation helps."""

    CREDENTIAL = "credential"  # the key: bench the key, rotation may help
    TARGET = "target"  # the provider/model: bench the target, rotation cannot help
    NONE = "none"  # the request or the caller: bench nothing


class RetryAfter(enum.Enum):
    """The checker's abstract Retry-After values (each becomes one event of its alphabet)."""

    ABSENT = "absent"
    ZERO = "zero"
    BELOW_CAP = "below_cap"
    ABOVE_CAP = "above_cap"


class BenchSpan(enum.Enum):
    """How long a credential is benched when the outcome carries no Retry-After."""

    BACKOFF = "the backoff ceiling"
    COOLDOWN_CAP = "the cooldown cap"


@attrs.frozen(slots=True)
class Rule:
    """How one outcome class is handled: retry the same target, rotate the
    credential, fall back to the next eligible target, and whether it puts
    the target (or credential) into a cross-turn cooldown. With none of the
    first three the turn fails."""

    retry: bool = False
    rotate: bool = False
    fall_back: bool = False
    cooldown: bool = False


@attrs.frozen(slots=True)
class Traits:
    """One outcome kind's meaning.

    `fault`: it ends an attempt unsuccessfully (not success, not cancellation).
    `wait_phase`: where a same-target retry goes (None: never retried).
    `retry_first`: the retry edge is tried before the fallbacks whatever
    `prefer_waiting` says (transport blips and stream continuations); otherwise a
    retry that waits comes after the fallbacks unless the policy prefers waiting.
    `retry_switch`: a policy flag that must be on for `retry` to be allowed.
    `committed`: output already reached the caller; never replayed elsewhere.
    `streak`: counts toward the transport-fault streak (others reset it).
    `bench_span`: for credential-level kinds, the bench length without Retry-After.
    `not_before`: a Retry-After on this kind holds the whole target back.
    `narrows_context`: later targets must have a larger context_length.
    `opens_breaker`: one such failure opens the target's circuit breaker at once (a
    model that is not there will not be there in a second); other hard failures count
    toward `breaker.allowed_failures`.
    `cool_after`: with its rule's `cooldown` on, the target is benched once this many
    turns in a row (no success between) left it on hard faults, this kind the last.
    `connection_level`: an outcome of this kind marked `Outcome.client_side` (the
    target answered other attempts while this one was out, the attempt never reached
    the network, or its timer fired late on a starved process) is laid on this
    attempt, not on the target: it counts toward
    no breaker or cooldown, is retried after a backoff rather than recovered from, and
    the retry takes no retry token (the budget stops retry storms against a target
    that is down, not retries to one that answers); the checker feeds it both ways.
    `retry_afters`: the checker feeds this kind with each of these values.
    """

    kind: OutcomeKind
    level: Level = Level.NONE
    fault: bool = True
    wait_phase: Phase | None = None
    retry_first: bool = False
    retry_switch: str | None = None
    committed: bool = False
    streak: bool = False
    bench_span: BenchSpan | None = None
    not_before: bool = False
    narrows_context: bool = False
    opens_breaker: bool = False
    cool_after: int = 1
    connection_level: bool = False
    default: Rule = Rule()
    retry_afters: tuple[RetryAfter, ...] = (RetryAfter.ABSENT,)
    examples: str = ""

    @property
    def may_retry(self) -> bool:
        return self.wait_phase is not None

    @property
    def may_rotate(self) -> bool:
        return self.level is Level.CREDENTIAL

    @property
    def may_fall_back(self) -> bool:
        return self.fault and not self.committed


_K = OutcomeKind
_ALL_RA = tuple(RetryAfter)

_ROWS: Final = (
    Traits(_K.SUCCESS, fault=False, examples="2xx"),
    Traits(
        _K.TRANSPORT,
        Level.TARGET,
        wait_phase=Phase.TRANSPORT_BACKOFF,
        retry_first=True,
        streak=True,
        # one turn's transport faults may be a moment of the client's own (one that could
        # not be built, regression scenario 1); a second turn in a row means the target
        cool_after=2,
        connection_level=True,
        default=Rule(retry=True, fall_back=True, cooldown=True),
        examples="read/connect/pool timeout, connection reset, DNS, a cut before the first byte",
    ),
    Traits(
        _K.RATE_LIMITED,
        Level.CREDENTIAL,
        wait_phase=Phase.RATE_LIMITED,
        bench_span=BenchSpan.BACKOFF,
        default=Rule(retry=True, rotate=True, fall_back=True, cooldown=True),
        retry_afters=_ALL_RA,
        examples="429 with or without Retry-After",
    ),
    Traits(
        _K.QUOTA,
        Level.CREDENTIAL,
        bench_span=BenchSpan.COOLDOWN_CAP,
        default=Rule(rotate=True, fall_back=True, cooldown=True),
        examples="429 insufficient_quota, 402",
    ),
    Traits(
        _K.OVERLOADED,
        Level.TARGET,
        wait_phase=Phase.SERVER_BACKOFF,
        not_before=True,
        default=Rule(retry=True, fall_back=True, cooldown=True),
        retry_afters=(RetryAfter.ABSENT, RetryAfter.ABOVE_CAP),
        examples='500, 502, 503, 504, 529, 429 with an "overloaded" body',
    ),
    Traits(
        _K.AUTH,
        Level.CREDENTIAL,
        bench_span=BenchSpan.COOLDOWN_CAP,
        default=Rule(rotate=True, fall_back=True, cooldown=True),
        examples="401, 403",
    ),
    Traits(
        _K.NOT_FOUND,
        Level.TARGET,
        opens_breaker=True,
        default=Rule(fall_back=True, cooldown=True),
        examples="404 model, 400 unknown model",
    ),
    Traits(
        _K.CONTEXT_TOO_LONG,
        narrows_context=True,
        default=Rule(fall_back=True),
        examples="context_length_exceeded",
    ),
    Traits(_K.CONTENT_FILTERED, examples="content policy"),
    Traits(_K.BAD_REQUEST, examples="any other 4xx; an unclassifiable error"),
    Traits(
        _K.STREAM_INTERRUPTED,
        wait_phase=Phase.CONTINUING,
        retry_first=True,
        retry_switch="continue_streams",
        committed=True,
        examples="an error after the first chunk reached the caller",
    ),
    Traits(_K.CANCELLED, fault=False, examples="asyncio cancellation, KeyboardInterrupt"),
)


def _table(rows: tuple[Traits, ...]) -> Mapping[OutcomeKind, Traits]:
    table = {r.kind: r for r in rows}
    missing = [k.value for k in OutcomeKind if k not in table]
    if missing or len(table) != len(rows):
        raise ImportError(f"fsm.traits: every OutcomeKind needs exactly one row; missing {missing}")
    for r in rows:
        if r.default.retry and not r.may_retry:
            raise ImportError(f"fsm.traits: {r.kind.value}'s default retries but it has no phase")
        if r.default.rotate and not r.may_rotate:
            raise ImportError(f"fsm.traits: {r.kind.value}'s default rotates at {r.level.value}")
    return table


#: The traits of every outcome kind.
TRAITS: Final[Mapping[OutcomeKind, Traits]] = _table(_ROWS)

#: The kinds an attempt can fail with (every kind but success and cancellation).
FAULT_KINDS: Final[tuple[OutcomeKind, ...]] = tuple(r.kind for r in _ROWS if r.fault)

#: The default rule of every fault kind.
DEFAULT_RULES: Final[Mapping[OutcomeKind, Rule]] = {k: TRAITS[k].default for k in FAULT_KINDS}


# -- the machine's fixed names (states and internal triggers) -------------------------------------

IDLE: Final = "idle"
DONE: Final = "done"
FAILED: Final = "failed"
ABORTED: Final = "aborted"
TERMINALS: Final = (DONE, FAILED, ABORTED)

START: Final = "start"  # the host starts the turn
WAITED: Final = "waited"  # the host finished a Wait
REBUILT: Final = "rebuilt"  # the host rebuilt a client
REBUILD_FAILED: Final = "rebuild_failed"  # ... and that failed
DENIED: Final = "denied"  # the health store refused an attempt (probe lease taken, no retry token)
SUCCESS: Final = OutcomeKind.SUCCESS.value
CANCELLED: Final = OutcomeKind.CANCELLED.value
