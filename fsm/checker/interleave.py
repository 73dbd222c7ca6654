"""Concurrent turns on one shared health store, every interleaving.

`check_fleet(policy, turns=2)` runs `turns` real turns (`fsm.Turn`, the executor users
run) side by side on one health store and one virtual clock, and explores breadth-first
every order in which their steps can interleave: a turn starts; asks the store's grant
for an attempt that needs one (the half-open probe lease, a retry token) and is refused
or sends it; the attempt comes back with one outcome of a small alphabet; a wait ends
(the clock moves to its end); a client is rebuilt. Every transition is checked:

* ``one_probe_in_flight``: at most one half-open probe per target is out at a time;
* ``retry_budget``: no retry goes out without a token, counted by the checker's own
  ledger (a bucket per target: a token per granted retry, a refill per success);
* ``probe_within_bound``: an open breaker's target is free to be probed within its
  bound (the longest open span: the breaker's own, at most ``breaker.max_open``, or a
  Retry-After of the alphabet, at most ``cooldown.cap``; plus one lease); and once every
  turn has ended, a fresh turn started when the bound has passed calls the primary
  again: no target is lost for good, across turns. One starting store has the primary
  half-open after a long outage (many openings in a row), so a failed probe there
  reopens it for the longest span its schedule gives;
* ``declared``, ``no_ping_pong``, ``termination``, ``honest_waits``: each turn's steps
  are declared transitions, it never returns to a target it left, its attempts stay
  within the policy's bounds, and the store lets no probe or retry out while the
  target's breaker is open (a first attempt decided a moment before another turn's
  report opened it may still go out: the race of one step; the single-turn checks,
  `check_policy`, judge the rest of each turn).

Breadth-first, so a broken property comes with a shortest interleaving that breaks it,
as ``(turn, step)`` pairs that `replay_fleet` feeds to fresh turns.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

from ..clock import VirtualClock
from ..core.actions import Action, Attempt, Fail, Finish, Rebuild, Wait
from ..core.machine import START, declare
from ..core.turn import Turn
from ..health import records as fleet
from ..health.store import HealthStore
from ..kinds import Outcome, OutcomeKind
from ..policy.backoff import breaker_span
from ..policy.model import Policy
from .context import Bounds, with_canaries
from .interleave_report import FLEET_PROPERTIES, FleetReport, Move
from .steps import START_TIME, worst_jitter

__all__ = ["FLEET_PROPERTIES", "OUTCOMES", "FleetReport", "FleetRun", "check_fleet", "replay_fleet"]

GRANT: Final = "grant"  # the host asks the store for the attempt's grant

_OUTCOMES: Final = {
    "success": Outcome(OutcomeKind.SUCCESS, status=200, value="answer"),
    "overloaded": Outcome(OutcomeKind.OVERLOADED, status=503, detail="overloaded"),
    "transport": Outcome(OutcomeKind.TRANSPORT, detail="connection reset"),
    # the same, while the target answered other attempts: no token, no breaker count
    "transport_client_side": Outcome(
        OutcomeKind.TRANSPORT, detail="connection reset", client_side=True
    ),
    "overloaded_retry_after": Outcome(
        OutcomeKind.OVERLOADED, status=503, retry_after=5.0, detail="overloaded"
    ),
    "rate_limited": Outcome(OutcomeKind.RATE_LIMITED, status=429, retry_after=1.0, detail="429"),
    "not_found": Outcome(OutcomeKind.NOT_FOUND, status=404, detail="no such model"),
}
#: Every outcome `check_fleet` and the fuzzers can feed.
OUTCOMES: Final = tuple(_OUTCOMES)


class _Config:
    """One global configuration: the turns (None: not started), their pending phase, the
    shared store and clock, the checker's own budget ledger."""

    __slots__ = ("clock", "health", "inflight", "ledger", "probing", "turns", "wait_end")

    def __init__(
        self,
        health: HealthStore,
        clock: VirtualClock,
        turns: list[Turn | None],
        inflight: list[bool],
        wait_end: list[float],
        ledger: dict[Any, float],
    ) -> None:
        self.health = health
        self.clock = clock
        self.turns = turns
        self.inflight = inflight  # the pending attempt was granted and is out
        self.probing = [False] * len(turns)  # ... as the probe of a half-open breaker
        self.wait_end = wait_end
        self.ledger = ledger


def _clone(c: _Config) -> _Config:
    health = c.health.copy()
    clock = VirtualClock(c.clock.t)
    turns: list[Turn | None] = []
    for t in c.turns:
        if t is None:
            turns.append(None)
            continue
        n = object.__new__(Turn)
        n._table = t._table
        n.s = t.s.copy(health, clock)
        turns.append(n)
    out = _Config(health, clock, turns, list(c.inflight), list(c.wait_end), dict(c.ledger))
    out.probing = list(c.probing)
    return out


class _Fleet:
    def __init__(
        self,
        policy: Policy,
        turns: int,
        health_factory: Callable[[], HealthStore],
        outcomes: Sequence[str],
        max_states: int,
    ) -> None:
        self.policy = p = with_canaries(policy)
        self.n = turns
        self.health_factory = health_factory
        self.outcomes = tuple(outcomes)
        self.max_states = max_states
        self.decl = declare(p)
        self.declared = frozenset((t.source, t.trigger, t.dest) for t in self.decl.edges())
        self.bounds = Bounds.of(p)
        self.keys = tuple(dict.fromkeys(t.key for t in p.targets))
        self.creds = tuple(dict.fromkeys((t.key, c.health_id) for t in p.targets for c in t.pool()))
        self.bound = probe_bound(p, self.outcomes)
        # elapsed time is keyed only when the deadline can bind: when it is shorter than
        # the most a turn can wait (a wait per retry and one at turn start, each capped)
        longest = max(p.backoff.cap, p.retry_after_cap)
        self.timed = p.deadline < (self.bounds.attempts + 1) * longest
        self.violations: dict[str, tuple[str, int, Move | None]] = {}
        self.ids: dict[Any, int] = {}
        self.parent: list[int] = []
        self.via: list[Move | None] = []
        self.setup_of: list[str] = []
        self.transitions = 0
        self.complete = True

    # -- setups -------------------------------------------------------------------------------
    def setups(self) -> list[tuple[str, HealthStore]]:
        p = self.policy
        now = START_TIME
        primary = p.targets[0].key
        out: list[tuple[str, HealthStore]] = [("all closed", self.health_factory())]
        h = self.health_factory()
        h.open_target(primary, now, now - 1)  # its open span has just ended: half-open
        out.append(("primary half-open", h))
        h = self.health_factory()
        h.open_target(primary, now, now - 1)
        h._apply(primary, _reopened(LONG_OUTAGE), now)
        out.append(("primary half-open after a long outage", h))
        h = self.health_factory()
        h.open_target(primary, now + 1.0, now)
        out.append(("primary open 1 s", h))
        if p.retry_budget.enabled:
            h = self.health_factory()
            spend = int(p.retry_budget.size) - 1
            for _ in range(spend):
                h._apply(primary, _spend_one(p), now)
            out.append(("primary budget 1 token", h))
        return out

    # -- identity -----------------------------------------------------------------------------
    def key(self, c: _Config) -> tuple[Any, ...]:
        """The configuration's identity. Turns are interchangeable: their parts are sorted,
        and a lease holder is named by its turn's place in that order."""
        now = c.clock.t
        parts: list[tuple[Any, str]] = []
        for i, t in enumerate(c.turns):
            if t is None:
                parts.append(((0,), ""))
                continue
            s = t.s
            a = s.action
            ak: Any = None
            if isinstance(a, Attempt):
                ak = ("A", a.target.index, a.credential.id, a.probe, a.retry)
                ak += (c.inflight[i], c.probing[i])
            elif isinstance(a, Wait):
                ak = ("W", round(c.wait_end[i] - now, 6))
            elif a is not None:
                ak = (type(a).__name__,)
            parts.append(((1, ak, s.key(now, math.inf, self.timed)), s.owner))
        order = sorted(range(len(parts)), key=lambda i: repr(parts[i][0]))
        owners = {parts[i][1]: rank for rank, i in enumerate(order) if parts[i][1]}
        hk = c.health.key(now, self.keys, self.creds)
        hk = tuple(_owner_slot(x, owners) for x in hk)
        ledger = tuple(sorted((str(k), round(v, 6)) for k, v in c.ledger.items()))
        return (tuple(parts[i][0] for i in order), hk, ledger)

    # -- the search ---------------------------------------------------------------------------
    def run(self) -> FleetReport:
        t0 = time.perf_counter()
        queue: deque[tuple[int, _Config]] = deque()
        names: list[str] = []
        for name, health in self.setups():
            names.append(name)
            clock = VirtualClock(START_TIME)
            c = _Config(health, clock, [None] * self.n, [False] * self.n, [0.0] * self.n, {})
            for k in self.keys:
                c.ledger[k] = health.retry_tokens(k, self.policy)
            nid = self._add(c, -1, None, name)
            if nid is not None:
                queue.append((nid, c))
        while queue:
            nid, c = queue.popleft()
            for move in self.moves(c):
                child = _clone(c)
                self.transitions += 1
                if not self.step(nid, child, move):
                    continue
                cid = self._add(child, nid, move, self.setup_of[nid])
                if cid is not None:
                    queue.append((cid, child))
                    if len(self.parent) > self.max_states:
                        self.complete = False
                        queue.clear()
                        break
            else:
                if all(t is not None and t.done for t in c.turns):
                    self.after_all(nid, c)
        return FleetReport(
            self.n,
            tuple(names),
            len(self.parent),
            self.transitions,
            time.perf_counter() - t0,
            self.complete,
            {p: (why, self.path(nid, m)) for p, (why, nid, m) in self.violations.items()},
        )

    def _add(self, c: _Config, parent: int, via: Move | None, setup: str) -> int | None:
        k = (setup if parent < 0 else None, self.key(c))
        if k in self.ids:
            return None
        nid = len(self.parent)
        self.ids[k] = nid
        self.parent.append(parent)
        self.via.append(via)
        self.setup_of.append(setup)
        return nid

    def path(self, nid: int, extra: Move | None) -> tuple[tuple[str, Move], ...]:
        out: list[Move] = [extra] if extra is not None else []
        setup = self.setup_of[nid]
        while nid >= 0 and self.via[nid] is not None:
            out.append(self.via[nid])  # type: ignore[arg-type]
            nid = self.parent[nid]
        return tuple((setup, m) for m in reversed(out))

    def broken(self, prop: str, why: str, nid: int, move: Move | None) -> None:
        if prop not in self.violations:
            self.violations[prop] = (why, nid, move)

    def moves(self, c: _Config) -> list[Move]:
        out: list[Move] = []
        # time stands still while an attempt awaits its grant (a host asks the store the
        # moment its turn decides), and an attempt in flight is back by its timeout (the
        # drivers' hard bound): no wait ends before those have happened
        back_by = -math.inf if _awaiting_grant(c) else _back_by(c)
        for i, t in enumerate(c.turns):
            if t is None:
                out.append((i, START))
                continue
            a = t.s.action
            if t.done:
                continue
            if isinstance(a, Attempt):
                if c.inflight[i]:
                    out += [(i, o) for o in self.outcomes]
                else:
                    out.append((i, GRANT))
            elif isinstance(a, Wait):
                if c.wait_end[i] <= back_by + 1e-9:
                    out.append((i, "waited"))
            elif isinstance(a, Rebuild):
                out.append((i, "rebuilt"))
        return out

    # -- one step, judged ---------------------------------------------------------------------
    def step(self, nid: int, c: _Config, move: Move) -> bool:
        i, what = move
        h = c.health
        t = c.turns[i]
        try:
            if what == START:
                t = Turn(self.policy, health=h, clock=c.clock, random=worst_jitter)
                c.turns[i] = t
                action = t.start()
            elif what == GRANT:
                assert t is not None
                a = t.s.action
                assert isinstance(a, Attempt)
                half_open = h.half_open(a.target.key, c.clock.t)
                why = h.grant(t.s, a)
                if why is not None:
                    action = t.deny(why)
                else:
                    c.inflight[i] = True
                    c.probing[i] = half_open  # it goes out while the breaker is half-open
                    c.wait_end[i] = c.clock.t + a.timeout  # it is back by then, at the latest
                    now = c.clock.t
                    until = h.target_until(a.target.key)
                    if (a.probe or a.retry) and until > now + 1e-9:
                        self.broken(
                            "honest_waits",
                            f"turn {i + 1} was let {'probe' if a.probe else 'retry'} "
                            f"{a.target.name} while its breaker was open ({until - now:g} s left)",
                            nid,
                            move,
                        )
                    if a.retry and self.policy.retry_budget.enabled:
                        k = a.target.key
                        c.ledger[k] = c.ledger[k] - 1
                        if c.ledger[k] < -1e-9:
                            self.broken(
                                "retry_budget",
                                f"turn {i + 1} retried {a.target.name} with no token left in "
                                "its retry budget",
                                nid,
                                move,
                            )
                    self.check_probes(nid, c, move)
                    return True
            elif what == "waited":
                assert t is not None
                c.clock.t = max(c.clock.t, c.wait_end[i])
                action = t.waited()
            elif what == "rebuilt":
                assert t is not None
                action = t.rebuilt(True)
            else:
                assert t is not None
                c.inflight[i] = c.probing[i] = False
                a = t.s.action
                assert isinstance(a, Attempt)
                if what == "success":
                    rb = self.policy.retry_budget
                    k = a.target.key
                    c.ledger[k] = min(rb.size, c.ledger[k] + rb.refill)
                action = t.feed(_OUTCOMES[what])
        except Exception as e:  # a crash inside the engine is a finding
            self.broken(
                "termination", f"turn {i + 1}: the engine raised {type(e).__name__}: {e}", nid, move
            )
            return False
        assert t is not None
        if isinstance(action, Wait):
            c.wait_end[i] = c.clock.t + action.seconds
        self.check_turn(nid, c, move, i, t, action)
        self.check_probes(nid, c, move)
        return True

    def check_turn(self, nid: int, c: _Config, move: Move, i: int, t: Turn, action: Action) -> None:
        s = t.s
        for ev in s.trace[-1:]:
            if (ev.source, ev.event, ev.dest) not in self.declared:
                self.broken(
                    "declared",
                    f"turn {i + 1} took {ev.source} --{ev.event}--> {ev.dest}, not declared",
                    nid,
                    move,
                )
        if isinstance(action, Attempt):
            j = action.target.index
            tried = s.tried
            if any(k > j for k in tried):
                self.broken(
                    "no_ping_pong", f"turn {i + 1} went back to {action.target.name}", nid, move
                )
            if (
                s.total_attempts > self.bounds.attempts
                or s.visit.attempts > self.bounds.per_target[j]
            ):
                self.broken(
                    "termination",
                    f"turn {i + 1}: {s.total_attempts} attempts (bound {self.bounds.attempts})",
                    nid,
                    move,
                )
        if not isinstance(action, Finish | Fail) and s.seq > self.bounds.events:
            self.broken(
                "termination", f"turn {i + 1} still running after {s.seq} events", nid, move
            )

    def check_probes(self, nid: int, c: _Config, move: Move) -> None:
        out: dict[Any, int] = {}
        for i, t in enumerate(c.turns):
            if t is None or not c.probing[i]:
                continue
            a = t.s.action
            if isinstance(a, Attempt):
                k = a.target.key
                if k in out:
                    self.broken(
                        "one_probe_in_flight",
                        f"turns {out[k] + 1} and {i + 1} both probe {a.target.name}'s half-open "
                        "breaker at once",
                        nid,
                        move,
                    )
                out[k] = i
        now = c.clock.t
        for tg in self.policy.targets:
            r = c.health.record(tg.key)
            ready = max(c.health.target_until(tg.key), fleet.num(r, "lease"))
            if ready - now > self.bound + 1e-6:
                self.broken(
                    "probe_within_bound",
                    f"{tg.name} cannot be probed for {ready - now:g} s (bound {self.bound:g} s)",
                    nid,
                    move,
                )

    def after_all(self, nid: int, c: _Config) -> None:
        """Every turn ended: once the bound has passed, a fresh turn calls the primary."""
        later = _clone(c)
        later.clock.t += self.bound + 1.0
        t = Turn(self.policy, health=later.health, clock=later.clock, random=worst_jitter)
        try:
            a = t.start()
        except Exception as e:
            self.broken("termination", f"a later turn's start raised {type(e).__name__}", nid, None)
            return
        if not (isinstance(a, Attempt) and a.target.index == 0):
            where = a.target.name if isinstance(a, Attempt) else type(a).__name__
            self.broken(
                "probe_within_bound",
                f"after every turn ended and {self.bound + 1:g} s passed, a new turn went to "
                f"{where}, not the primary: the primary is lost",
                nid,
                None,
            )


def _owner_slot(x: Any, owners: dict[str, int]) -> Any:
    """A lease holder in the store's key as the slot of the turn holding it."""
    if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], str):
        return (x[0], owners.get(x[1], "gone"))
    return x


#: Openings in a row of the "long outage" starting store: past any schedule's growth
#: (the default reaches its cap at the 3rd), so a failed probe there reopens the breaker
#: for the longest span its schedule gives.
LONG_OUTAGE: Final = 60


def _reopened(opens: int) -> Callable[[dict[str, Any], float], dict[str, Any]]:
    return lambda r, now: {**r, "opens": opens}


def probe_bound(p: Policy, outcomes: Sequence[str]) -> float:
    """The longest a breaker can stay unprobeable with this alphabet: its longest open
    span (its own schedule's, at most ``breaker.max_open``; a Retry-After's, at most
    ``cooldown.cap``; the starting stores' second), then one probe lease."""
    own = breaker_span(p.cooldown, p.breaker, 1 << 30)  # the schedule's supremum
    told = [
        min(ra, p.cooldown.cap)
        for name in outcomes
        if (ra := _OUTCOMES[name].retry_after) is not None
    ]
    return max(own, 1.0, *told) + fleet.lease_for(p)


def _spend_one(p: Policy) -> Callable[[dict[str, Any], float], dict[str, Any] | None]:
    return lambda r, now: fleet.spend(r, p)


def check_fleet(
    policy: Policy,
    *,
    turns: int = 2,
    health_factory: Callable[[], HealthStore] = HealthStore,
    outcomes: Sequence[str] = ("success", "overloaded"),
    max_states: int = 300_000,
) -> FleetReport:
    """Explore every interleaving of `turns` concurrent turns of `policy` on one shared
    health store (built by `health_factory`: a deliberately broken one shows the checker
    failing), each attempt answered by one of `outcomes`; see the module docstring."""
    if not 1 <= turns <= 4:
        raise ValueError(f"turns must be 1..4, got {turns!r}")
    unknown = [o for o in outcomes if o not in _OUTCOMES]
    if unknown:
        raise ValueError(f"outcomes: unknown {unknown} (choose from {', '.join(_OUTCOMES)})")
    return _Fleet(policy, turns, health_factory, outcomes, max_states).run()


class FleetRun:
    """Concurrent turns on one store driven step by step by a caller (the property
    fuzzers), judged by the same checks as `check_fleet`: `moves()` lists what may happen
    next, `step(move)` does it, `advance(seconds)` lets time pass, `violations` is what
    broke so far."""

    def __init__(
        self,
        policy: Policy,
        turns: int,
        health: HealthStore,
        outcomes: Sequence[str] = OUTCOMES,
    ) -> None:
        self._f = _Fleet(policy, turns, lambda: health, outcomes, 1)
        self.config = c = _Config(
            health, VirtualClock(START_TIME), [None] * turns, [False] * turns, [0.0] * turns, {}
        )
        for k in self._f.keys:
            c.ledger[k] = health.retry_tokens(k, self._f.policy)
        self.steps = 0

    def moves(self) -> list[Move]:
        """What may happen next; a finished turn's slot starts a new turn."""
        c = self.config
        out = self._f.moves(c)
        out += [(i, START) for i, t in enumerate(c.turns) if t is not None and t.done]
        return out

    def step(self, move: Move) -> None:
        i, what = move
        c = self.config
        if what == START and c.turns[i] is not None:
            c.turns[i] = None  # the slot's last turn ended: its host starts another
        self._f.step(self.steps, c, move)
        self._f.check_probes(self.steps, c, move)
        self.steps += 1
        if all(t is not None and t.done for t in c.turns):
            self._f.after_all(self.steps, c)

    def advance(self, seconds: float) -> None:
        """Let up to `seconds` pass: no further than the end of an attempt in flight (its
        timeout bounds it; a longer one would have come back as a timeout), and none while
        an attempt awaits its grant (its host asks at once)."""
        c = self.config
        if not _awaiting_grant(c):
            c.clock.t = min(c.clock.t + seconds, _back_by(c))

    @property
    def violations(self) -> dict[str, str]:
        return {p: why for p, (why, _, _) in self._f.violations.items()}


def replay_fleet(
    policy: Policy,
    setup: str,
    moves: Sequence[Move],
    *,
    health_factory: Callable[[], HealthStore] = HealthStore,
    turns: int = 2,
) -> list[Turn | None]:
    """Replay a counterexample of `check_fleet`: the same setup, the same interleaving;
    returns the turns (their traces show what happened)."""
    f = _Fleet(policy, turns, health_factory, tuple(_OUTCOMES), 1)
    store = dict(f.setups())[setup]
    c = _Config(store, VirtualClock(START_TIME), [None] * turns, [False] * turns, [0.0] * turns, {})
    for k in f.keys:
        c.ledger[k] = store.retry_tokens(k, f.policy)
    for m in moves:
        f.step(0, c, (int(m[0]), str(m[1])))
    return c.turns


def _awaiting_grant(c: _Config) -> bool:
    """Has a turn decided an attempt that it has not yet asked the store to grant?"""
    return any(
        t is not None and not t.done and isinstance(t.s.action, Attempt) and not c.inflight[i]
        for i, t in enumerate(c.turns)
    )


def _back_by(c: _Config) -> float:
    """When the earliest attempt in flight is back at the latest (inf: none in flight)."""
    return min((c.wait_end[i] for i, out in enumerate(c.inflight) if out), default=math.inf)
