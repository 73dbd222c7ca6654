"""What a shared health store's backend must provide: an atomic read-modify-write of records.

A backend knows nothing of cooldowns, breakers or budgets. It keeps JSON-able records
(``dict[str, float | int | str | None]``) under string keys, and runs a caller's pure
`update` function on the current records of some keys as one atomic step, in its own
clock (`now`: seconds in the backend's time domain, e.g. Redis ``TIME`` or the host's
wall clock for a file shared by the processes of one host). What the records mean,
and how an outcome changes them, lives in `fsm` (one home), so the in-memory store,
SQLite and Redis cannot disagree.

`update` may be called more than once for one `transact` (an optimistic backend
retries it on a conflict), so it must be pure: no side effects, same input, same
output. A record mapped to ``None`` in its result is deleted.

Backends raise `StoreUnavailable` (and nothing else) when they cannot be reached; the
shared store then goes on with local health and says so once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeAlias, runtime_checkable

Record: TypeAlias = dict[str, "float | int | str | None"]
Records: TypeAlias = Mapping[str, "Record | None"]
Update: TypeAlias = Callable[[Records, float], Records]


#: The largest number a record may hold: times are seconds of the backend's wall clock
#: (about 1.8e9 today; 1e10 is the year 2286), counts far below it.
MAX_NUMBER = 1e10


def _no_constant(name: str) -> float:
    raise ValueError(f"not a number: {name}")  # NaN, Infinity: JSON has no such numbers


def _sane(value: object) -> bool:
    if value is None or isinstance(value, str):
        return True
    return isinstance(value, int | float) and -MAX_NUMBER <= value <= MAX_NUMBER


def decode_record(text: str) -> Record | None:
    """A stored record's JSON text as a record; None for text that is not a JSON object
    of plain fields (a damaged row, another program's key, a NaN or a number no clock or
    count reaches): read as absent, and replaced by the next write, so that no turn, and
    no ``fallgate health``, fails because of its store."""
    try:
        record = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not all(_sane(v) for v in record.values()):
        return None
    return record


class StoreUnavailable(Exception):
    """The backend cannot be reached now (the message names the store, never a secret)."""


@runtime_checkable
class Backend(Protocol):
    """An atomic record store shared by turns of several processes (or hosts)."""

    #: Where the records live, safe to print (no password): ``sqlite:///path``, ``redis://host:port/0``.
    url: str

    def transact(self, keys: Sequence[str], update: Update, ttl: float) -> tuple[Records, float]:
        """Atomically: read `keys` (absent ones as ``None``), call ``update(records, now)``,
        write what it returns (each kept at least `ttl` seconds after its last write,
        ``None`` deletes), and return the records now in force for `keys` with `now`."""
        ...

    def scan(self) -> tuple[Records, float]:
        """Every record and the backend's `now` (for ``fallgate health``)."""
        ...

    def delete(self, prefix: str) -> int:
        """Delete the records whose key starts with `prefix`; returns how many."""
        ...

    def close(self) -> None: ...


class MemoryBackend:
    """A `Backend` in this process's memory (thread-safe): for tests, the model checker,
    and turns of several threads that want the shared store's exact exchange semantics.

    `clock` is the backend's own clock (default: the wall clock), deliberately apart from
    the turns' clocks: a test can make them disagree."""

    url = "memory://"

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        import threading
        import time

        self._clock = clock if clock is not None else time.time
        self._lock = threading.Lock()
        self._data: dict[str, tuple[Record, float]] = {}
        #: How many `transact` calls were made (round trips, for tests and benches).
        self.round_trips = 0

    def _live(self, key: str, now: float) -> Record | None:
        found = self._data.get(key)
        if found is None:
            return None
        if found[1] <= now:
            del self._data[key]
            return None
        return found[0]

    def transact(self, keys: Sequence[str], update: Update, ttl: float) -> tuple[Records, float]:
        with self._lock:
            self.round_trips += 1
            now = self._clock()
            current = {k: self._live(k, now) for k in keys}
            snapshot = {k: (dict(r) if r is not None else None) for k, r in current.items()}
            written = update(snapshot, now)
            for k, r in written.items():
                if r is None:
                    self._data.pop(k, None)
                    current[k] = None
                else:
                    self._data[k] = (dict(r), now + ttl)
                    current[k] = dict(r)
            return {k: current.get(k) for k in keys}, now

    def scan(self) -> tuple[Records, float]:
        with self._lock:
            now = self._clock()
            return {k: dict(r) for k in list(self._data) if (r := self._live(k, now))}, now

    def delete(self, prefix: str) -> int:
        with self._lock:
            gone = [k for k in self._data if k.startswith(prefix)]
            for k in gone:
                del self._data[k]
            return len(gone)

    def close(self) -> None:
        pass
