"""What outlives a turn: per backend, its breaker, retry budget and round-robin cursor; per
key, its cooldown.

In-memory and thread-safe. Times are in the clock domain of the turns that use the store
(by default the system clock's monotonic seconds). What the records mean and how each
report changes them is `fsm.health.records` (one home, shared with
`fsm.health.shared_store.SharedHealthStore`, which keeps one of these as its local
replica and exchanges it with a backend that several processes or hosts share).

`DEFAULT` is the one process-wide store: every turn that is given no ``health=``
(``fsm.Turn``, ``fsm.run``, ``fsm.arun``, ...) reads and writes it, so unrelated callers
share cooldowns — on purpose, since a cooldown belongs to the backend (base URL and model)
and the key, not to a policy object. Pass your own `HealthStore` to keep a turn's facts
apart (tests, tenants), or ``DEFAULT.clear()`` to forget them.

Cooldowns never extend themselves: while one is active, a new failure report for the same
key leaves its end where it is (such reports come from turns that were already in flight
when the cooldown began).

The host loops (`fsm.host.loop`) call `grant` before each attempt (unless the store is quiet):
a half-open target's probe takes the probe lease, a retry takes a retry token, and an
attempt on a breaker that opened since it was decided is refused. That is where two turns
that both decided to probe, or to spend the last token, are told apart atomically.
`begin` and `end` bracket a turn: no-ops here, the shared store's exchanges.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

from . import headroom as room
from . import records as fleet
from .backend import Record
from .grants import AttemptView, TurnView, Update, grant_update, no_headroom, refusal, take_grant

if TYPE_CHECKING:
    from ..catalogue.ratelimit import Limits
    from ..policy.model import Credential, Policy

TargetKey = Hashable


CredKey = tuple[Hashable, str]
_EMPTY: Final[Record] = {}
_OWNERS: Final = itertools.count(1)


def _advance(r: Record, now: float) -> Record:
    return fleet.advance(r)[0]


def _clear(r: Record, now: float) -> Record:
    return {}


_CLEAR: Final = _clear


class HealthStore:
    """Cross-turn facts. All methods take `now` so that the store stays clock-agnostic."""

    __slots__ = ("__weakref__", "_cause", "_cred_until", "_lock", "_targets", "room")

    #: Does the host loop have to exchange with a backend around attempts (`begin`,
    #: `grant` for every attempt, `end`)? False: only probes and retries need `grant`.
    shared: ClassVar[bool] = False
    #: Does it record its changes (`_journal`) for a backend? (The in-memory store: no.)
    journals: ClassVar[bool] = False
    #: Can `grant` take its update in place (its own `permit`, no journal)? Set per class.
    _plain_grant: ClassVar[bool] = True

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls._plain_grant = cls.permit is HealthStore.permit and not cls.journals

    @staticmethod
    def default() -> HealthStore:
        """The process-wide `DEFAULT` store, shared by every turn given no store."""
        return DEFAULT

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targets: dict[TargetKey, Record] = {}
        self._cred_until: dict[CredKey, float] = {}
        # What started a cooldown, by target key or (target, credential id): its end and
        # a short safe label ("quota (HTTP 402)", never provider text). Words for failure
        # reports only; nothing decides by it.
        self._cause: dict[Hashable, tuple[float, str]] = {}
        #: Per (target, credential): what its provider said is left of its rate limits, and
        #: the reservations in flight (`fsm.health.headroom`). Empty: pacing costs nothing.
        self.room: dict[CredKey, Record] = {}

    # -- reads (lock-free: single dict lookups are atomic in CPython) ---------------------
    def quiet(self) -> bool:
        """True when nothing has ever been reported (a fast path for turn start)."""
        return not self._targets and not self._cred_until and not self.room

    def record(self, target: TargetKey) -> Record:
        """The target's record (see `fsm.health.records`; empty when nothing is known)."""
        return self._targets.get(target, _EMPTY)

    def target_until(self, target: TargetKey) -> float:
        """End of the target's open span (0: not open)."""
        r = self._targets.get(target)
        return r.get("until", 0.0) if r else 0.0  # type: ignore[return-value]

    def lease_until(self, target: TargetKey, owner: str) -> float:
        """End of a probe lease on the target held by another turn than `owner` (0: none)."""
        r = self._targets.get(target)
        if not r or r.get("owner") in ("", owner, None):
            return 0.0
        return fleet.num(r, "lease")

    def ready_at(
        self,
        target: TargetKey,
        pool: Iterable[Credential],
        owner: str,
        cost: float | None = None,
        now: float = 0.0,
    ) -> float:
        """When `target` is next free for turn `owner`: the end of its open span, of another
        turn's probe lease on it and of the soonest cooldown among its keys `pool` (0: now);
        with a `cost` (pacing), a key out of headroom for it at `now` cools until its reset.
        One call for what `target_until`, `lease_until` and `credential_until` say (a
        fallback asks it of every later target): a store that overrides those overrides
        this too."""
        at = 0.0
        r = self._targets.get(target)
        if r:
            at = r.get("until", 0.0)  # type: ignore[assignment]
            if r.get("owner") not in ("", owner, None):
                at = max(at, fleet.num(r, "lease"))
        soonest = 0.0  # no key benched anywhere
        benched = self._cred_until
        paced = cost is not None and self.room
        if benched or paced:
            soonest = math.inf
            for c in pool:
                u = benched.get((target, c.health_id), 0.0)
                if paced:
                    u = max(u, self.paced_until(target, c.health_id, cost, now))  # type: ignore[arg-type]
                if u < soonest:
                    soonest = u
        return at if at > soonest else soonest

    def half_open(self, target: TargetKey, now: float) -> bool:
        r = self._targets.get(target)
        return bool(r and r.get("opens") and r.get("until", 0.0) <= now)  # type: ignore[operator]

    def retry_tokens(self, target: TargetKey, policy: Policy) -> float:
        """Retry tokens left for the target (inf when the policy has no budget)."""
        rb = policy.retry_budget
        if not rb.enabled:
            return math.inf
        r = self._targets.get(target)
        return r.get("tokens", rb.size) if r else rb.size  # type: ignore[return-value]

    def credential_until(self, target: TargetKey, cred: str) -> float:
        return self._cred_until.get((target, cred), 0.0)

    def cause(self, target: TargetKey, cred: str | None = None) -> str | None:
        """What started the cooldown in force on `target` (or its credential `cred`)."""
        key: Hashable = target if cred is None else (target, cred)
        until = self.target_until(target) if cred is None else self.credential_until(target, cred)
        noted = self._cause.get(key)
        return noted[1] if noted is not None and noted[0] == until else None

    def note_cause(
        self, target: TargetKey, cause: str, until: float, cred: str | None = None
    ) -> None:
        """Remember `cause` for the cooldown of `target` (or `cred`) ending at `until`,
        if that is the one in force (a running cooldown keeps its own cause)."""
        key: Hashable = target if cred is None else (target, cred)
        self._lock.acquire()  # not `with`: see `grant`
        try:
            if cred is None:
                held = self.target_until(target)
            else:
                held = self._cred_until.get((target, cred), 0.0)
            if held == until:
                self._cause[key] = (until, cause)
        finally:
            self._lock.release()

    # -- writes: each is a pure update (`fsm.health.records`) applied under the lock --------
    def _apply(self, target: TargetKey, fn: Update, now: float) -> Record | None:
        """Under the lock: apply `fn` to the target's record; journal it if it changed
        anything (None: `fn` refused, nothing changes)."""
        old = self._targets.get(target, _EMPTY)
        new = fn(old, now)
        if new is None or new is old:
            return new
        if new:
            self._targets[target] = new
        else:
            self._targets.pop(target, None)
        if self.journals:
            self._journal(target, None, fn, now)
        return new

    def open_target(self, target: TargetKey, until: float, now: float) -> float:
        """Open the target's breaker until `until` unless it is open (tests', checker's)."""
        span = until - now

        def opened(r: Record, t: float) -> Record:
            if fleet.num(r, "until") > t:
                return r
            return {**r, "until": t + span, "opens": max(1, fleet.count(r, "opens"))}

        with self._lock:
            r = self._apply(target, opened, now)
        return fleet.num(r or {}, "until")

    def cool_credential(
        self, target: TargetKey, cred: str, until: float, now: float, cause: str | None = None
    ) -> float:
        """Bench one credential of one target (never another target's) until `until`
        unless it is benched already; returns the end of its bench. `cause`: what
        `note_cause` would remember for it (under the same lock: a rate limit takes one)."""
        key = (target, cred)
        self._lock.acquire()  # not `with`: see `grant`
        try:
            current = self._cred_until.get(key, 0.0)
            if current > now:
                if cause is not None and current == until:
                    self._cause[key] = (until, cause)
                return current
            self._cred_until[key] = until
            if cause is not None:
                self._cause[key] = (until, cause)
            if self.journals:
                span = until - now
                self._journal(target, cred, lambda r, t: fleet.cool(r, t, t + span), now)
            return until
        finally:
            self._lock.release()

    def failed(
        self,
        target: TargetKey,
        now: float,
        policy: Policy,
        retry_after: float | None = None,
        owner: str = "",
        at_once: bool = False,
    ) -> Record:
        """A turn left `target` with a hard failure (`records.fail`): the new record."""

        def report(r: Record, t: float) -> Record:
            return fleet.fail(r, t, policy, retry_after, owner, at_once)

        with self._lock:
            r = self._apply(target, report, now)
        assert r is not None
        return r

    def succeeded(self, target: TargetKey, cred: str, policy: Policy, now: float = 0.0) -> None:
        """A success closes the target's breaker, refills its retry budget and clears any
        stale bench on the key."""
        if not self._targets and not self._cred_until:
            return
        self._lock.acquire()  # not `with`: see `grant`
        try:
            if target in self._targets:
                self._apply(target, lambda r, t: fleet.succeed(r, policy), now)
            if self._cred_until.pop((target, cred), None) is not None and self.journals:
                self._journal(target, cred, _CLEAR, now)
        finally:
            self._lock.release()

    def released(self, target: TargetKey, owner: str, now: float = 0.0) -> None:
        """A probe ended neither way: give its lease back."""
        with self._lock:
            if self._targets.get(target, _EMPTY).get("owner") == owner:
                self._apply(target, lambda r, t: fleet.release(r, owner), now)

    def next_round_robin(self, target: TargetKey, size: int, now: float = 0.0) -> int:
        """The starting slot for a round-robin pool (advances on every call)."""
        with self._lock:
            r = self._apply(target, _advance, now)
        assert r is not None
        return fleet.count(r, "rr") % size

    # -- headroom: the providers' rate limits per key (`fsm.health.headroom`) ------------
    def headroom(self, target: TargetKey, cred: str) -> Record:
        """The key's headroom record (empty when no reply said anything of it)."""
        return self.room.get((target, cred), _EMPTY)

    def paced_until(self, target: TargetKey, cred: str, cost: float, now: float) -> float:
        """When key `cred` of `target` has room for a request of `cost` tokens: 0 when it
        has now (or nothing is known), else that limit's reset."""
        r = self.room.get((target, cred)) if self.room else None
        if not r:
            return 0.0
        at = room.ready_at(r, now, cost)
        return at if at > now else 0.0

    def observe_limits(
        self, target: TargetKey, cred: str, limits: Limits, now: float, age: float = 0.0
    ) -> None:
        """What a reply of key `cred` said of its rate limits (`fsm.catalogue.ratelimit`),
        arriving at `now` for a request sent `age` seconds before (`headroom.observe`)."""
        self._room_update(target, cred, lambda r, t: room.observe(r, t, limits, age), now)

    def release_headroom(self, target: TargetKey, cred: str, rid: str, now: float) -> None:
        """Reservation `rid` on the key ends (its attempt ended, whatever the outcome)."""
        if (target, cred) in self.room:
            self._room_update(target, cred, lambda r, t: room.release(r, t, rid), now)

    def _room_update(self, target: TargetKey, cred: str, fn: Update, now: float) -> bool:
        """Apply `fn` to the key's headroom record under the lock (journalled)."""
        key = (target, cred)
        self._lock.acquire()  # not `with`: see `grant`
        try:
            old = self.room.get(key, _EMPTY)
            new = fn(old, now)
            if new is None:
                return False
            if new is not old:
                if new:
                    self.room[key] = new
                else:
                    self.room.pop(key, None)
                if self.journals:
                    self._journal_room(target, cred, fn, now)
            return True
        finally:
            self._lock.release()

    def reservation(self, s: TurnView, a: AttemptView) -> tuple[CredKey, str, Update] | None:
        """The headroom reservation attempt `a` needs (None: pacing off, or nothing is
        known of its key): the key, the reservation's id and its pure update."""
        if not self.room or not s.policy.pacing:
            return None
        ck = (a.target.key, a.credential.health_id)
        if ck not in self.room:
            return None
        rid = f"{self.owner(s)}.{a.number}"
        cost = s.cost or 0.0
        ttl = a.timeout + room.GRACE
        return ck, rid, lambda r, t: room.reserve(r, t, rid, cost, t + ttl)

    def _journal_room(self, target: TargetKey, cred: str, fn: Update, now: float) -> None:
        """A shared store journals a headroom update made at `now` (nothing to do in
        memory)."""

    # -- the host's step before an attempt ------------------------------------------------
    def owner(self, s: TurnView) -> str:
        """The turn's id as a lease holder (made on first use; never a secret)."""
        if not s.owner:
            s.owner = f"{self._owner_prefix()}{next(_OWNERS)}"
        return s.owner

    def _owner_prefix(self) -> str:
        return "turn-"

    def grant(self, s: TurnView, a: AttemptView) -> str | None:
        """Let attempt `a` go out, atomically: a probe takes the target's lease, a retry
        takes a token; refused on a breaker opened since the attempt was decided. With
        pacing, it also reserves a request and the turn's token cost on the attempt's key
        (refused when another turn took the key's last headroom meanwhile). Returns why
        not (the host then feeds ``denied``), or None. The host asks for every attempt
        unless the store is `quiet` (then only probes and retries can need it)."""
        taken = self.reservation(s, a) if self.room else None
        if taken is None:
            return self._fleet_grant(s, a)
        (tkey, hid), rid, fn = taken
        now = s.clock()
        if not self._room_update(tkey, hid, fn, now):
            return no_headroom(a, self.headroom(tkey, hid), now, s.cost or 0.0)
        why = self._fleet_grant(s, a)
        if why is not None:
            self.release_headroom(tkey, hid, rid, now)
            return why
        s.reserved = (tkey, hid, rid)
        return None

    def _fleet_grant(self, s: TurnView, a: AttemptView) -> str | None:
        """The breaker's and the retry budget's part of `grant`."""
        key = a.target.key
        if not a.retry and key not in self._targets:
            return None  # nothing known of it: closed, and a first attempt takes nothing
        now = s.clock()
        if self._plain_grant:
            # in memory: the same take, without building an update to journal (hot path)
            owner = self.owner(s) if a.probe else ""
            # acquire/release, not `with`: on CPython 3.11 `with` on a Lock costs twice as
            # much (its __exit__ takes a tuple of arguments), a fifth of a grant
            self._lock.acquire()
            try:
                old = self._targets.get(key, _EMPTY)
                new = take_grant(old, now, s.policy, a.probe, a.retry, owner)
                if new is not None and new is not old:
                    self._targets[key] = new
            finally:
                self._lock.release()
            return None if new is not None else refusal(a, old, now, s.owner)
        fn = self.permit(s, a)
        with self._lock:
            old = self._targets.get(key, _EMPTY)
            if self._apply(key, fn, now) is not None:
                return None
        return refusal(a, old, now, s.owner)

    def permit(self, s: TurnView, a: AttemptView) -> Update:
        """The grant of `a` as a pure update (None from it: refused)."""
        owner = self.owner(s) if a.probe else ""
        return grant_update(s.policy, a.probe, a.retry, owner)

    def begin(self, s: TurnView) -> None:
        """Before a turn starts (a shared store reads what the turn needs)."""

    def end(self, s: TurnView) -> None:
        """After a turn ended (a shared store writes what the turn reported)."""

    def _journal(self, target: TargetKey, cred: str | None, fn: Update, now: float) -> None:
        """What the replica of a shared store changed at `now` (nothing to do in memory)."""

    # -- identity (the model checker's) -----------------------------------------------------------
    def copy(self) -> HealthStore:
        """An independent copy (same class: a deliberately broken subclass stays broken)."""
        cls = type(self)
        new = object.__new__(cls)
        new._lock = threading.Lock()
        new._targets = self._targets.copy()
        new._cred_until = self._cred_until.copy()
        new._cause = self._cause.copy()
        new.room = self.room.copy()
        names = _SLOTS.get(cls)
        if names is None:  # a subclass's own slots, found once (the checker copies a lot)
            names = _SLOTS[cls] = tuple(
                n
                for klass in cls.__mro__
                if klass is not HealthStore
                for n in getattr(klass, "__slots__", ())
                if n != "__weakref__"
            )
        for name in names:
            if hasattr(self, name):
                value = getattr(self, name)
                object.__setattr__(new, name, value.copy() if isinstance(value, dict) else value)
        return new

    def key(
        self,
        now: float,
        targets: Iterable[TargetKey],
        credentials: Iterable[CredKey],
        horizon: float = math.inf,
        saturation: int = 1 << 30,
        sizes: Mapping[Any, int] | None = None,
        tokens: tuple[float, float] = (math.inf, math.inf),
        window: float = math.inf,
    ) -> tuple[Any, ...]:
        """Canonical identity of the facts about `targets` and `credentials` that can steer a
        turn: open spans, leases and failure windows as seconds left (inf beyond
        `horizon`), openings (equal once at `saturation`, where the span stops growing),
        failures in the window, the lease holder, retry tokens (a bucket's `tokens` =
        (size, cap): counts from `cap` up are one value), round-robin positions. A failure
        window older than `window` seconds is over (as if empty). With headroom known
        (`room`), the credentials' headroom records too (`headroom.identity`)."""
        targets, credentials = tuple(targets), tuple(credentials)
        # the checker's hot path (once per transition): a target with no record is `fresh`
        until, benched = self.target_until, self._cred_until
        out: list[Any] = [relative(until(k), now, horizon) for k in targets]
        out += [relative(benched.get(ck, 0.0), now, horizon) for ck in credentials]
        size, cap = tokens
        fresh = (0, None, None, min(size, cap), None)
        records = self._targets
        count, num = fleet.count, fleet.num
        for k in targets:
            r = records.get(k)
            if not r and now >= 0.0:  # no record (a lease at 0 is over)
                out += fresh
                continue
            r = r or _EMPTY
            fails = count(r, "fails")
            lease = num(r, "lease")
            age = round(now - num(r, "since"), 6) if fails else 0.0
            out += (
                min(count(r, "opens"), saturation),
                # a failure window over counts nothing any more
                (fails, age) if fails and age <= window else None,
                (relative(lease, now, horizon), r.get("owner")) if lease > now else None,
                min(num(r, "tokens", size), cap),
                None if (n := r.get("rr")) is None else int(n) % (sizes or {}).get(k, 1 << 30),
            )
        if self.room and (paced := room.identities(self.room, credentials, now, horizon)):
            out.append(paced)
        return tuple(out)

    def clear(self) -> None:
        with self._lock:
            self._targets.clear()
            self._cred_until.clear()
            self._cause.clear()
            self.room.clear()

    def facts(
        self, copy: bool = True
    ) -> tuple[dict[TargetKey, float], dict[CredKey, float], dict[TargetKey, int]]:
        """Target open spans, credential cooldowns and failure counts (openings and
        failures in the window), for the checker's before/after comparison."""
        with self._lock:
            until = {k: fleet.num(r, "until") for k, r in self._targets.items() if r.get("until")}
            fails = {
                k: fleet.count(r, "opens") * 1000 + fleet.count(r, "fails")
                for k, r in self._targets.items()
                if r.get("opens") or r.get("fails")
            }
            creds = self._cred_until.copy() if copy else self._cred_until
        return until, creds, fails

    def raw_facts(self, copy: bool = True) -> tuple[dict[TargetKey, Record], dict[CredKey, float]]:
        """The target records and credential cooldowns `facts` is worked out from (a copy
        of each dict; the records themselves are shared: they are replaced, never
        changed)."""
        if not copy:
            return self._targets, self._cred_until
        with self._lock:
            return self._targets.copy(), self._cred_until.copy()

    def snapshot(self) -> dict[str, object]:
        """A copy for debugging and tests (credential ids only, never keys)."""
        with self._lock:
            return {
                "targets": {k: dict(r) for k, r in self._targets.items()},
                "credentials": dict(self._cred_until),
                "headroom": {k: dict(r) for k, r in self.room.items()},
            }


#: Per store class: the slots `HealthStore.copy` copies.
_SLOTS: dict[type, tuple[str, ...]] = {}


def relative(until: float, now: float, horizon: float = math.inf) -> float:
    """Seconds left of a not-before time: 0 when over, inf beyond `horizon`."""
    if until <= now:
        return 0.0
    left = until - now
    return round(left, 6) if left <= horizon else math.inf


#: The process-wide store shared by every turn that passes no ``health=``.
DEFAULT: Final = HealthStore()
