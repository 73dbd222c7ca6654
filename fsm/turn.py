"""The pure core: one turn, fed events, returning actions.

`TurnState` holds everything per-turn (nothing per-turn lives anywhere else,
so nothing can leak into the next turn). The guards and effects below give
the names in the declaration (`machine.py`) their meaning; two executors run
that declaration with exactly the same guards and effects:

* `Turn` — a table compiled from the declaration (the default, fast path);
* `TransitionsTurn` — a real `transitions.Machine` built once per policy.

No I/O, no sleeping, no wall clock, no global randomness: clock and random
source are injected.
"""

from __future__ import annotations

import random as _random
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

from . import clock as _clock
from .actions import Action, Attempt, Fail, Finish, Rebuild, Wait
from .backoff import backoff_delay, cooldown_for, exp_cap
from .errors import TurnFailed
from .health import HealthStore
from .machine import (
    ABORTED,
    CANCELLED,
    DONE,
    FAILED,
    IDLE,
    REBUILD_FAILED,
    REBUILT,
    START,
    WAITED,
    Declaration,
    Transition,
    _cache,
    declare,
)
from .outcomes import CANCELLED as CANCELLED_OUTCOME
from .outcomes import Outcome, OutcomeKind
from .policy import Credential, Policy, Target
from .trace import TraceEvent

Hook = Callable[[TraceEvent], None]
_UNSET: Final = -2
_CRED_LEVEL = (OutcomeKind.RATE_LIMITED, OutcomeKind.QUOTA, OutcomeKind.AUTH)
_TARGET_LEVEL = (OutcomeKind.OVERLOADED, OutcomeKind.NOT_FOUND, OutcomeKind.TRANSPORT)
_KINDS: Final = {k.value: k for k in OutcomeKind}
_SUCCESS: Final = OutcomeKind.SUCCESS
_CANCELLED: Final = OutcomeKind.CANCELLED
_TRANSPORT: Final = OutcomeKind.TRANSPORT
_RATE_LIMITED: Final = OutcomeKind.RATE_LIMITED
_OVERLOADED: Final = OutcomeKind.OVERLOADED
_STREAM: Final = OutcomeKind.STREAM_INTERRUPTED
_CONTEXT: Final = OutcomeKind.CONTEXT_TOO_LONG


class ProtocolError(RuntimeError):
    """The host fed an event the machine does not declare in the current state."""


class TurnState:
    """All per-turn facts. Created fresh for every turn."""

    __slots__ = (
        "_events",
        "_first",
        "_next",
        "_raw",
        "_skips",
        "action",
        "at",
        "attempt_at",
        "attempts",
        "clock",
        "cred",
        "cred_nb",
        "ctx_floor",
        "decl",
        "health",
        "hook",
        "outcome",
        "partial",
        "policy",
        "random",
        "reasons",
        "recovered",
        "rotations",
        "rr",
        "seq",
        "spent",
        "started",
        "state",
        "streak",
        "target_nb",
        "ti",
        "total_attempts",
        "tried",
        "waited",
    )

    def __init__(
        self,
        policy: Policy,
        health: HealthStore,
        clock: Callable[[], float],
        random: Callable[[], float],
        hook: Hook | None,
    ) -> None:
        self.policy = policy
        self.decl: Declaration = declare(policy)
        self.health = health
        self.clock = clock
        self.random = random
        self.hook = hook
        self.state = IDLE
        self.ti = -1
        self.cred: Credential | None = None
        self.attempts = 0
        self.attempt_at = 0.0
        self.total_attempts = 0
        self.streak = 0
        self.recovered = False
        self.rotations = 0
        self.rr = 0
        self.spent: set[str] = set()
        self.cred_nb: dict[tuple[int, str], float] = {}
        self.target_nb = 0.0
        self.tried: list[int] = []
        # Why each target did not answer; (attempts, outcome) is formatted at failure time.
        self.reasons: dict[str, str | tuple[int, Outcome | None]] = {}
        self._skips: dict[int, str] = {}
        self.started = self.at = clock()  # `at`: the clock, read once per event
        self.waited = 0.0
        self.outcome: Outcome | None = None
        self.partial: str | None = None
        self.ctx_floor: int | None = None
        self._raw: list[tuple[Any, ...]] = []
        self._events: list[TraceEvent] = []
        self.seq = 0
        self._next = _UNSET
        self._first = _UNSET
        self.action: Action | None = None

    # -- helpers ---------------------------------------------------------------------------
    @property
    def target(self) -> Target:
        return self.policy.targets[self.ti]

    @property
    def trace(self) -> list[TraceEvent]:
        """One `TraceEvent` per transition so far (built on first look)."""
        events = self._events
        for raw in self._raw[len(events) :]:
            events.append(_event(self, raw))
        return events

    def elapsed(self) -> float:
        return self.at - self.started

    def fits_deadline(self, wait: float) -> bool:
        return self.elapsed() + wait <= self.policy.deadline

    def cred_free_at(self, ti: int, c: Credential) -> float:
        t = self.policy.targets[ti]
        return max(self.health.credential_until(t.key, c.id), self.cred_nb.get((ti, c.id), 0.0))

    def free_credential(self, exclude: str | None = None) -> Credential | None:
        """First usable credential of the current target, in pool order."""
        pool = self.target.pool()
        now = self.at
        size = len(pool)
        for k in range(size):
            c = pool[(self.rr + k) % size]
            if c.id == exclude or c.id in self.spent:
                continue
            if self.cred_free_at(self.ti, c) <= now:
                return c
        return None

    def earliest_free(self) -> tuple[float, Credential | None]:
        """When the current target can next be called, and with which credential."""
        best: tuple[float, Credential | None] = (float("inf"), None)
        t = self.target
        floor = max(self.target_nb, self.health.target_until(t.key))
        pool = t.pool()
        size = len(pool)
        for k in range(size):
            c = pool[(self.rr + k) % size]
            if c.id in self.spent:
                continue
            at = max(floor, self.cred_free_at(self.ti, c))
            if at < best[0]:
                best = (at, c)
        return best

    def target_ready_at(self, j: int) -> float:
        t = self.policy.targets[j]
        creds = min(self.health.credential_until(t.key, c.id) for c in t.pool())
        return max(self.health.target_until(t.key), creds)

    def ineligible(self, j: int, now: float) -> str | None:
        """Why target j cannot be entered now (None if it can)."""
        t = self.policy.targets[j]
        for k in self.tried:
            if k != j and self.policy.targets[k].same_as(t):
                return f"skipped: identical to {self.policy.targets[k].name}"
        if self.ctx_floor is not None:
            if t.context_length is None:
                return f"skipped: context_length unknown (needs > {self.ctx_floor})"
            if t.context_length <= self.ctx_floor:
                return f"skipped: context_length {t.context_length} <= {self.ctx_floor}"
        ready = self.target_ready_at(j)
        if ready > now:
            return f"skipped: cooling for {ready - now:.1f}s"
        return None

    def next_eligible(self) -> int:
        """The fallback to take now (-1 if none); cached per event."""
        if self._next != _UNSET:
            return self._next
        now = self.at
        self._skips = {}
        found = -1
        for j in range(self.ti + 1, len(self.policy.targets)):
            why = self.ineligible(j, now)
            if why is None:
                found = j
                break
            self._skips[j] = why
        self._next = found
        return found

    def backoff_ceiling(self, n: int) -> float:
        b = self.policy.backoff
        return exp_cap(b.initial, b.multiplier, b.cap, max(0, n))

    # -- bookkeeping used by effects ---------------------------------------------------------
    def describe(self, o: Outcome | None) -> str:
        if o is None:
            return "no outcome"
        text = o.kind.value
        if o.status is not None:
            text += f" (HTTP {o.status})"
        if o.retry_after is not None:
            text += f", Retry-After {o.retry_after:g}s"
        if o.detail and o.detail != f"HTTP {o.status}":
            d = o.detail if len(o.detail) <= 120 else o.detail[:117] + "..."
            text += f": {d}"
        return text

    def leave(self) -> None:
        """Record why the current target is being left; bench it if the rule says so."""
        if self.ti < 0:
            return
        o = self.outcome
        t = self.target
        self.reasons[t.name] = (self.attempts, o)
        if o is not None and o.kind in _TARGET_LEVEL and self.policy.rule(o.kind).cooldown:
            now = self.at
            streak = self.health.failed(t.key)
            span = (
                o.retry_after
                if o.retry_after is not None
                else cooldown_for(self.policy.cooldown, streak)
            )
            self.health.cool_target(t.key, now + span, now)
        if o is not None and o.kind is OutcomeKind.CONTEXT_TOO_LONG:
            known = t.context_length
            if known is not None:
                self.ctx_floor = max(self.ctx_floor or 0, known)
        for j, why in self._skips.items():
            self.reasons.setdefault(self.policy.targets[j].name, why)

    def go_to(self, j: int) -> None:
        self.ti = j
        self.attempts = 0
        self.streak = 0
        self.recovered = False
        self.rotations = 0
        self.spent = set()
        self.target_nb = 0.0
        t = self.policy.targets[j]
        self.rr = (
            self.health.next_round_robin(t.key, len(t.pool())) if t.rotation == "round_robin" else 0
        )
        self.cred = None

    def attempt(self, cred: Credential | None = None) -> Attempt:
        """The next attempt on the current target (hot path: kept flat)."""
        ti = self.ti
        if cred is None:
            cur = self.cred
            if (
                cur is not None
                and cur.id not in self.spent
                and self.cred_free_at(ti, cur) <= self.at
            ):
                cred = cur
            else:
                cred = self.free_credential() or self.earliest_free()[1] or self.target.pool()[0]
        self.cred = cred
        if ti not in self.tried:
            self.tried.append(ti)
        self.attempts += 1
        self.total_attempts = n = self.total_attempts + 1
        self.attempt_at = now = self.at
        p = self.policy
        left = p.deadline - (now - self.started)
        timeout = p.attempt_timeout if p.attempt_timeout <= left else max(0.001, left)
        return Attempt(p.targets[ti], cred, timeout, n)

    def _usable(self, c: Credential) -> bool:
        return c.id not in self.spent and self.cred_free_at(self.ti, c) <= self.at

    def failure(self, summary: str, state: str) -> TurnFailed:
        for t in self.policy.targets:
            if t.name in self.reasons:
                continue
            if t.index in self.tried:
                self.reasons[t.name] = "attempted"
            elif t.index < max(self.ti, 0):
                self.reasons[t.name] = "skipped at turn start: cooling"
            elif state == ABORTED:
                self.reasons[t.name] = "not tried: turn aborted"
            else:
                kind = self.outcome.kind.value if self.outcome else "turn start"
                self.reasons[t.name] = f"not tried: {kind} does not fall back (policy)"
        reasons = {
            name: why if isinstance(why, str)
            else f"attempted {why[0]}x, last: {self.describe(why[1])}"
            for name, why in self.reasons.items()
        }  # fmt: skip
        return TurnFailed(
            summary,
            state=state,
            reasons=reasons,
            last_outcome=self.outcome,
            partial=self.partial,
        )


# -- the prepare step: observe an event before any guard ---------------------------------------


def observe(s: TurnState, trigger: str, outcome: Outcome | None) -> None:
    """Record what an attempt produced: counters, per-turn and cross-turn not-before times."""
    s._next = s._first = _UNSET
    s.at = s.clock()  # one event, one instant: guards and effects all read `at`
    kind = _KINDS.get(trigger)
    if kind is None or outcome is None:
        return
    s.outcome = outcome
    if kind is _SUCCESS or kind is _CANCELLED:
        return
    if kind is _TRANSPORT:
        s.streak += 1
        return
    s.streak = 0
    if s.ti < 0 or s.cred is None:
        return
    now = s.at
    policy = s.policy
    ra = outcome.retry_after
    if kind in _CRED_LEVEL:
        if kind is _RATE_LIMITED:
            span = ra if ra is not None else s.backoff_ceiling(s.attempts - 1)
            if not policy.rule(kind).retry:  # not retryable: rotation never comes back to it
                s.spent.add(s.cred.id)
        else:
            span = ra if ra is not None else policy.cooldown.cap
            s.spent.add(s.cred.id)
        until = now + span
        key = (s.ti, s.cred.id)
        s.cred_nb[key] = max(s.cred_nb.get(key, 0.0), until)
        if policy.rule(kind).cooldown:
            s.health.cool_credential(s.target.key, s.cred.id, until, now)
    elif kind is _OVERLOADED and ra is not None:
        s.target_nb = max(s.target_nb, now + ra)
    elif kind is _STREAM:
        s.partial = outcome.partial
    elif kind is _CONTEXT:
        known = s.target.context_length
        if known is not None:
            s.ctx_floor = max(s.ctx_floor or 0, known)


# -- guards: pure predicates over the turn state ------------------------------------------------


def g_transport_retry(s: TurnState, arg: int) -> bool:
    p = s.policy
    return (
        not s.recovered
        and s.streak < p.transport_faults_before_recovery
        and s.attempts < p.max_attempts
        and s.fits_deadline(s.backoff_ceiling(s.streak - 1))
    )


def g_can_recover(s: TurnState, arg: int) -> bool:
    return not s.recovered


def g_overload_retry(s: TurnState, arg: int) -> bool:
    p = s.policy
    o = s.outcome
    ra = o.retry_after if o is not None else None
    if s.attempts >= p.max_attempts or (ra is not None and ra > p.retry_after_cap):
        return False
    return s.fits_deadline(max(s.backoff_ceiling(s.attempts - 1), ra or 0.0))


def g_stream_retry(s: TurnState, arg: int) -> bool:
    return s.attempts < s.policy.max_attempts


def g_can_rotate(s: TurnState, arg: int) -> bool:
    pool = s.target.pool()
    cur = s.cred.id if s.cred is not None else None
    return s.rotations < len(pool) - 1 and s.free_credential(exclude=cur) is not None


def g_can_wait(s: TurnState, arg: int) -> bool:
    if s.attempts >= s.policy.max_attempts:
        return False
    at, cred = s.earliest_free()
    if cred is None:
        return False
    wait = max(0.0, at - s.at)
    return wait <= s.policy.retry_after_cap and s.fits_deadline(wait)


def g_next_is(s: TurnState, arg: int) -> bool:
    return s.next_eligible() == arg


def _first_free(s: TurnState) -> int:
    if s.health.quiet():
        return 0
    now = s.at
    for j in range(len(s.policy.targets)):
        if s.target_ready_at(j) <= now:
            return j
    return -1


def _soonest(s: TurnState) -> int:
    best, at = -1, float("inf")
    for j in range(len(s.policy.targets)):
        r = s.target_ready_at(j)
        if r < at:
            best, at = j, r
    wait = max(0.0, at - s.at)
    if best < 0 or wait > s.policy.retry_after_cap or not s.fits_deadline(wait):
        return -1
    return best


def _first_cached(s: TurnState) -> int:
    if s._first == _UNSET:
        s._first = _first_free(s)
    return s._first


def g_first_is(s: TurnState, arg: int) -> bool:
    return _first_cached(s) == arg


def g_soonest_is(s: TurnState, arg: int) -> bool:
    return _first_cached(s) < 0 and _soonest(s) == arg


# -- effects: update the turn, return the next action -------------------------------------------


def e_enter(s: TurnState, j: int) -> Action:
    now = s.at
    for k in range(j):
        t = s.policy.targets[k]
        s.reasons.setdefault(
            t.name, f"skipped at turn start: cooling for {s.target_ready_at(k) - now:.1f}s"
        )
    s.go_to(j)
    return s.attempt()


def e_fall_back(s: TurnState, j: int) -> Action:
    s.next_eligible()  # make sure skip reasons are known
    s.leave()
    s.go_to(j)
    return s.attempt()


def e_back_off(s: TurnState, arg: int) -> Action:
    """Backoff counts from the start of the failed attempt: a 10 s timeout has already
    spaced the retries out by 10 s. A Retry-After is still honoured in full."""
    o = s.outcome
    now = s.at
    spent = now - s.attempt_at
    if o is not None and o.kind is OutcomeKind.TRANSPORT:
        w = max(0.0, backoff_delay(s.policy.backoff, s.streak - 1, s.random) - spent)
        reason = "transport backoff"
    else:
        w = max(0.0, backoff_delay(s.policy.backoff, s.attempts - 1, s.random) - spent)
        w = max(w, s.target_nb - now)
        reason = "server error backoff"
    s.waited += w
    return Wait(w, reason)


def e_rebuild(s: TurnState, arg: int) -> Action:
    return Rebuild(s.target)


def e_recovered(s: TurnState, arg: int) -> Action:
    s.recovered = True
    s.streak = 0
    return s.attempt()


def e_attempt(s: TurnState, arg: int) -> Action:
    return s.attempt()


def e_rotate(s: TurnState, arg: int) -> Action:
    cur = s.cred.id if s.cred is not None else None
    s.rotations += 1
    return s.attempt(s.free_credential(exclude=cur))


def e_wait_rate_limit(s: TurnState, arg: int) -> Action:
    at, cred = s.earliest_free()
    s.cred = cred
    w = max(0.0, at - s.at)
    s.waited += w
    return Wait(w, "rate limited: honouring Retry-After")


def e_wait_for_target(s: TurnState, j: int) -> Action:
    now = s.at
    for k in range(len(s.policy.targets)):
        if k != j:
            s.reasons.setdefault(
                s.policy.targets[k].name,
                f"cooling for {s.target_ready_at(k) - now:.1f}s at turn start",
            )
    s.go_to(j)
    at = s.target_ready_at(j)
    w = max(0.0, at - s.at)
    s.waited += w
    return Wait(w, "every target cooling: waiting for the soonest")


def e_finish(s: TurnState, arg: int) -> Action:
    o = s.outcome
    if s.ti >= 0 and s.cred is not None:
        s.health.succeeded(s.target.key, s.cred.id)
    return Finish(o.value if o is not None else None)


def e_fail(s: TurnState, arg: int) -> Action:
    if s.ti < 0:
        s.outcome = None
        return Fail(s.failure("every target is cooling beyond the Retry-After cap", FAILED))
    s.next_eligible()
    s.leave()
    return Fail(s.failure(f"{s.target.name} ended with {s.describe(s.outcome)}", FAILED))


def e_abort(s: TurnState, arg: int) -> Action:
    if s.outcome is None or s.outcome.kind is not OutcomeKind.CANCELLED:
        s.outcome = CANCELLED_OUTCOME
    return Fail(s.failure("cancelled", ABORTED))


GUARDS: Final[dict[str, Callable[[TurnState, int], bool]]] = {
    "transport_retry": g_transport_retry,
    "can_recover": g_can_recover,
    "overload_retry": g_overload_retry,
    "stream_retry": g_stream_retry,
    "can_rotate": g_can_rotate,
    "can_wait": g_can_wait,
    "next_is": g_next_is,
    "first_is": g_first_is,
    "soonest_is": g_soonest_is,
}

EFFECTS: Final[dict[str, Callable[[TurnState, int], Action]]] = {
    "enter": e_enter,
    "fall_back": e_fall_back,
    "back_off": e_back_off,
    "rebuild": e_rebuild,
    "recovered": e_recovered,
    "attempt": e_attempt,
    "rotate": e_rotate,
    "wait_rate_limit": e_wait_rate_limit,
    "wait_for_target": e_wait_for_target,
    "finish": e_finish,
    "fail": e_fail,
    "abort": e_abort,
}


def apply(
    s: TurnState,
    t: Transition,
    trigger: str,
    effect: Callable[[TurnState, int], Action] | None = None,
) -> Action:
    """Take transition `t`: move, run its effect, record the trace event.

    The event is recorded as a plain tuple and only turned into a `TraceEvent`
    when someone looks (a hook, `trace`, a failure): most turns never pay for it.
    """
    s.state = t.dest
    action = (effect or EFFECTS[t.effect])(s, t.arg)
    s.action = action
    s.seq = seq = s.seq + 1
    cls = type(action)
    o = s.outcome
    s._raw.append((
        seq, s.at - s.started, t.source, trigger, t.dest, action, s.ti,
        s.cred.id if s.cred is not None and s.ti >= 0 else None,
        o if o is not None and cls is not Fail and trigger != "success"
        and (o.kind is trigger or o.kind == trigger)
        else None,
    ))  # fmt: skip
    if cls is Fail:
        action.error.trace = tuple(s.trace)  # type: ignore[union-attr]
    if s.hook is not None:
        s.hook(s.trace[-1])
    return action


def _event(s: TurnState, raw: tuple[Any, ...]) -> TraceEvent:
    seq, at, source, trigger, dest, action, ti, cred_id, o = raw
    trigger = str(trigger)  # an OutcomeKind fed directly prints as its value
    cls = type(action)
    wait: float | None = None
    detail = ""
    if cls is Wait:
        wait = action.seconds
        detail = action.reason
    elif cls is Fail:
        detail = action.error.summary
    if o is not None:
        detail = f"{s.describe(o)}; {detail}" if detail else s.describe(o)
    name = model = None
    if ti >= 0:
        tgt = s.policy.targets[ti]
        name, model = tgt.name, tgt.model
    return TraceEvent(
        seq, round(at, 6), source, trigger, dest, cls.__name__, name, model, cred_id, wait, detail
    )


Compiled = dict[
    tuple[str, str],
    tuple[
        tuple[
            Callable[[TurnState, int], bool] | None,
            int,
            Transition,
            Callable[[TurnState, int], Action],
        ],
        ...,
    ],
]


def compile_table(decl: Declaration) -> Compiled:
    """The declaration as a lookup table: (state, trigger) -> ordered candidates."""
    cache = _cache(decl.policy)
    found = cache.get("compiled")
    if found is not None:
        return found  # type: ignore[return-value]
    table = _compile(decl, GUARDS, EFFECTS)
    cache["compiled"] = table
    return table


Guard = Callable[[TurnState, int], bool]
Effect = Callable[[TurnState, int], Action]


def _compile(
    decl: Declaration, guards: Mapping[str, Guard], effects: Mapping[str, Effect]
) -> Compiled:
    table: Compiled = {}
    for key, group in decl.groups().items():
        table[key] = tuple(
            (guards[t.guard] if t.guard else None, t.arg, t, effects[t.effect]) for t in group
        )
    return table


class _TurnBase:
    """The host-facing protocol shared by both executors."""

    s: TurnState

    def __init__(
        self,
        policy: Policy,
        *,
        health: HealthStore | None = None,
        clock: Callable[[], float] | None = None,
        random: Callable[[], float] | None = None,
        on_transition: Hook | None = None,
    ) -> None:
        """`health` defaults to the process-wide `fsm.health.DEFAULT` (shared by every
        turn given no store); `clock` (seconds, e.g. a `fsm.Clock`'s ``now``) to the
        `fsm.clock.default_clock()` in force when the turn is built."""
        self.s = TurnState(
            policy,
            health if health is not None else HealthStore.default(),
            clock if clock is not None else _clock.default_clock().now,
            random or _random.random,
            on_transition,
        )

    def _fire(self, trigger: str, outcome: Outcome | None) -> Action:
        raise NotImplementedError

    # The protocol: start, then feed back what each action produced.
    def start(self) -> Action:
        return self._fire(START, None)

    def feed(self, outcome: Outcome) -> Action:
        """Feed the outcome of the last `Attempt`."""
        return self._fire(outcome.kind, outcome)  # a StrEnum: hashes like its value

    def waited(self) -> Action:
        return self._fire(WAITED, None)

    def rebuilt(self, ok: bool = True) -> Action:
        return self._fire(REBUILT if ok else REBUILD_FAILED, None)

    def cancel(self) -> Action:
        """End the turn in `aborted` (from any non-terminal state)."""
        if self.done:
            assert self.s.action is not None
            return self.s.action
        return self._fire(CANCELLED, CANCELLED_OUTCOME)

    def fire(self, trigger: str, outcome: Outcome | None = None) -> Action:
        """Feed any declared trigger by name (used by the checker and tests)."""
        return self._fire(trigger, outcome)

    @property
    def state(self) -> str:
        return self.s.state

    @property
    def done(self) -> bool:
        return self.s.state in (DONE, FAILED, ABORTED)

    @property
    def trace(self) -> list[TraceEvent]:
        return self.s.trace

    @property
    def attempts(self) -> int:
        return self.s.total_attempts

    def _undeclared(self, trigger: str) -> ProtocolError:
        return ProtocolError(
            f"event {trigger!r} is not declared in state {self.s.state!r} "
            f"(after {type(self.s.action).__name__ if self.s.action else 'nothing'})"
        )


class Turn(_TurnBase):
    """One turn on the compiled table (the default executor)."""

    __slots__ = ("_table", "s")

    def __init__(
        self,
        policy: Policy,
        *,
        declaration: Declaration | None = None,
        guards: Mapping[str, Guard] | None = None,
        effects: Mapping[str, Effect] | None = None,
        **kw: Any,
    ) -> None:
        """`declaration`, `guards`, `effects` replace the policy's own (uncached): the model
        checker uses them to prove it catches deliberately broken machines."""
        super().__init__(policy, **kw)
        if declaration is None and guards is None and effects is None:
            self._table = compile_table(self.s.decl)
        else:
            if declaration is not None:
                self.s.decl = declaration
            self._table = _compile(
                self.s.decl, {**GUARDS, **(guards or {})}, {**EFFECTS, **(effects or {})}
            )

    def _fire(self, trigger: str, outcome: Outcome | None) -> Action:
        s = self.s
        candidates = self._table.get((s.state, trigger))
        if candidates is None:
            raise self._undeclared(trigger)
        observe(s, trigger, outcome)
        for guard, arg, t, effect in candidates:
            if guard is None or guard(s, arg):
                return apply(s, t, trigger, effect)
        raise AssertionError("unreachable: every group ends with an unguarded transition")


class TransitionsTurn(_TurnBase):
    """One turn on a real `transitions.Machine` (built once per policy, shared)."""

    def __init__(self, policy: Policy, **kw: Any) -> None:
        super().__init__(policy, **kw)
        self._machine, self._lock = _transitions_machine(self.s.decl)
        self._model = _Model(self.s)
        with self._lock:
            self._machine.add_model(self._model, initial=IDLE)

    def _fire(self, trigger: str, outcome: Outcome | None) -> Action:
        from transitions import MachineError

        before = self.s.seq
        try:
            self._model.trigger(trigger, outcome=outcome)
        except (MachineError, AttributeError):
            raise self._undeclared(trigger) from None
        if self.s.seq == before:  # pragma: no cover - the last candidate has no guard
            raise AssertionError("no transition taken")
        assert self.s.action is not None
        if self.done:
            self.close()
        return self.s.action

    def close(self) -> None:
        with self._lock:
            if self._model in self._machine.models:
                self._machine.remove_model(self._model)


class _Model:
    """The object `transitions` drives; it wraps the turn state."""

    trigger: Callable[..., bool]  # added by transitions.Machine.add_model

    def __init__(self, s: TurnState) -> None:
        self.s = s
        self.state = IDLE


def _transitions_machine(decl: Declaration) -> tuple[Any, threading.Lock]:
    cache = _cache(decl.policy)
    found = cache.get("transitions")
    if found is not None:
        return found  # type: ignore[return-value]
    from transitions import Machine

    def prepare(ev: Any) -> None:
        observe(ev.model.s, ev.event.name, ev.kwargs.get("outcome"))

    def guard_cb(name: str, arg: int) -> Callable[[Any], bool]:
        g = GUARDS[name]
        return lambda ev: g(ev.model.s, arg)

    def after_cb(t: Transition) -> Callable[[Any], None]:
        return lambda ev: _after(ev, t)

    def _after(ev: Any, t: Transition) -> None:
        apply(ev.model.s, t, ev.event.name)

    specs = []
    for t in decl.transitions:
        spec: dict[str, Any] = {
            "trigger": t.trigger,
            "source": t.source,
            "dest": t.dest,
            "after": [after_cb(t)],
        }
        if t.guard is not None:
            spec["conditions"] = [guard_cb(t.guard, t.arg)]
        specs.append(spec)
    machine = Machine(
        model=[],
        states=[st.name for st in decl.states],
        transitions=specs,
        initial=IDLE,
        auto_transitions=False,
        send_event=True,
        prepare_event=[prepare],
        ignore_invalid_triggers=False,
    )
    built = (machine, threading.Lock())
    cache["transitions"] = built
    return built
