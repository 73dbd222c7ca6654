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

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeAlias, runtime_checkable

Record: TypeAlias = dict[str, "float | int | str | None"]
Records: TypeAlias = Mapping[str, "Record | None"]
Update: TypeAlias = Callable[[Records, float], Records]


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
