"""A health store shared by the processes (and hosts) of a fleet, through a `Backend`.

`SharedHealthStore(backend)` is a `HealthStore` whose records are a local replica: the
turn's guards and effects read and write it synchronously, as they do the in-memory store,
and every change is journalled as the pure update that made it (`fsm.fleet`). The host
loops exchange with the backend at fixed points, one `Backend.transact` each:

* `begin` (before the turn starts): read the records of the turn's chain;
* `grant` (before each attempt): write the journal, take the probe lease or the retry
  token if the attempt needs one (atomically, on the backend's current record), and read
  the records back. The turn's first attempt skips it when `begin` has just read
  everything and there is nothing to write or take: at most one round trip per attempt;
* `end` (after the turn): write the journal.

The journal is replayed on the backend with the backend's own `now`, and records come
back converted through "seconds left" (a time ``t`` on the backend becomes
``turn_now + (t - backend_now)``), so hosts whose clocks disagree agree on how long a
cooldown has to run. Replays are pure, so an optimistic backend may retry them.

A backend raising `StoreUnavailable`: the turn goes on with the replica (local health), the
journal is kept to be written later (bounded), one WARNING per outage is logged on the
``fallgate`` logger, and the next exchange tries again. A turn never fails because of its
store.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from typing import TYPE_CHECKING, Any, ClassVar, Final

from . import fleet
from .health import HealthStore, Update, refusal
from .store import Backend, Record, Records, StoreUnavailable

if TYPE_CHECKING:
    from .actions import Attempt
    from .policy import Target
    from .state import TurnState

__all__ = ["DEFAULT_TTL", "SharedHealthStore"]

logger = logging.getLogger("fallgate")

#: How long a record outlives its last write (seconds): longer than any open span or
#: failure window the defaults produce, so only backends nobody reports on are forgotten.
DEFAULT_TTL: Final = 86_400.0
#: Journal entries kept while the backend is unreachable (the oldest are dropped).
MAX_JOURNAL: Final = 10_000

Entry = tuple[str, Update]  # (shared key, pure update)


class SharedHealthStore(HealthStore):
    """A `HealthStore` shared through `backend` (see the module docstring).

    `ttl`: seconds a record outlives its last write. `name` shows in logs (default: the
    backend's `url`, which never holds a password)."""

    __slots__ = ("_down", "_entries", "_id", "_jlock", "backend", "name", "ttl")

    shared: ClassVar[bool] = True
    journals: ClassVar[bool] = True

    def __init__(self, backend: Backend, *, ttl: float = DEFAULT_TTL, name: str | None = None):
        super().__init__()
        if not isinstance(backend, Backend):
            raise TypeError(
                f"backend must implement fsm.store.Backend, got {type(backend).__name__}"
            )
        if not (isinstance(ttl, int | float) and ttl > 0):
            raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
        self.backend = backend
        self.ttl = float(ttl)
        self.name = name if name is not None else backend.url
        self._entries: list[Entry] = []
        self._jlock = threading.Lock()
        self._down = False
        self._id = uuid.uuid4().hex[:12]  # this process's store, in lease holder ids

    def __repr__(self) -> str:
        return f"SharedHealthStore({self.name!r})"

    # -- the journal ---------------------------------------------------------------------------
    def _journal(self, target: Any, cred: str | None, fn: Update) -> None:
        key = fleet.target_key(target) if cred is None else fleet.credential_key(target, cred)
        with self._jlock:
            self._entries.append((key, fn))
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
    def begin(self, s: TurnState) -> None:
        self._exchange(s, _chain_keys(s), None, None)

    def grant(self, s: TurnState, a: Attempt) -> str | None:
        if not (a.probe or a.retry) and a.number == 1 and not self.pending():
            return None  # `begin` has just read the chain: nothing to write or take
        key = fleet.target_key(a.target.key)
        fn = self.permit(s, a)
        granted = self._exchange(s, _chain_keys(s), key, fn)
        if granted is None:  # unreachable: the replica decides, as a local store would
            return super().grant(s, a)
        if granted:
            return None
        r = self.record(a.target.key)
        return refusal(a, r, s.clock(), s.owner)

    def end(self, s: TurnState) -> None:
        if self.pending():
            self._exchange(s, (), None, None)

    def _exchange(
        self,
        s: TurnState,
        keys: tuple[str, ...],
        grant_key: str | None,
        grant: Update | None,
    ) -> bool | None:
        """One round trip: write the journal, apply the grant, read `keys` back into the
        replica. Returns whether the grant was given (True without one), None when the
        backend is unreachable."""
        entries = self._take_journal()
        wanted = list(dict.fromkeys([*keys, *(k for k, _ in entries)]))
        if grant_key is not None and grant_key not in wanted:
            wanted.append(grant_key)
        given: list[bool] = [True]

        def update(records: Records, now: float) -> Records:
            out: dict[str, Record | None] = dict(records)
            for k, fn in entries:
                new = fn(out.get(k) or {}, now)
                if new is not None:
                    out[k] = new or None
            ok = True
            if grant is not None and grant_key is not None:
                new = grant(out.get(grant_key) or {}, now)
                ok = new is not None
                if new is not None:
                    out[grant_key] = new or None
            given[0] = ok
            return {k: v for k, v in out.items() if v != records.get(k)}

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
        if self._down:
            self._down = False
            logger.info("fallgate: health store %s reachable again", self.name)
        self._pull(records, backend_now, s.clock())
        return given[0]

    def _pull(self, records: Records, backend_now: float, now: float) -> None:
        """Replace the replica's records with the backend's, in the turn clock."""
        shift = now - backend_now
        targets = self._by_target(records)
        with self._lock:
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


def _chain_keys(s: TurnState) -> tuple[str, ...]:
    """The shared keys a turn can read: its chain's targets and their credentials."""
    memo = s.policy.memo
    found = memo.get("shared_keys")
    if not isinstance(found, dict):
        found = memo["shared_keys"] = {}
    keys = found.get(s.first)
    if keys is None:
        targets: tuple[Target, ...] = s.policy.targets[s.first :]
        keys = found[s.first] = tuple(dict.fromkeys(k for t in targets for k in fleet.keys_of(t)))
    return keys


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
