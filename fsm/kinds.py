"""What an attempt produced, classified, and what each kind means to the machine.

The engine never looks at exceptions or HTTP responses: a classifier turns them into
one `Outcome`, and the machine's triggers are the outcome kinds. `TRAITS` holds one row
per kind: policy validation (what may be configured), the declaration (which edges a
kind gets, in which order), `observe` (what is recorded before any guard), the diagrams,
the model checker's event alphabet and the property fuzzers all read it. Adding an
outcome kind means adding its `OutcomeKind` member and its row here; a kind without a
row fails at import.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any, Final

import attrs


class OutcomeKind(enum.StrEnum):
    """The outcome classes; each is a trigger of the machine (its meaning: `fsm.kinds`)."""

    SUCCESS = "success"
    TRANSPORT = "transport"  # timeout, connection reset, DNS, pre-first-byte read errors
    RATE_LIMITED = "rate_limited"  # 429 (with or without Retry-After)
    QUOTA = "quota"  # 429 insufficient_quota, 402
    OVERLOADED = "overloaded"  # 500, 502, 503, 504, 529, 429 "overloaded"
    AUTH = "auth"  # 401, 403
    NOT_FOUND = "not_found"  # 404 model, 400 unknown model
    CONTEXT_TOO_LONG = "context_too_long"
    CONTENT_FILTERED = "content_filtered"
    BAD_REQUEST = "bad_request"  # any other 4xx, and unclassifiable errors
    STREAM_INTERRUPTED = "stream_interrupted"  # failure after the first chunk was delivered
    CANCELLED = "cancelled"  # asyncio cancellation, KeyboardInterrupt


#: Retry-After values are clamped to one day: keeps every sum finite.
MAX_RETRY_AFTER = 86_400.0


def sane_retry_after(value: float | None) -> float | None:
    """None for NaN/non-numbers, 0 for negatives, at most MAX_RETRY_AFTER."""
    if value is None or isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if math.isnan(v):
        return None
    return min(max(v, 0.0), MAX_RETRY_AFTER)


def _outcome_kind(kind: str | OutcomeKind) -> OutcomeKind:
    """`Outcome.kind`'s converter: a kind as it is (every attempt's outcome is built with
    one: the enum's own call takes two Python calls), a string by its value."""
    return kind if type(kind) is OutcomeKind else OutcomeKind(kind)


@attrs.frozen(slots=True)
class Outcome:
    """One classified attempt result.

    `retry_after` is already parsed and sanitised (seconds, finite, >= 0) or
    None. `detail` is a short human text that must never hold a secret; the
    original exception rides along in `error` (excluded from repr/eq).
    `client_side`: the fault is this attempt's, not the target's: the host saw the
    target answer other attempts while this one was out (its connection failed, the
    target is up), the attempt's time ran out before it reached the network (the
    client was busy), or the timer that ended it fired long past its due time (the
    process was starved, so whatever the target did went unobserved). The adapter sets
    it on transport faults; what it changes: `fsm.kinds.Traits.connection_level`.
    `uncontinuable`: why no target can continue this broken stream, for a reason of the
    stream's own (it delivered tool calls, asked for several choices, or had reached its
    end: a text prefix cannot carry it). The host knows it at the break and says so on
    the break's outcome; the turn then fails there with the delivered text, and no
    continuation is asked for (`TurnState.uncontinuable`).
    """

    kind: OutcomeKind = attrs.field(converter=_outcome_kind)
    status: int | None = None
    retry_after: float | None = attrs.field(default=None, converter=sane_retry_after)
    detail: str = ""
    partial: str | None = None
    client_side: bool = False
    uncontinuable: str | None = None
    value: Any = attrs.field(default=None, repr=False, eq=False)
    error: BaseException | None = attrs.field(default=None, repr=False, eq=False)

    @classmethod
    def success(cls, value: Any = None) -> Outcome:
        return cls(OutcomeKind.SUCCESS, value=value)

    @classmethod
    def of(cls, kind: str | OutcomeKind, **kw: Any) -> Outcome:
        return cls(OutcomeKind(kind), **kw)

    @property
    def cause(self) -> str:
        """A short label safe to keep and print (kind and status, never the provider's
        words): what a cooldown remembers as its cause, e.g. ``quota (HTTP 402)``."""
        kind = str.__str__(self.kind)  # the value, without the enum's slower attribute lookup
        return kind if self.status is None else f"{kind} (HTTP {self.status})"


SUCCESS_OUTCOME = Outcome(OutcomeKind.SUCCESS)
CANCELLED_OUTCOME = Outcome(OutcomeKind.CANCELLED, detail="cancelled")


class Phase(enum.StrEnum):
    """Where a turn is on one target; the state name is ``<target>_<phase>``."""

    CALLING = ""  # an attempt is in flight (the state is named after the target alone)
    TRANSPORT_BACKOFF = "transport_backoff"  # backing off after a timeout / connection fault
    RECOVERING = "recovering"  # closing and rebuilding the target's client
    RATE_LIMITED = "rate_limited"  # waiting out a Retry-After (or a credential's cooldown)
    SERVER_BACKOFF = "server_backoff"  # backing off after a server error / overload
    CONTINUING = "continuing"  # resending a committed stream (opt-in continuation)
    COOLING = "cooling"  # waiting for the target to be free: at turn start (every target
    # cooling, this the soonest) or, refused by its breaker, for the breaker's verdict


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
    the network, its timer fired late on a starved process, or the turn's deadline cut
    it short of its `attempt_timeout`) is laid on this
    attempt, not on the target: it counts toward
    no breaker or cooldown, is retried after a backoff rather than recovered from, and
    the retry takes no retry token (the budget stops retry storms against a target
    that is down, not retries to one that answers); the checker feeds it both ways.
    `retry_afters`: the checker feeds this kind with each of these values.
    `statuses`: the HTTP statuses that mean this kind when the body says nothing more;
    `from_status`: so does every status from this one up that no row names (the
    classifier, `status_kind`). `sample_status`: the status of the checker's stand-in
    outcome. `examples`, `handling`, `settings`: the outcome table's prose (what such
    a failure looks like, what the default rule does, the policy fields that tune it),
    rendered by `outcome_table` into README.md and docs/design.md.
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
    statuses: tuple[int, ...] = ()
    from_status: int | None = None
    sample_status: int | None = None
    examples: str = ""
    handling: str = ""
    settings: str = ""

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
    Traits(
        _K.SUCCESS,
        fault=False,
        examples="2xx with a well-formed reply",
        handling="`done`; clears the failure streak and any cooldown of that target and credential",
    ),
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
        statuses=(408, 499),
        examples='connect/read/pool timeout, 499 (a proxy\'s "client closed request"), '
        "connection reset or refused, DNS failure, a stream cut before its first chunk, a "
        "client that could not be built",
        handling="retry the same target with backoff; after "
        "`transport_faults_before_recovery` (2) consecutive faults, or when the attempt "
        "budget is spent, one transport recovery (rebuild the client) per target per turn; "
        "a fault after that falls back. Benches the target once two turns in a row have "
        "left it on hard faults, the last on transport (one turn's faults may be a moment "
        "of the client's own). A *client-side fault* (the target answered other attempts "
        "while this one was out, the attempt never reached the network, its timer fired "
        "late on a starved process, or the turn's deadline cut it short of its "
        "`attempt_timeout`) is retried with backoff up to `max_attempts`, never "
        "recovered from, takes no retry token and counts toward no breaker",
        settings="`transport_faults_before_recovery`, `recover_transport`, `backoff`, "
        "`max_attempts`",
    ),
    Traits(
        _K.RATE_LIMITED,
        Level.CREDENTIAL,
        wait_phase=Phase.RATE_LIMITED,
        bench_span=BenchSpan.BACKOFF,
        default=Rule(retry=True, rotate=True, fall_back=True, cooldown=True),
        retry_afters=_ALL_RA,
        statuses=(420, 429),
        sample_status=429,
        examples='a rate limit, with or without Retry-After; 420 ("enhance your calm")',
        handling="rotate to another free key of the same target; else fall back at once "
        "if a fallback is eligible now; else wait out the Retry-After on the same target "
        "if it is within `retry_after_cap` (30 s) and the deadline; else fail. The key is "
        "benched across turns until its Retry-After (else the backoff)",
        settings="`retry_after_cap`, `prefer_waiting` (wait before falling back)",
    ),
    Traits(
        _K.QUOTA,
        Level.CREDENTIAL,
        bench_span=BenchSpan.COOLDOWN_CAP,
        default=Rule(rotate=True, fall_back=True, cooldown=True),
        statuses=(402,),
        sample_status=429,
        examples="429 `insufficient_quota`, a billing or balance error whatever its status "
        '(400 "credit balance is too low", 400 `billing_hard_limit_reached`, 403 "paid '
        'balance is insufficient"), a per-day limit (Gemini quota id `…PerDay…`, Groq '
        "`(TPD)`, OpenRouter `free-models-per-day`), a request larger than the per-minute "
        "limit itself, a 429 with `x-should-retry: false`, z.ai's usage windows (1308 "
        "five-hour, 1310 weekly)",
        handling="never retried on that key: rotate to another free key, else fall back; "
        "the key is benched across turns until the reset its body names (z.ai's dated "
        "reset) or its provider documents (Gemini's per-day quota: midnight Pacific), else "
        "for `cooldown.cap` (a balance or a day's quota does not come back in seconds: a "
        "Retry-After is not read for it)",
        settings="`cooldown.cap`",
    ),
    Traits(
        _K.OVERLOADED,
        Level.TARGET,
        wait_phase=Phase.SERVER_BACKOFF,
        not_before=True,
        default=Rule(retry=True, fall_back=True, cooldown=True),
        retry_afters=(RetryAfter.ABSENT, RetryAfter.ABOVE_CAP),
        statuses=(409, 425, 500, 502, 503, 504, 529),
        from_status=500,
        sample_status=503,
        examples='429 with an "overloaded" body, a malformed 2xx reply (not the expected '
        'object, no choices, no message, an empty message, `finish_reason: "error"`, a '
        "stream that ends before any content or tool call), a stream error event that says "
        "nothing more specific",
        handling="fall back at once when a fallback is eligible now; otherwise retry the "
        "same target with backoff (never sooner than its Retry-After) up to "
        "`max_attempts`, as long as the Retry-After is within the cap; never rotates (not "
        "the key's fault). Benches the target when the turn leaves it; its circuit breaker "
        "opens when more than `breaker.allowed_failures` (2) turns fail hard on it within "
        "`breaker.window` (60 s), at once on a Retry-After",
        settings="`prefer_waiting` (retry first, then fall back), `backoff`, "
        "`max_attempts`, `breaker`",
    ),
    Traits(
        _K.AUTH,
        Level.CREDENTIAL,
        bench_span=BenchSpan.COOLDOWN_CAP,
        default=Rule(rotate=True, fall_back=True, cooldown=True),
        statuses=(401, 403),
        sample_status=401,
        examples="Gemini's 400 `INVALID_ARGUMENT` with reason `API_KEY_INVALID`, a key "
        "environment variable that is not set",
        handling="rotate (each key at most once), else fall back; never retried on the "
        "same key, never a loop. The key is benched across turns for `cooldown.cap` (a "
        "missing variable is not: setting it works on the next turn)",
        settings="`cooldown.cap`",
    ),
    Traits(
        _K.NOT_FOUND,
        Level.TARGET,
        opens_breaker=True,
        default=Rule(fall_back=True, cooldown=True),
        statuses=(404, 418, 451),
        sample_status=404,
        examples='400 "model … does not exist / unknown model / not supported"; a 3xx '
        "(no redirect is followed), 418 (a proxy or bot filter answering), 451 (unavailable "
        "for legal reasons: this target cannot serve the request)",
        handling="fall back, no retry; opens the target's circuit breaker at once",
    ),
    Traits(
        _K.CONTEXT_TOO_LONG,
        narrows_context=True,
        default=Rule(fall_back=True),
        statuses=(413,),
        sample_status=400,
        examples="`context_length_exceeded`, llama.cpp's `exceed_context_size_error`, every "
        'overflow wording in the catalogue ("maximum context length", "prompt is too '
        'long", "exceeds the available context size", "input token count … exceeds the '
        'maximum", …)',
        handling="fall back to the next target whose known `context_length` is larger "
        "than the one that overflowed (known smaller windows are skipped); then to targets "
        "of unknown `context_length`, in chain order; else fail",
        settings="`context_length` of each target",
    ),
    Traits(
        _K.CONTENT_FILTERED,
        sample_status=400,
        examples="content policy / content filter errors, a reply stopped by the content filter",
        handling="fail (`rules.content_filtered.fall_back = true` tries the next target)",
    ),
    Traits(
        _K.BAD_REQUEST,
        from_status=400,
        sample_status=400,
        examples="a reply cut at the output-token limit, an error that cannot be classified",
        handling="fail fast: no retry, no fallback",
    ),
    Traits(
        _K.STREAM_INTERRUPTED,
        wait_phase=Phase.CONTINUING,
        retry_first=True,
        retry_switch="continue_streams",
        committed=True,
        default=Rule(retry=True),
        examples="an error after the first chunk of a stream reached the caller: a cut, a "
        "stall past `stream_idle_timeout`, an error event",
        handling="the turn is committed: never replayed. It is *continued*: the delivered "
        "text is sent as an assistant prefix to the same target if it takes one "
        "(`assistant_prefix`) and is healthy, else to the next eligible target that takes "
        "one, and the caller's stream goes on from where it broke; with none, the turn "
        "fails with the partial output attached (`TurnFailed.partial`) and the break as "
        "its error (a continuation's own refusal is only that target's reason)",
        settings="`continue_streams`, `assistant_prefix` of each target, `max_attempts`",
    ),
    Traits(
        _K.CANCELLED,
        fault=False,
        examples="asyncio cancellation, `KeyboardInterrupt`",
        handling="`aborted` at once (even in the middle of a wait), re-raised to the caller",
    ),
)


def _table(rows: tuple[Traits, ...]) -> Mapping[OutcomeKind, Traits]:
    table = {r.kind: r for r in rows}
    missing = [k.value for k in OutcomeKind if k not in table]
    if missing or len(table) != len(rows):
        raise ImportError(f"fsm.kinds: every OutcomeKind needs exactly one row; missing {missing}")
    for r in rows:
        if r.default.retry and not r.may_retry:
            raise ImportError(f"fsm.kinds: {r.kind.value}'s default retries but it has no phase")
        if r.default.rotate and not r.may_rotate:
            raise ImportError(f"fsm.kinds: {r.kind.value}'s default rotates at {r.level.value}")
    statuses = [s for r in rows for s in r.statuses]
    floors = [r.from_status for r in rows if r.from_status is not None]
    if len(set(statuses)) != len(statuses) or len(set(floors)) != len(floors):
        raise ImportError("fsm.kinds: an HTTP status may mean one kind only")
    return table


#: The traits of every outcome kind.
TRAITS: Final[Mapping[OutcomeKind, Traits]] = _table(_ROWS)

#: The kinds an attempt can fail with (every kind but success and cancellation).
FAULT_KINDS: Final[tuple[OutcomeKind, ...]] = tuple(r.kind for r in _ROWS if r.fault)

#: The default rule of every fault kind.
DEFAULT_RULES: Final[Mapping[OutcomeKind, Rule]] = {k: TRAITS[k].default for k in FAULT_KINDS}

#: The kinds that are a credential's fault (a rotation may follow them).
CREDENTIAL_KINDS: Final[tuple[OutcomeKind, ...]] = tuple(
    k for k in FAULT_KINDS if TRAITS[k].level is Level.CREDENTIAL
)

_STATUS_KINDS: Final = {s: r.kind for r in _ROWS for s in r.statuses}
_FLOORS: Final = sorted(((r.from_status, r.kind) for r in _ROWS if r.from_status), reverse=True)


def status_kind(status: int) -> OutcomeKind:
    """The kind an HTTP error status means when the body says nothing more: a row's
    `statuses`, else the row with the highest `from_status` at or below it, else
    bad_request."""
    kind = _STATUS_KINDS.get(status)
    if kind is not None:
        return kind
    return next((k for floor, k in _FLOORS if status >= floor), OutcomeKind.BAD_REQUEST)


def _statuses_cell(r: Traits) -> str:
    parts = [str(s) for s in r.statuses]
    if r.from_status is not None:
        parts.append(f"any other {r.from_status // 100}xx")
    return ", ".join(parts) or "—"


def _rules_cell(r: Traits) -> str:
    """The rule switches the kind accepts (`fsm.policy.checks`), on by default in bold."""
    if not r.fault:
        return "—"
    allowed = {
        "retry": r.may_retry,
        "rotate": r.may_rotate,
        "fall_back": r.may_fall_back,
        "cooldown": r.level is not Level.NONE,  # accepted elsewhere, but benches nothing
    }
    cells = [
        f"**`{name}`**" if getattr(r.default, name) else f"`{name}`"
        for name, ok in allowed.items()
        if ok
    ]
    if r.retry_switch is not None:
        cells = [c + f" (with `{r.retry_switch}`)" if "retry" in c else c for c in cells]
    return ", ".join(cells) + (f"; {r.settings}" if r.settings else "")


def outcome_table() -> str:
    """The outcome table of README.md and docs/design.md, as Markdown (one row per kind;
    tests/test_kinds.py fails when a pasted copy drifts)."""
    lines = [
        "| outcome | HTTP status | examples | default handling "
        "| rules (**on** by default); settings |",
        "|---|---|---|---|---|",
    ]
    for r in _ROWS:
        cells = (f"`{r.kind.value}`", _statuses_cell(r), r.examples, r.handling, _rules_cell(r))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


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
