"""The grant before an attempt: the check-and-take a health store applies to the target's
record (the probe lease, a retry token), what it reads of the turn and the attempt, and
the words of a refusal. Pure: `fsm.health.store` applies these under its lock, a shared
store on its replica and its backend."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Protocol

from . import headroom as room
from . import records as fleet
from .backend import Record

if TYPE_CHECKING:
    from ..policy.model import Credential, Policy
    from ..policy.targets import Target

#: A pure update of one record at `now` (`fsm.health.records`); None refuses.
Update = Callable[[Record, float], "Record | None"]


class TurnView(Protocol):
    """What the store reads of a turn (`fsm.core.state.TurnState` is one): the store sits
    below the core, so it names the few facts it needs instead of the core's class."""

    owner: str  # the turn's id as a lease holder ("" until `HealthStore.owner` makes it)
    #: the headroom reservation of the attempt in flight: (target key, health id, id)
    reserved: tuple[Hashable, str, str] | None
    cost: float | None  # the tokens one attempt is expected to use (None: pacing off)

    @property
    def policy(self) -> Policy: ...
    @property
    def first(self) -> int: ...
    @property
    def clock(self) -> Callable[[], float]: ...


class AttemptView(Protocol):
    """What the store reads of an attempt (`fsm.core.actions.Attempt` is one)."""

    @property
    def target(self) -> Target: ...
    @property
    def number(self) -> int: ...
    @property
    def probe(self) -> bool: ...
    @property
    def retry(self) -> bool: ...
    @property
    def credential(self) -> Credential: ...
    @property
    def timeout(self) -> float: ...


def take_grant(
    r: Record, now: float, policy: Policy, probe: bool, retry: bool, owner: str
) -> Record | None:
    """The check-and-take of one attempt's grant: refused while the target's breaker is
    open (another turn's report opened it after this attempt was decided), or half-open
    unless the attempt is its probe; a probe takes the lease, a retry a token."""
    # records in fsm hold numbers only (a shared store's pull checks them): plain gets
    if r.get("until", 0.0) > now:  # type: ignore[operator]
        return None
    if probe:
        out = fleet.acquire(r, now, owner, fleet.lease_for(policy))
        return fleet.spend(out, policy) if retry and out is not None else out
    if r.get("opens"):
        return None  # half-open: only its probe may call it
    return fleet.spend(r, policy) if retry else r


def grant_update(policy: Policy, probe: bool, retry: bool, owner: str) -> Update:
    """`take_grant` as a pure update of one record."""
    return lambda r, now: take_grant(r, now, policy, probe, retry, owner)


def no_headroom(a: AttemptView, r: Record, now: float, cost: float) -> str:
    """Why a reservation was refused: which limit of the key is used up, and its reset."""
    return f"{a.credential.id} of {a.target.name} has no headroom: {room.why_empty(r, now, cost)}"


def refusal(a: AttemptView, r: Record, now: float, owner: str) -> str:
    """Why the store refused attempt `a` (its target's record `r` as the grant saw it)."""
    if fleet.num(r, "until") > now:
        return f"{a.target.name}'s breaker opened ({fleet.num(r, 'until') - now:.1f}s left)"
    if not a.probe and fleet.count(r, "opens") > 0:
        return f"{a.target.name} is half-open: only its probe may call it"
    if a.probe and not fleet.probe_free(r, now, owner):
        return f"{a.target.name} is half-open and another turn is probing it"
    return f"the retry budget of {a.target.name} is empty"
