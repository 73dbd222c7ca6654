"""A health store shared by the processes (and hosts) of a fleet, through a `Backend`.

`SharedHealthStore(backend)` is a `HealthStore` whose records are a local replica: the
turn's guards and effects read and write it synchronously, as they do the in-memory store,
and every change is journalled as the pure update that made it (`fsm.health.records`). The host
loops exchange with the backend at fixed points, one `Backend.transact` each:

* `begin` (before the turn starts): read the records of the turn's chain;
* `grant` (before each attempt): write the journal, take the probe lease or the retry
  token if the attempt needs one (atomically, on the backend's current record), and read
  the records back. The turn's first attempt skips it when `begin` has just read
  everything and there is nothing to write or take: at most one round trip per attempt;
* `end` (after the turn): write the journal.

The journal is replayed on the backend at each change's own time, told as its age: a
change made ``age`` seconds before the exchange (a breaker opened before a wait for its
verdict) is replayed at the backend's ``now - age``, never later, so a span opened
before a wait ends when the wait does. Records come back converted through "seconds
left" (a time ``t`` on the backend becomes ``turn_now + (t - backend_now)``), so hosts
whose clocks disagree agree on how long a cooldown has to run. Replays are pure, so an
optimistic backend may retry them.

A backend raising `StoreUnavailable`: the turn goes on with the replica (local health), the
journal is kept to be written later (bounded), one WARNING per outage is logged on the
``fallgate`` logger, and the next exchange tries again (a backend bounds its own time:
SQLite fails fast for a second after a lock held past its busy timeout). An outage ends
with an exchange that *wrote*: a full disk still answers reads, and must not end and
start an outage (a WARNING) on every turn. A turn never fails because of its store.

A round-robin pool's cursor is taken from the backend in `begin` (for the turn's first
target), so the processes of a fleet share one cursor exactly, not one replica each.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

from . import headroom as room
from . import records as fleet
from .backend import Backend, Record, Records, StoreUnavailable
from .grants import AttemptView, TurnView, Update, no_headroom, refusal
from .store import HealthStore

if TYPE_CHECKING:
    from ..policy.model import Target

__all__ = ["DEFAULT_TTL", "SharedHealthStore"]

logger = logging.getLogger("fallgate")

#: How long a record outlives its last write (seconds): longer than any open span or
#: failure window the defaults produce, so only backends nobody reports on are forgotten.
DEFAULT_TTL: Final = 86_400.0
#: Journal entries kept while the backend is unreachable (the oldest are dropped).
MAX_JOURNAL: Final = 10_000

#: Round-robin positions taken in `begin` and not yet used, kept per target: a turn that
#: does not reach its first target (benched) leaves one; the oldest go first.
_RR_KEPT: Final = 64

Entry = tuple[str, Update, float]  # (shared key, pure update, when: the turn clock)


class SharedHealthStore(HealthStore):
    """A `HealthStore` shared through `backend` (see the module docstring).

    `ttl`: seconds a record outlives its last write. `name` shows in logs (default: the
    backend's `url`, which never holds a password)."""

    __slots__ = (
        "_down",
        "_entries",
        "_id",
        "_jlock",
        "_rr",
        "backend",
        "name",
        "ttl",
    )

    shared: ClassVar[bool] = True
    journals: ClassVar[bool] = True

    def __init__(
        self,
        backend: Backend,
        *,
        ttl: float = DEFAULT_TTL,
        name: str | None = None,
    ):
        super().__init__()
        if not isinstance(backend, Backend):
            raise TypeError(
                f"backend must implement fsm.health.backend.Backend, got {type(backend).__name__}"
            )
        if not (isinstance(ttl, int | float) and ttl > 0):
            raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
        self.backend = backend
        self._rr: dict[Any, deque[int]] = {}  # round-robin positions taken from the backend
        self.ttl = float(ttl)
        self.name = name if name is not None else backend.url
        self._entries: list[Entry] = []
        self._jlock = threading.Lock()
        self._down = False
        self._id = uuid.uuid4().hex[:12]  # this process's store, in lease holder ids

    def __repr__(self) -> str:
        return f"SharedHealthStore({self.name!r})"

    # -- the journal ---------------------------------------------------------------------------
    def _journal(self, target: Any, cred: str | None, fn: Update, now: float) -> None:
        key = fleet.target_key(target) if cred is None else fleet.credential_key(target, cred)
        with self._jlock:
            self._entries.append((key, fn, now))
            if len(self._entries) > MAX_JOURNAL:
                del self._entries[: len(self._entries) - MAX_JOURNAL]

    def _journal_room(self, target: Any, cred: str, fn: Update, now: float) -> None:
        with self._jlock:
            self._entries.append((room.headroom_key(target, cred), fn, now))
            if len(self._entries) > MAX_JOURNAL:
                del self._entries[: len(self._entries) - MAX_JOURNAL]

    def _take_journal(self) -> list[Entry]:
        with self._jlock:
            out, self._entries = self._entries, []
        return out

    def _give_back(self, entries: list[Entry]) -> None:
        with self._jlock:
            self._entries[:0] = entries
            if len(self._entries) > MAX_JOURNAL:
                del self._entries[: len(self._entries) - MAX_JOURNAL]

    def pending(self) -> int:
        """Journal entries not yet written to the backend."""
        with self._jlock:
            return len(self._entries)

    def _owner_prefix(self) -> str:
        return f"{self._id}-"

    # -- the exchanges (the host loop's) -------------------------------------------------------
    def begin(self, s: TurnView) -> None:
        first = s.policy.targets[s.first]
        if first.rotation != "round_robin" or len(first.pool()) < 2:
            self._exchange(s, _chain_keys(s), ())
            return
        key = fleet.target_key(first.key)
        taken: list[int] = []

        def advance(r: Record, now: float) -> Record:
            out, n = fleet.advance(r)
            taken[:] = [n]
            return out

        given = self._exchange(s, _chain_keys(s), ((key, advance),))
        if given is not None and all(given) and taken:
            with self._lock:
                self._rr.setdefault(first.key, deque(maxlen=_RR_KEPT)).append(taken[0])

    def next_round_robin(self, target: Any, size: int, now: float = 0.0) -> int:
        """A position `begin` took from the backend when there is one (exact across the
        fleet), else the replica's (local, journalled like any other change)."""
        with self._lock:
            taken = self._rr.get(target)
            if taken:
                return taken.popleft() % size
        return super().next_round_robin(target, size, now)

    def grant(self, s: TurnView, a: AttemptView) -> str | None:
        taken = self.reservation(s, a)
        if taken is None and not (a.probe or a.retry) and a.number == 1 and not self.pending():
            return None  # `begin` has just read the chain: nothing to write or take
        grants: list[tuple[str, Update]] = [(fleet.target_key(a.target.key), self.permit(s, a))]
        if taken is not None:
            (tkey, hid), rid, fn = taken
            grants.append((room.headroom_key(tkey, hid), fn))
        given = self._exchange(s, _chain_keys(s), grants)
        if given is None:  # unreachable: the replica decides, as a local store would
            return super().grant(s, a)
        if all(given):
            if taken is not None:
                s.reserved = (tkey, hid, rid)
            return None
        now = s.clock()
        if taken is not None and not given[1]:
            return no_headroom(a, self.headroom(tkey, hid), now, s.cost or 0.0)
        return refusal(a, self.record(a.target.key), now, s.owner)

    def end(self, s: TurnView) -> None:
        if self.pending():
            self._exchange(s, (), ())

    def _exchange(
        self,
        s: TurnView,
        keys: tuple[str, ...],
        grants: Sequence[tuple[str, Update]],
    ) -> list[bool] | None:
        """One round trip: write the journal, apply the grants (all or none: a refused
        one leaves every other unwritten), read `keys` back into the replica. Returns
        which grants were given, None when the backend is unreachable."""
        entries = self._take_journal()
        wanted = list(dict.fromkeys([*keys, *(k for k, _, _ in entries)]))
        told = s.clock()  # each change's age is told from here (`_age`)
        ages = [_age(told, at, self.ttl) for _, _, at in entries]
        for k, _ in grants:
            if k not in wanted:
                wanted.append(k)
        given: list[bool] = []
        wrote: list[bool] = [False]  # the backend took a write (read-only calls prove nothing)

        def update(records: Records, now: float) -> Records:
            out: dict[str, Record | None] = dict(records)
            for (k, fn, _), age in zip(entries, ages, strict=True):
                new = fn(out.get(k) or {}, now - age)
                if new is not None:
                    out[k] = new or None
            taken: dict[str, Record | None] = {}
            given[:] = []
            for k, fn in grants:
                new = fn(taken.get(k) or out.get(k) or {}, now)
                given.append(new is not None)
                if new is not None:
                    taken[k] = new or None
            if all(given):
                out.update(taken)
            changed = {k: v for k, v in out.items() if v != records.get(k)}
            wrote[0] = bool(changed)
            return changed

        try:
            records, backend_now = self.backend.transact(wanted, update, self.ttl)
        except StoreUnavailable as e:
            self._give_back(entries)
            if not self._down:
                self._down = True
                logger.warning(
                    "fallgate: health store %s unreachable (%s); going on with local health, "
                    "will retry",
                    self.name,
                    e,
                )
            return None
        if self._down and wrote[0]:
            self._down = False
            logger.info("fallgate: health store %s reachable again", self.name)
        self._pull(records, backend_now, s.clock())
        return given

    def _pull(self, records: Records, backend_now: float, now: float) -> None:
        """Replace the replica's records with the backend's, in the turn clock."""
        shift = now - backend_now
        targets = self._by_target(records)
        with self._lock:
            for key, r in records.items():
                where = room.parse_headroom_key(key) if key[:2] == "h|" else None
                if where is None:
                    continue
                clean = room.shifted(r, shift) if r else None
                if clean:
                    self.room[where] = clean
                else:
                    self.room.pop(where, None)
            for key, (tkey, cred) in targets.items():
                r = records.get(key)
                if cred is None:
                    clean = _shifted(r, shift) if r else None
                    if clean:
                        self._targets[tkey] = clean
                    else:
                        self._targets.pop(tkey, None)
                else:
                    until = fleet.num(r, "until") if r else 0.0
                    until = until if math.isfinite(until) else 0.0
                    if until > backend_now:
                        self._cred_until[(tkey, cred)] = until + shift
                    else:
                        self._cred_until.pop((tkey, cred), None)

    def _by_target(self, records: Records) -> dict[str, tuple[Any, str | None]]:
        """Shared key -> (replica target key, credential health id or None)."""
        out: dict[str, tuple[Any, str | None]] = {}
        for key in records:
            parsed = fleet.parse_key(key)
            if parsed is not None:
                out[key] = parsed
        return out


def _chain_keys(s: TurnView) -> tuple[str, ...]:
    """The shared keys a turn can read: its chain's targets and their credentials."""
    memo = s.policy.memo
    found = memo.get("shared_keys")
    if not isinstance(found, dict):
        found = memo["shared_keys"] = {}
    keys = found.get(s.first)
    if keys is None:
        targets: tuple[Target, ...] = s.policy.targets[s.first :]
        keys = tuple(dict.fromkeys(k for t in targets for k in fleet.keys_of(t)))
        if s.policy.pacing:  # the keys' headroom records too
            keys += tuple(room.headroom_key(t.key, c.health_id) for t in targets for c in t.pool())
        found[s.first] = keys
    return keys


def _age(now: float, at: float, most: float) -> float:
    """How long ago (seconds, at most `most`) a change made at `at` was, at `now`: never
    negative (a change is never replayed in the future), and bounded (a turn on a clock
    of its own, say a test's virtual one, cannot push a change out of any window)."""
    age = now - at
    return min(age, most) if age > 0.0 else 0.0


def _shifted(r: Record, shift: float) -> Record:
    """A backend's target record in the turn clock, with only well-typed fields kept (the
    core reads records with plain gets)."""
    out: Record = {}
    for f, v in r.items():
        if f == "owner":
            if isinstance(v, str):
                out[f] = v
        elif isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[f] = v + shift if f in fleet.TIMES and v > 0 else v
    return out
