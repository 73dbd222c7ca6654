"""Configuration identity: when two configurations are the same, and how to copy one.

A configuration is a running turn (its state), its health store, its clock and the
checker's record of the turn. The search merges configurations with equal keys, so
a key holds everything the rest of the turn can depend on, and nothing else:

* facts about targets already left are dropped from running configurations (no
  ping-pong is itself checked, so they are never read again in that turn), except
  which of their cooldowns are running (what the next turn's start depends on);
* time is relative: cooldowns as "seconds left", and "seconds left" beyond the whole
  search's horizon are one value; the turn's elapsed time is kept only while the
  deadline can still bind (elapsed + the most the rest of the turn can wait);
* the targets a turn tried before the current one are dropped (`behind`), unless a
  context floor allows a move back or an identical target lies ahead: the rest of
  the turn cannot read them;
* a configuration of a later turn that is followed no further (`is_leaf`) is its
  turn, state and action: its transitions in were checked, and nothing reads it;
* which earlier target was the silent one, and the target a turn-start wait was for
  once an attempt was made, are not keyed (nothing reads them);
* a finished turn's health is keyed up to the second target surely ready
  (`health_class`): a next turn followed two events reads no further.

The last two are the reductions of docs/design.md ("The checker at the scale of real
chains"); `Checker(reduce=False)` keys without them, for the test that compares both.

The turn's own part of the key is `TurnState.key()` and the health store's is
`HealthStore.key()`: the engine owns its identity (and says which fields it leaves
out, and why); `audit` checks that configurations merged by the key behave alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from ..clock import VirtualClock
from ..core.actions import Attempt, Rebuild, Wait
from ..core.machine import TERMINALS
from ..core.turn import TurnState
from ..health.store import HealthStore, relative
from ..policy.model import Policy
from .context import TargetKey
from .pacing import next_turn_class
from .timing import cooling_rest, far, time_key

if TYPE_CHECKING:
    from ..core.turn import TurnBase
    from .oracle import Obs
    from .search import Checker

#: A turn's silent target as keyed once the turn has left it: which target it was is read
#: by nothing (only whether it is none yet, the current one, or another; `far`, `bands`,
#: the search's loud alphabet), and a turn never returns to a tried target.
OTHER_SILENT: Final = -2
#: The probe-lease owner a next turn is to the health store (anyone but the turn that ended).
NOBODY: Final = "\x00next turn"

#: The slots a turn must start afresh (the others are shared with the turn's host).
PER_TURN_SLOTS: Final = tuple(
    n
    for n in TurnState.__slots__
    if n not in ("clock", "health", "hook", "policy", "random", "decl")
)


# -- copies -----------------------------------------------------------------------------------


class Live:
    """An unexpanded configuration: a running turn, its clock, the checker's record."""

    __slots__ = ("clock", "obs", "turn")

    def __init__(self, turn: TurnBase, clock: VirtualClock, obs: Obs) -> None:
        self.turn = turn
        self.clock = clock
        self.obs = obs


def copy_health(h: HealthStore) -> HealthStore:
    """A copy of a health store (its class may be a deliberately broken subclass)."""
    return h.copy()


def copy_state(s: TurnState, health: HealthStore, clock: VirtualClock) -> TurnState:
    """A copy of a turn's state on its own health store and clock (the trace starts empty:
    the checker reads each transition's record as it is made)."""
    return s.copy(health, clock)


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
    continue from one representative health store.

    With `reduce`, and a next turn followed at most two events (its start and the
    outcome of its first attempt), the targets after the second one ready (as that
    turn's engine reads it: `HealthStore.ready_at` with a fresh turn's cost, so a key
    out of pacing's headroom is cooling) are left out: that turn starts on the first
    ready target and falls back at most to the first ready after it (docs/design.md,
    "The checker at the scale of real chains")."""
    upto = len(c.class_slots) - 1
    if c.reduce and c.follow_events <= 2:
        found = 0
        cost = 0.0 if c.policy.pacing else None  # a fresh turn's (`TurnState.cost`)
        ready = h.ready_at
        for j, (tk, pool) in enumerate(zip(c.ctx.keys, c.ctx.pools, strict=True)):
            if ready(tk, pool, NOBODY, cost, now) <= now:
                found += 1
                if found == 2:
                    upto = j
                    break
    targets, creds = c.class_slots[upto]
    k = h.key(now, targets, creds, c.long, c.sat, c.sizes, c.tokens, c.window)
    n = len(targets) + len(creds)
    inf = math.inf
    out: list[Any] = [upto]
    out += [0 if v == 0 else (2 if v == inf else 1) for v in k[:n]]
    rest: list[Any] | tuple[Any, ...] = _leases(k[n:], len(targets), "")
    m = PER_TARGET * len(targets)
    if c.reduce and c.follow_events <= 2:  # a next turn's first outcome asks for one token
        rest = list(rest)
        for p in range(TOKENS_AT, m, PER_TARGET):
            rest[p] = 1.0 if rest[p] >= 1.0 else 0.0
    if len(rest) > m:  # the headroom records
        out += rest[:-1]
        out.append(next_turn_class(rest[-1]))
    else:
        out += rest
    return tuple(out)


def end_class(c: Checker, h: HealthStore, now: float) -> tuple[Any, ...]:
    """`health_class` of a finished turn, worked out once per configuration expanded for
    the ends that changed no health record and took no time (`Checker.end_memo`: most of
    an attempt's outcomes end the turn, and a third of those change nothing): the class
    reads only the store's records and the time."""
    memo = c.end_memo
    if memo is not None and memo[0] == now and type(h) is HealthStore and not h.room:
        targets, creds = h.raw_facts(copy=False)
        if targets == memo[1] and creds == memo[2]:
            found = memo[3]
            if found is None:
                found = memo[3] = health_class(c, h, now)
            return found  # type: ignore[no-any-return]
    return health_class(c, h, now)


#: Entries per target in the second part of `HealthStore.key` (openings, failures, lease,
#: tokens, round robin), the lease third, the retry tokens fourth.
PER_TARGET: Final = 5
LEASE_AT: Final = 2
TOKENS_AT: Final = 3


def _budget(c: Checker, k: tuple[Any, ...], lo: int, cur: int, attempts: int) -> tuple[Any, ...]:
    """`k` (the per-target part of a running turn's store key from chain position `lo`)
    with the current target's retry tokens counted up to what the rest of the turn can
    tell apart: each of its grants takes at most one (a retry), there are at most
    `per_target - attempts + 1` of them (the pending attempt's included), and at the
    turn's end a next turn asks only whether one is left (`health_class`). Tokens are
    taken and put back only on the target the turn is on, and a turn never returns to a
    target it left; so counts from `per_target - attempts + 2` up behave alike."""
    at = c.hk_at[lo].get(cur)
    if at is None:
        return k
    p = PER_TARGET * at + TOKENS_AT
    cap = float(c.bounds.per_target[cur] - attempts + 2)
    x = k[p]
    if not (isinstance(x, float) and x > cap):
        return k
    return (*k[:p], cap, *k[p + 1 :])


def _leases(k: tuple[Any, ...], targets: int, owner: str) -> tuple[Any, ...]:
    """`k` (the per-target part of a store's key, then its headroom entry) with each
    probe lease's holder as "this turn" or "another" (`_holder`)."""
    out: list[Any] | None = None
    for p in range(LEASE_AT, PER_TARGET * targets, PER_TARGET):
        x = k[p]
        if x is not None:
            if out is None:
                out = list(k)
            out[p] = _holder(x, owner)
    return k if out is None else tuple(out)


def class_slots(
    policy: Policy,
) -> list[tuple[list[TargetKey], list[tuple[TargetKey, str]]]]:
    """Per target j: the target keys and (target key, credential) pairs of the targets up
    to j (what `health_class` keys when the second ready target is j)."""
    out = []
    for j in range(len(policy.targets)):
        head = policy.targets[: j + 1]
        out.append(
            (
                list(dict.fromkeys(t.key for t in head)),
                list(dict.fromkeys((t.key, cr.health_id) for t in head for cr in t.pool())),
            )
        )
    return out


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
        return (o.turn, "end", end_class(c, s.health, now))
    a = s.action
    reduce = c.reduce
    if reduce and is_leaf(c, o):  # never expanded: its transitions in are checked already
        return (o.turn, "leaf", state, action_key(a))
    cur = s.visit.index
    lo = cur if cur > 0 else 0
    if s.context_floor is not None:  # a move back to an unknown-length target is possible
        lo = min(lo, s.context_from + 1)
    ak = action_key(a)
    long = c.long
    elapsed = now - s.started
    cooling = cooling_rest(c, s, now, lo) if c.abstract_time and reduce else 0.0
    timed = not far(c, o, lo, elapsed, cooling)
    time_k = time_key(c, o, lo, elapsed, cooling) if timed else None
    oc = o.cur
    exact = not reduce or s.context_floor is not None or o.floor is not None
    since = min(cur, oc)
    mine = (
        o.turn,
        o.tried if exact else behind(c, o.tried, since),
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
        o.expect if exact or oc < 0 else None,
        o.cover,
        o.silent if exact or o.silent < 0 or o.silent == oc else OTHER_SILENT,
    )
    hk = health_key(c, s.health, now, lo)
    n = c.hk_sizes[lo]
    rest = _leases(hk[n:], len(c.hk_targets[lo]), s.owner)
    if reduce and cur >= 0:
        rest = _budget(c, rest, lo, cur, s.visit.attempts)
    hk = (*hk[:n], *rest)
    sk = s.key(now, long, timed and not reduce)
    if not exact:
        sk = (*sk[:3], behind(c, s.tried, since), *sk[4:])
    return (ak, time_k, sk, mine, hk)


def behind(c: Checker, tried: Iterable[int], cur: int) -> tuple[int, ...]:
    """The targets a turn tried, as far as the rest of the turn can read them: those
    from `cur` on, and earlier ones with an identical target ahead (a target identical
    to a tried one is skipped). Without a context floor a turn never moves back up the
    chain, so the others are read only by the failure's reason texts, which are not part
    of a configuration (see docs/design.md, "the chain behind")."""
    keep = c.keep_behind[cur] if cur >= 0 else None
    return tuple(j for j in tried if j >= cur or (keep is not None and j in keep))


def keep_behind(policy: Policy) -> list[frozenset[int]]:
    """Per position `cur`: the targets before it identical to one after it."""
    targets = policy.targets
    n = len(targets)
    return [
        frozenset(
            j for j in range(cur) if any(targets[k].same_as(targets[j]) for k in range(cur + 1, n))
        )
        for cur in range(n)
    ]


def is_leaf(c: Checker, o: Obs) -> bool:
    """A running configuration of a later turn that is checked no further: a next turn is
    followed only `follow_events` events from its start."""
    return o.turn > 1 and o.events >= c.follow_events


def action_key(a: object) -> tuple[Any, ...]:
    """What the configuration waits for, as a key."""
    cls = type(a)
    if cls is Attempt:
        return ("A", a.target.index, a.credential.id)  # type: ignore[attr-defined]
    if cls is Wait:
        return ("W", a.seconds)  # type: ignore[attr-defined]
    if cls is Rebuild:
        return ("R",)
    return (cls.__name__,)


def _holder(x: Any, owner: str) -> Any:
    """A probe lease in a health key, its holder as "this turn" or "another" (holder ids
    are unique per turn: two runs of one search number them differently)."""
    if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], str):
        return (x[0], "mine" if x[1] == owner else "other")
    return x
