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

These functions read the engine's private slots (`TurnState.__slots__`, the health
store's dictionaries); they are kept together here so that they can be replaced by
the engine's own key and copy methods in one place.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ..actions import Attempt, Rebuild, Wait
from ..backoff import cooldown_for
from ..health import HealthStore
from ..machine import TERMINALS
from ..policy import Policy
from ..testing import FakeClock
from ..turn import TurnState
from .context import Bounds, TargetKey

if TYPE_CHECKING:
    from .oracle import Obs
    from .search import Checker, Live

EPS: Final = 1e-6

_STATE_SLOTS: Final = tuple(TurnState.__slots__)
#: The slots a turn must start afresh (the others are shared with the turn's host).
PER_TURN_SLOTS: Final = tuple(
    n for n in _STATE_SLOTS if n not in ("clock", "health", "hook", "policy", "random", "decl")
)
_Copier = Callable[[TurnState, HealthStore, FakeClock], TurnState]
_COPIER: list[_Copier] = []


# -- copies -----------------------------------------------------------------------------------


def copy_health(h: HealthStore) -> HealthStore:
    """A copy of a health store (its class may be a deliberately broken subclass)."""
    if type(h) is HealthStore:
        new = object.__new__(HealthStore)
        new._lock = threading.Lock()
        new._target_until = h._target_until.copy()
        new._cred_until = h._cred_until.copy()
        new._streak = h._streak.copy()
        new._rr = h._rr.copy()
        return new
    new = object.__new__(type(h))
    for klass in type(h).__mro__:
        for name in getattr(klass, "__slots__", ()):
            if name == "_lock":
                value: Any = threading.Lock()
            else:
                try:
                    value = getattr(h, name)
                except AttributeError:
                    continue
                if isinstance(value, dict | set | list):
                    value = value.copy()
            object.__setattr__(new, name, value)
    if hasattr(h, "__dict__"):
        for name, value in vars(h).items():
            object.__setattr__(
                new, name, value.copy() if isinstance(value, dict | set | list) else value
            )
    return new


def copy_state(s: TurnState, health: HealthStore, clock: FakeClock) -> TurnState:
    """A copy of a turn's state on its own health store and clock (the trace starts empty:
    the checker reads each transition's record as it is made)."""
    if not _COPIER:
        _COPIER.append(make_copier(s))
    return _COPIER[0](s, health, clock)


def make_copier(sample: TurnState) -> _Copier:
    """Generate a straight-line copier for TurnState's slots (much faster than a loop)."""
    lines = ["def copy(s, health, clock):", "    n = new(TurnState)"]
    for name in _STATE_SLOTS:
        if name == "health":
            lines.append("    n.health = health")
        elif name == "clock":
            lines.append("    n.clock = clock")
        elif name in ("trace", "_raw", "_events"):
            lines.append(f"    n.{name} = []")
        elif isinstance(getattr(sample, name, None), dict | set | list):
            lines.append(f"    n.{name} = s.{name}.copy()")
        else:
            lines.append(f"    n.{name} = s.{name}")
    lines.append("    return n")
    ns: dict[str, Any] = {"new": object.__new__, "TurnState": TurnState}
    exec("\n".join(lines), ns)
    fn: _Copier = ns["copy"]
    return fn


# -- the time abstraction ---------------------------------------------------------------------


def rel(v: float, now: float, long: float = math.inf) -> float:
    """Seconds left of a not-before time (0 when over, inf when beyond the horizon)."""
    if v <= now:
        return 0.0
    left = v - now
    return round(left, 6) if left <= long else math.inf


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
    spans = [b.large, p.cooldown.cap] + ([b.small] if b.small is not None else [])
    step_max = max([p.backoff.cap, *[x for x in spans if x <= cap]])
    cools = [cooldown_for(p.cooldown, n) for n in range(1, sat + 1)]
    start_max = max([step_max, *[x for x in cools if x <= cap]])
    return start_max, step_max


def far(c: Checker, o: Obs, lo: int, elapsed: float) -> bool:
    """True when the deadline can no longer bind in this turn, whatever happens: a
    correct engine waits at most max_attempts-1 times per target (every retry needs
    attempts < max_attempts; rotations and fallbacks do not wait), each wait at most
    `step_max`, plus one wait at turn start."""
    if not c.abstract_time:
        return False
    most = c.rest_time[lo] + (c.start_max if o.cur < 0 else 0.0)
    return elapsed + most <= c.policy.deadline - EPS


# -- keys -------------------------------------------------------------------------------------


def health_slots(
    policy: Policy,
) -> tuple[list[list[TargetKey]], list[list[tuple[TargetKey, str]]]]:
    """Per position in the chain: the target keys and (target key, credential) pairs at
    or after it (the health facts a turn there can still read)."""
    keys = [t.key for t in policy.targets]
    creds = list(dict.fromkeys((t.key, c.id) for t in policy.targets for c in t.pool()))
    hk_targets: list[list[TargetKey]] = []
    hk_creds: list[list[tuple[TargetKey, str]]] = []
    for lo in range(len(keys)):
        ahead = list(dict.fromkeys(keys[lo:]))
        hk_targets.append(ahead)
        hk_creds.append([ck for ck in creds if ck[0] in ahead])
    return hk_targets, hk_creds


def health_key(c: Checker, h: HealthStore, now: float, lo: int) -> tuple[Any, ...]:
    """The health facts a running turn at chain position `lo` can still depend on."""
    tu = h._target_until
    cu = h._cred_until
    long = c.long
    out: list[Any] = []
    for k in c.hk_targets[lo]:
        v = tu.get(k, 0.0)
        out.append(rel(v, now, long))
    for ck in c.hk_creds[lo]:
        v = cu.get(ck, 0.0)
        out.append(rel(v, now, long))
    sat = c.sat
    streak = h._streak
    rr = h._rr
    for k in c.hk_targets[lo]:
        out.append(min(streak.get(k, 0), sat))
        n = rr.get(k)
        out.append(None if n is None else n % c.sizes[k])
    return tuple(out)


def health_class(c: Checker, h: HealthStore, now: float) -> tuple[Any, ...]:
    """What a next turn can depend on, coarsely: which cooldowns run (and whether they
    outlast the search), failure streaks, round-robin positions. Turn ends in one class
    continue from one representative health store."""
    tu = h._target_until
    cu = h._cred_until
    long = c.long
    out: list[Any] = []
    for k in c.hk_targets[0]:
        v = tu.get(k, 0.0)
        out.append(0 if v <= now else (2 if v - now > long else 1))
    for ck in c.hk_creds[0]:
        v = cu.get(ck, 0.0)
        out.append(0 if v <= now else (2 if v - now > long else 1))
    for k in c.hk_targets[0]:
        out.append(min(h._streak.get(k, 0), c.sat))
        n = h._rr.get(k)
        out.append(None if n is None else n % c.sizes[k])
    return tuple(out)


def key(c: Checker, live: Live) -> tuple[Any, ...]:
    """The configuration's identity: (action, time, the turn's state, the checker's
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
    cur = s.ti
    lo = cur if cur > 0 else 0
    a = s.action
    cls = type(a)
    if cls is Attempt:
        ak: tuple[Any, ...] = ("A", a.target.index, a.credential.id)  # type: ignore[union-attr]
        out = None  # overwritten by the next outcome before anything reads it
    else:
        if cls is Wait:
            ak = ("W", a.seconds)  # type: ignore[union-attr]
        elif cls is Rebuild:
            ak = ("R",)
        else:
            ak = (cls.__name__,)
        so = s.outcome
        out = (so.kind, so.retry_after) if so is not None else None
    long = c.long
    elapsed = now - s.started
    time_k = None if far(c, o, lo, elapsed) else (round(elapsed, 6), round(o.waits, 6))
    oc = o.cur
    core = (
        state,
        cur,
        s.cred.id if s.cred is not None else None,
        s.attempts,
        s.streak,
        s.recovered,
        s.rotations,
        s.rr,
        tuple(sorted(s.spent)) if s.spent else (),
        tuple(
            sorted(
                (k[1], rel(v, now, long)) for k, v in s.cred_nb.items() if k[0] == cur and v > now
            )
        ),
        rel(s.target_nb, now, long),
        tuple(s.tried),
        s.ctx_floor,
        out,
        s.partial,
    )
    mine = (
        o.turn,
        o.tried,
        oc,
        o.cred,
        o.attempts[oc] if oc >= 0 else 0,
        o.rot[oc] if oc >= 0 else 0,
        tuple(sorted(cid for j, cid in o.banned if j == oc)) if o.banned else (),
        tuple(
            sorted((k[1], rel(v, now, long)) for k, v in o.nb.items() if k[0] == oc and v > now)
        ),
        rel(o.tnb.get(oc, 0.0), now, long),
        o.floor,
        o.committed,
        (o.last.kind, o.last.retry_after) if o.last is not None else None,
        o.since_wait,
        o.expect,
    )
    hk = health_key(c, s.health, now, lo)
    return (ak, time_k, core, mine, hk)
