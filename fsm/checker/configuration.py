"""Configuration identity: when two configurations are the same, and how to copy one.

A configuration is a running turn (its state), its health store, its clock and the
checker's record of the turn. The search merges configurations with equal keys, so
a key holds everything the rest of the turn can depend on, and nothing else:

* facts about targets already left are dropped from running configurations (no
  ping-pong is itself checked, so they are never read again in that turn), except
  which of their cooldowns are running (what the next turn's start depends on);
* time is relative: cooldowns as "seconds left", and "seconds left" beyond the whole
  search's horizon are one value; the turn's elapsed time is kept only while the
  deadline can still bind (elapsed + the most the rest of the turn can wait).

The turn's own part of the key is `TurnState.key()` and the health store's is
`HealthStore.key()`: the engine owns its identity (and says which fields it leaves
out, and why); `audit` checks that configurations merged by the key behave alike.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

from ..actions import Attempt, Rebuild, Wait
from ..backoff import cooldown_for, wake_spread
from ..health import HealthStore, relative
from ..machine import TERMINALS
from ..policy import Policy
from ..state import MIN_ATTEMPT
from ..testing import FakeClock
from ..turn import TurnState
from .context import Bounds, TargetKey

if TYPE_CHECKING:
    from .oracle import Obs
    from .search import Checker, Live

EPS: Final = 1e-6

#: The slots a turn must start afresh (the others are shared with the turn's host).
PER_TURN_SLOTS: Final = tuple(
    n
    for n in TurnState.__slots__
    if n not in ("clock", "health", "hook", "policy", "random", "decl")
)


# -- copies -----------------------------------------------------------------------------------


def copy_health(h: HealthStore) -> HealthStore:
    """A copy of a health store (its class may be a deliberately broken subclass)."""
    return h.copy()


def copy_state(s: TurnState, health: HealthStore, clock: FakeClock) -> TurnState:
    """A copy of a turn's state on its own health store and clock (the trace starts empty:
    the checker reads each transition's record as it is made)."""
    return s.copy(health, clock)


# -- the time abstraction ---------------------------------------------------------------------


def streak_saturation(policy: Policy) -> int:
    """The failure streak from which a target's cooldown no longer grows (streaks beyond
    it are one value)."""
    c = policy.cooldown
    for n in range(1, 200):
        if cooldown_for(c, n) >= c.cap:
            return n
    return 200


def wait_maxima(policy: Policy, bounds: Bounds, sat: int) -> tuple[float, float]:
    """The longest single wait a correct engine can ask for with this alphabet: at turn
    start (every target cooling), and before any other attempt."""
    p = policy
    cap = p.retry_after_cap
    b = bounds
    single = max(cap, p.backoff.cap)

    def spread(x: float) -> float:  # a wait for a bench or Retry-After to end, worst case
        return x + max(0.0, min(wake_spread(p.backoff, x), single - x))

    spans = [b.large, p.cooldown.cap] + ([b.small] if b.small is not None else [])
    step_max = max([spread(p.backoff.cap), *[spread(x) for x in spans if x <= cap]])
    cools = [cooldown_for(p.cooldown, n) for n in range(1, sat + 1)]
    start_max = max([step_max, *[spread(x) for x in cools if x <= cap]])
    return start_max, step_max


def far(c: Checker, o: Obs, lo: int, elapsed: float) -> bool:
    """True when the deadline can no longer bind in this turn, whatever happens: a
    correct engine waits at most max_attempts-1 times per target (every retry needs
    attempts < max_attempts; rotations and fallbacks do not wait), each wait at most
    `step_max`, plus one wait at turn start."""
    if not c.abstract_time:
        return False
    most = c.rest_time[lo] + (c.start_max if o.cur < 0 else 0.0)
    return elapsed + most + MIN_ATTEMPT <= c.policy.deadline - EPS


# -- keys -------------------------------------------------------------------------------------


def health_slots(
    policy: Policy,
) -> tuple[list[list[TargetKey]], list[list[tuple[TargetKey, str]]]]:
    """Per position in the chain: the target keys and (target key, credential) pairs at
    or after it (the health facts a turn there can still read)."""
    keys = [t.key for t in policy.targets]
    creds = list(dict.fromkeys((t.key, c.health_id) for t in policy.targets for c in t.pool()))
    hk_targets: list[list[TargetKey]] = []
    hk_creds: list[list[tuple[TargetKey, str]]] = []
    for lo in range(len(keys)):
        ahead = list(dict.fromkeys(keys[lo:]))
        hk_targets.append(ahead)
        hk_creds.append([ck for ck in creds if ck[0] in ahead])
    return hk_targets, hk_creds


def health_key(c: Checker, h: HealthStore, now: float, lo: int) -> tuple[Any, ...]:
    """The health facts a running turn at chain position `lo` can still depend on."""
    return h.key(now, c.hk_targets[lo], c.hk_creds[lo], c.long, c.sat, c.sizes, c.tokens, c.window)


def health_class(c: Checker, h: HealthStore, now: float) -> tuple[Any, ...]:
    """What a next turn can depend on, coarsely: which cooldowns run (and whether they
    outlast the search), failure streaks, round-robin positions. Turn ends in one class
    continue from one representative health store."""
    targets, creds = c.hk_targets[0], c.hk_creds[0]
    k = h.key(now, targets, creds, c.long, c.sat, c.sizes, c.tokens, c.window)
    n = len(targets) + len(creds)
    running = tuple(0 if v == 0 else (2 if v == math.inf else 1) for v in k[:n])
    return running + tuple(_holder(x, "") for x in k[n:])


def key(c: Checker, live: Live) -> tuple[Any, ...]:
    """The configuration's identity: (action, time, the turn's state key, the checker's
    record, health). A terminal configuration is its turn number and end state, or, when
    another turn follows, the class of health that turn starts from."""
    s = live.turn.s
    o = live.obs
    now = live.clock.t
    state = s.state
    if state in TERMINALS:
        if o.turn >= c.turns:
            return (o.turn, state)
        return (o.turn, "end", health_class(c, s.health, now))
    cur = s.visit.index
    lo = cur if cur > 0 else 0
    if s.context_floor is not None:  # a move back to an unknown-length target is possible
        lo = min(lo, s.context_from + 1)
    a = s.action
    cls = type(a)
    if cls is Attempt:
        ak: tuple[Any, ...] = ("A", a.target.index, a.credential.id)  # type: ignore[union-attr]
    elif cls is Wait:
        ak = ("W", a.seconds)  # type: ignore[union-attr]
    elif cls is Rebuild:
        ak = ("R",)
    else:
        ak = (cls.__name__,)
    long = c.long
    elapsed = now - s.started
    timed = not far(c, o, lo, elapsed)
    time_k = (round(elapsed, 6), round(o.waits, 6)) if timed else None
    oc = o.cur
    mine = (
        o.turn,
        o.tried,
        oc,
        o.cred,
        o.attempts[oc] if oc >= 0 else 0,
        o.rot[oc] if oc >= 0 else 0,
        tuple(sorted(cid for j, cid in o.banned if j == oc)) if o.banned else (),
        tuple(
            sorted(
                (k[1], relative(v, now, long)) for k, v in o.nb.items() if k[0] == oc and v > now
            )
        ),
        relative(o.tnb.get(oc, 0.0), now, long),
        o.floor,
        o.floor_from,
        o.committed,
        (o.last.kind, o.last.retry_after) if o.last is not None else None,
        o.since_wait,
        o.expect,
    )
    hk = tuple(_holder(x, s.owner) for x in health_key(c, s.health, now, lo))
    return (ak, time_k, s.key(now, long, timed), mine, hk)


def _holder(x: Any, owner: str) -> Any:
    """A probe lease in a health key, its holder as "this turn" or "another" (holder ids
    are unique per turn: two runs of one search number them differently)."""
    if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], str):
        return (x[0], "mine" if x[1] == owner else "other")
    return x
