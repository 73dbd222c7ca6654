"""Everything one turn knows, and its identity.

`TurnState` holds all per-turn facts (nothing per-turn lives anywhere else, so nothing can
leak into the next turn). What belongs to the visit of one target (attempts, fault streak,
rotations, spent keys, not-before times) is one `Visit` value, replaced whole when the turn
moves to another target, so no counter of the previous target can survive the move.

Both provide `copy()` and a canonical `key()`: the model checker identifies configurations
by `key()`, so every field that can change what the machine does next is either in it or
listed in `NOT_KEYED` with the reason it cannot matter. A test keeps the two lists complete.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ..errors import TurnFailed
from ..health.store import HealthStore
from ..kinds import TRAITS, Outcome
from ..policy.backoff import exp_cap, unit, wake_spread
from ..policy.model import Credential, Policy, Target
from ..redact import scrub_exception
from ..trace import TraceEvent
from .actions import Action, Attempt, Rebuild, Wait, new_attempt, new_rebuild, new_wait
from .events import trace_event
from .machine import ABORTED, IDLE, Declaration, declare
from .pacing import headroom_words, paced_until
from .reserve import member_spends_reserve
from .visit import NOWHERE, Visit

if TYPE_CHECKING:
    from .turn import Hook

UNSET: Final = -2  # a per-event cache that has not been computed yet
#: The least time left in the turn that an attempt is started with (seconds): less than
#: that is no attempt, only a request cut as it leaves (and clock rounding).
MIN_ATTEMPT: Final = 0.001




class TurnState:
    """All per-turn facts. Created fresh for every turn."""

    __slots__ = (
        "_events",
        "_next",
        "_raw",
        "_ready_first",
        "_skips",
        "action",
        "at",
        "attempt_started",
        "clock",
        "context_floor",
        "context_from",
        "cost",
        "decl",
        "denial",
        "first",
        "health",
        "hook",
        "interruption",
        "outcome",
        "owner",
        "partial",
        "policy",
        "random",
        "reasons",
        "reserved",
        "seq",
        "started",
        "state",
        "total_attempts",
        "tried",
        "visit",
        "waited",
    )

    #: Fields in `key()` (elapsed time stands for `started`, see `key`).
    KEYED: Final = (
        "state",
        "first",
        "visit",
        "tried",
        "context_floor",
        "context_from",
        "outcome",
        "partial",
        "started",
        "waited",
        "attempt_started",
    )
    #: Fields left out of `key()`, and why they cannot change what happens next.
    NOT_KEYED: Final = {
        "policy": "fixed for the whole search",
        "decl": "fixed for the whole search",
        "health": "keyed by the health store's own key()",
        "clock": "time is keyed relative to now",
        "random": "fixed (worst-case jitter) in the search",
        "hook": "observes, never steers",
        "at": "the clock read of the current event, reset before any guard",
        "_next": "per-event cache, reset before any guard",
        "_ready_first": "per-event cache, reset before any guard",
        "_skips": "per-event cache of next_eligible, rebuilt with it",
        "reasons": "words for the failure report; no guard reads them",
        "seq": "trace numbering",
        "_raw": "the trace so far",
        "_events": "the trace so far",
        "total_attempts": "reported, never read by a guard",
        "action": "keyed by the checker as the pending action",
        "owner": "the turn's id as a probe lease holder; the lease is keyed by the health store",
        "denial": "why the store refused the pending attempt; read only as words in reasons",
        "interruption": "the break a failed continuation reports (words; `partial` is keyed)",
        "cost": "fixed for the whole turn (the tokens one attempt is expected to use)",
        "reserved": "the pending attempt's reservation; the store keys its headroom itself",
    }

    def __init__(
        self,
        policy: Policy,
        health: HealthStore,
        clock: Callable[[], float],
        random: Callable[[], float],
        hook: Hook | None,
        decl: Declaration | None = None,
        first: int = 0,
    ) -> None:
        self.policy = policy
        self.first = first  # the chain entry this turn starts at (earlier ones are not used)
        self.decl: Declaration = decl if decl is not None else declare(policy)
        self.health = health
        self.clock = clock
        self.random = random
        self.hook = hook
        self.state = IDLE
        self.visit = NOWHERE
        self.total_attempts = 0
        self.tried: list[int] = []
        # Why each target did not answer; (attempts, outcome) is formatted at failure time.
        self.reasons: dict[str, str | tuple[int, Outcome | None]] = {}
        self._skips: dict[int, str] = {}
        self.started = self.at = clock()  # `at`: the clock, read once per event
        self.attempt_started = self.started  # when the last attempt began
        self.waited = 0.0
        self.outcome: Outcome | None = None
        self.partial: str | None = None
        self.interruption: Outcome | None = None  # the last break of a committed stream
        self.context_floor: int | None = None
        # the target whose context overflow first set the floor: unknown-length targets
        # after it are tried once those known to be larger are spent (see next_eligible)
        self.context_from = -1
        self._raw: list[tuple[Any, ...]] = []
        self._events: list[TraceEvent] = []
        self.seq = 0
        self._next = UNSET
        self._ready_first = UNSET
        self.action: Action | None = None
        self.owner = ""  # the turn's id as a probe lease holder (made on first use)
        self.denial: str | None = None  # why the store refused the last attempt
        self.cost: float | None = 0.0 if policy.pacing else None  # pacing: tokens/attempt
        self.reserved: tuple[Any, str, str] | None = None  # the attempt's reservation

    # -- identity ------------------------------------------------------------------------------
    def copy(self, health: HealthStore, clock: Callable[[], float]) -> TurnState:
        """A copy on its own health store and clock; the trace starts empty."""
        n = TurnState.__new__(TurnState)
        n.policy = self.policy
        n.decl = self.decl
        n.health = health
        n.clock = clock
        n.random = self.random
        n.hook = self.hook
        n.state = self.state
        n.first = self.first
        n.visit = self.visit if self.visit is NOWHERE else self.visit.copy()
        n.total_attempts = self.total_attempts
        n.tried = self.tried.copy()
        n.reasons = self.reasons.copy()
        n._skips = self._skips.copy()
        n.started = self.started
        n.at = self.at
        n.attempt_started = self.attempt_started
        n.waited = self.waited
        n.outcome = self.outcome
        n.partial = self.partial
        n.interruption = self.interruption
        n.context_floor = self.context_floor
        n.context_from = self.context_from
        n._raw = []
        n._events = []
        n.seq = self.seq
        n._next = self._next
        n._ready_first = self._ready_first
        n.action = self.action
        n.owner = self.owner
        n.denial = self.denial
        n.cost, n.reserved = self.cost, self.reserved
        return n

    def key(self, now: float, horizon: float = math.inf, timed: bool = True) -> tuple[Any, ...]:
        """Canonical identity of what can steer the rest of the turn, relative to `now`.

        `timed=False` drops elapsed and waited time (the checker does so once the
        deadline can no longer bind). The last outcome is left out while an attempt is
        pending: the attempt's outcome replaces it before anything reads it; the start
        of the last attempt is keyed only then.
        """
        o = self.outcome
        pending = type(self.action) is Attempt
        keep_outcome = o is not None and not pending
        return (
            self.state,
            self.first,
            self.visit.key(now, horizon),
            tuple(self.tried),
            self.context_floor,
            self.context_from,
            (o.kind, o.retry_after, o.client_side) if keep_outcome else None,  # type: ignore[union-attr]
            self.partial,
            (round(now - self.started, 6), round(self.waited, 6)) if timed else None,
            round(now - self.attempt_started, 6) if pending else None,
        )

    # -- reading -------------------------------------------------------------------------------
    @property
    def target(self) -> Target:
        t = self.visit.target
        assert t is not None, "no target entered yet"
        return t

    @property
    def trace(self) -> list[TraceEvent]:
        """One `TraceEvent` per transition so far (built on first look)."""
        events = self._events
        for raw in self._raw[len(events) :]:
            events.append(trace_event(self, raw))
        return events

    def elapsed(self) -> float:
        return self.at - self.started

    def fits_deadline(self, wait: float) -> bool:
        """A wait after which time is left for an attempt (`MIN_ATTEMPT` at least)."""
        return self.at - self.started + wait + MIN_ATTEMPT <= self.policy.deadline

    def client_side_fault(self) -> bool:
        """Was the last outcome this attempt's fault, not the target's (a
        `connection_level` kind marked `Outcome.client_side`)?"""
        o = self.outcome
        return o is not None and o.client_side and TRAITS[o.kind].connection_level

    def before_deadline(self) -> bool:
        """Time is left in the turn for an attempt (`MIN_ATTEMPT` at least): none starts
        at or after the deadline, no fallback, rotation, recovery or retry gets a sliver."""
        return self.at - self.started + MIN_ATTEMPT <= self.policy.deadline

    def key_free_at(self, c: Credential) -> float:
        """When credential `c` of the current target may next be used."""
        v = self.visit
        benched = self.health.credential_until(v.target.key, c.health_id)
        if self.cost is not None and self.health.room:  # pacing: free at its reset
            benched = max(benched, paced_until(self, v.target.key, c.health_id))
        held = v.key_not_before.get(c.id, 0.0)
        return benched if benched > held else held  # not max(): every attempt asks

    def free_credential(self, exclude: str | None = None) -> Credential | None:
        """First usable credential of the current target, in pool order."""
        v = self.visit
        t = v.target
        pool, now = t.pool(), self.at
        size = len(pool)
        benched = self.health.credential_until  # hot path: the lookups once, not per key
        nb, paced = v.key_not_before, self.health.paced_until
        cost = self.cost if self.health.room else None
        for k in range(size):
            c = pool[(v.pool_start + k) % size]
            cid = c.id
            if cid == exclude or cid in v.spent:
                continue
            if benched(t.key, c.health_id) <= now and nb.get(cid, 0.0) <= now:
                if cost is None or paced(t.key, c.health_id, cost, now) <= now:
                    return c
        return None

    def earliest_free(self) -> tuple[float, Credential | None]:
        """When the current target can next be called, and with which credential."""
        v = self.visit
        best: tuple[float, Credential | None] = (math.inf, None)
        t = v.target
        floor = max(v.not_before, self.health.target_until(t.key))
        pool = t.pool()
        size = len(pool)
        for k in range(size):
            c = pool[(v.pool_start + k) % size]
            if c.id in v.spent:
                continue
            at = max(floor, self.key_free_at(c))
            if at < best[0]:
                best = (at, c)
        return best

    def target_ready_at(self, j: int) -> float:
        """When target `j` (any key of it) is next free in the health store: its open
        span, another turn's probe lease on it, its soonest free key."""
        t = self.policy.targets[j]
        return self.health.ready_at(t.key, t.pool(), self.owner, self.cost, self.at)

    def ineligible(self, j: int, now: float) -> str | None:
        """Why target j cannot be entered now (None if it can). A target of unknown
        context_length is not ineligible after an overflow: `next_eligible` tries it
        once those known to be larger are spent. Nothing is eligible once the deadline
        has passed."""
        if not self.before_deadline():
            return f"not tried: the {self.policy.deadline:g}s deadline had passed"
        if self.interruption is not None and (stuck := self.uncontinuable()) is not None:
            return f"not tried: {stuck}"  # the stream's own: no target can continue it
        t = self.policy.targets[j]
        for k in self.tried:
            if k != j and self.policy.targets[k].same_as(t):
                return f"skipped: identical to {self.policy.targets[k].name}"
        floor = self.context_floor
        if floor is not None and t.context_length is not None and t.context_length <= floor:
            return f"skipped: context_length {t.context_length} <= {floor}"
        ready = self.health.ready_at(t.key, t.pool(), self.owner, self.cost, now)  # target_ready_at
        if ready > now:
            return f"skipped: {self.cooling(j, now)}"
        return None

    def uncontinuable(self) -> str | None:
        """Why the broken stream can be continued on no target, for a reason of the
        stream's own (it delivered tool calls or a refusal, asked for several choices, or
        had reached its end): the host says so on the break's outcome, or on a
        continuation it refused before sending it; None otherwise."""
        broke = self.interruption
        if broke is None:
            return None
        if broke.uncontinuable is not None:
            return broke.uncontinuable
        o = self.outcome
        return o.uncontinuable if o is not None else None

    def probing(self, j: int, now: float) -> float | None:
        """When another turn's probe lease on target j's half-open breaker ends, if that
        lease (not a cooldown) is what keeps j from being called at `now` (else None)."""
        t = self.policy.targets[j]
        h = self.health
        lease = h.lease_until(t.key, self.owner)
        if lease <= now:
            return None
        soonest = min(h.credential_until(t.key, c.health_id) for c in t.pool())
        return lease if lease >= max(h.target_until(t.key), soonest) else None

    def cooling(self, j: int, now: float) -> str:
        """Why target j cannot be called now, for how long and since what outcome:
        ``cooling for 170.0s after quota (HTTP 402) on env:KEY``; a half-open target
        another turn is probing says so (it is not cooling: the probe ends its wait)."""
        if self.cost is not None and (paced := headroom_words(self, j, now)):
            return paced
        lease = self.probing(j, now)
        if lease is not None:
            return (
                "half-open, another turn is probing it (free when its probe ends, "
                f"at most {lease - now:.1f}s away)"
            )
        t = self.policy.targets[j]
        h = self.health
        bench = h.target_until(t.key)
        soonest, cred, hid = min(
            (h.credential_until(t.key, c.health_id), c.id, c.health_id) for c in t.pool()
        )
        text = f"cooling for {max(bench, soonest, now) - now:.1f}s"
        if bench >= soonest:
            cause = h.cause(t.key)
            return f"{text} after {cause}" if cause else text
        cause = h.cause(t.key, hid)
        size = len(t.pool())
        which = cred if size == 1 else f"{cred}, the first of its {size} keys to free up"
        return f"{text} after {cause} on {which}" if cause else f"{text} ({which})"

    def next_eligible(self) -> int:
        """The fallback to take now (-1 if none); cached per event.

        In chain order after the current target. After a context overflow (a floor
        is known), targets known to be larger come first; those of unknown
        context_length come after them, in chain order from the target whose
        overflow set the floor, so one passed over for a larger one earlier in the
        chain is still tried (the one move back up the chain; never to a target
        already tried)."""
        if self._next != UNSET:
            return self._next
        now = self.at
        self._skips = {}
        targets = self.policy.targets
        cur = self.visit.index
        floor = self.context_floor
        found = -1
        tried = self.tried
        for j in range(cur + 1, len(targets)):
            if floor is not None and (targets[j].context_length is None or j in tried):
                continue  # unknown ones after the known-larger ones; tried ones ahead:
                # only after a move back, and never again
            why = self.ineligible(j, now)
            if why is None and targets[j].group is not None:  # a member: keeps the reserve
                why = member_spends_reserve(self, j)
            if why is None:
                found = j
                break
            self._skips[j] = why
        if found < 0 and floor is not None:
            back = cur >= 0 and targets[cur].context_length is not None
            start = self.context_from + 1 if back else cur + 1
            for j in range(max(start, self.first), len(targets)):
                if j == cur or j in tried or targets[j].context_length is not None:
                    continue
                why = self.ineligible(j, now)
                if why is None and targets[j].group is not None:
                    why = member_spends_reserve(self, j)
                if why is None:
                    found = j
                    break
                self._skips[j] = why
        self._next = found
        return found

    def backoff_ceiling(self, n: int) -> float:
        b = self.policy.backoff
        return exp_cap(b.initial, b.multiplier, b.cap, n)  # n < 0 counts as 0

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

    # -- moving ----------------------------------------------------------------------------------
    def go_to(self, j: int) -> None:
        """Start a fresh visit of target j."""
        t = self.policy.targets[j]
        start = (
            self.health.next_round_robin(t.key, len(t.pool()), self.at)
            if t.rotation == "round_robin"
            else 0
        )
        self.visit = Visit(j, start, t)

    def attempt(
        self, cred: Credential | None = None, fresh: bool = False, prefix: str | None = None
    ) -> Attempt:
        """The next attempt on the current target (hot path: kept flat). `cred` is given
        by a rotation only; `fresh`: after a wait for the target to be free, a first
        attempt (no retry token), as a turn starting then would make; `prefix`: it
        continues a broken stream that delivered this text."""
        v = self.visit
        rotated = cred is not None
        if cred is None:
            cur = v.credential
            if cur is not None and cur.id not in v.spent and self.key_free_at(cur) <= self.at:
                cred = cur
            else:
                cred = self.free_credential() or self.earliest_free()[1] or v.target.pool()[0]
        v.credential = cred
        ti = v.index
        if ti not in self.tried:
            self.tried.append(ti)
        # a rotation is the key's fault, a client-side fault the connection's: both free
        retry = v.attempts > 0 and not rotated and not fresh and not self.client_side_fault()
        v.attempts += 1
        self.total_attempts = n = self.total_attempts + 1
        self.attempt_started = now = self.at
        self.denial = None
        p = self.policy
        left = p.deadline - (now - self.started)
        # left >= MIN_ATTEMPT: every edge into an attempt checks the deadline (a host's wait
        # that overslept it, the one exception, gets the shortest attempt, cut at once).
        timeout = p.attempt_timeout if p.attempt_timeout <= left else max(MIN_ATTEMPT, left)
        probe = self.health.half_open(v.target.key, now)
        if probe:
            v.probe = True
        return new_attempt(
            p.targets[ti], cred, timeout, n, probe, retry, max(timeout, left), prefix
        )

    def rebuild(self) -> Rebuild:
        return new_rebuild(self.target)

    def wait(self, seconds: float, reason: str) -> Wait:
        self.waited += seconds
        return new_wait(seconds, reason)

    def until(self, seconds: float) -> float:
        """A wait of `seconds` for a cooldown or Retry-After to end, plus a random part
        (`fsm.policy.backoff.wake_spread`) kept within the single-wait cap and the deadline."""
        p = self.policy
        room = min(
            wake_spread(p.backoff, seconds),
            max(p.retry_after_cap, p.backoff.cap) - seconds,
            p.deadline - self.elapsed() - seconds,
        )
        return seconds + room * unit(self.random) if room > 0.0 else seconds

    def failure(self, summary: str, state: str) -> TurnFailed:
        here = self.visit.index
        for t in self.policy.targets:
            if t.name in self.reasons:
                continue
            if t.index in self.tried:
                self.reasons[t.name] = "attempted"
            elif t.index < self.first:
                first = self.policy.targets[self.first].name
                self.reasons[t.name] = f"not in this turn's chain (it starts at {first})"
            elif t.index < max(here, 0):
                self.reasons[t.name] = "skipped at turn start: cooling"
            elif here < 0 and state != ABORTED and self.target_ready_at(t.index) > self.at:
                self.reasons[t.name] = f"skipped at turn start: {self.cooling(t.index, self.at)}"
            elif state == ABORTED:
                self.reasons[t.name] = "not tried: turn aborted"
            else:
                kind = self.outcome.kind.value if self.outcome else "turn start"
                self.reasons[t.name] = f"not tried: {kind} does not fall back (policy)"
        if self.outcome is not None and self.outcome.error is not None:
            # The caller gets it as `last_error`: no key of the pool, nothing key-shaped.
            # (Details were scrubbed when the outcome was classified: `drivers`.)
            scrub_exception(self.outcome.error, self.policy.secrets())
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
