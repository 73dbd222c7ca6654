"""The checker's oracle: its own record of a turn and its own reading of the rules.

Deliberately independent of the engine: nothing here calls the guards or helpers
of `fsm.core.turn` or reads the turn's counters. It is a second, simpler implementation
of the same rules (which targets are eligible, when a target is ready, which
outcomes fall back, what a turn has tried, banned and been told to wait for),
written from the rules rather than from the engine, so that a bug in the engine's
guards is not mirrored here and then agreed with. The properties compare what the
engine did against this record; besides the policy, the only thing both read is the
health store (through its public getters).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from ..core.actions import Action, Attempt, Rebuild, Wait
from ..core.machine import DENIED, REBUILD_FAILED, START
from ..core.state import MIN_ATTEMPT
from ..health.records import NUMBER
from ..health.store import HealthStore
from ..kinds import Outcome, OutcomeKind
from .context import Context
from .pacing import said_empty_until

# enum members as plain names: a member lookup on the class costs more than the check
_CANCELLED: Final = OutcomeKind.CANCELLED
_TRANSPORT: Final = OutcomeKind.TRANSPORT
_SUCCESS: Final = OutcomeKind.SUCCESS
_RATE_LIMITED: Final = OutcomeKind.RATE_LIMITED
_OVERLOADED: Final = OutcomeKind.OVERLOADED
_CONTEXT_TOO_LONG: Final = OutcomeKind.CONTEXT_TOO_LONG
_STREAM_INTERRUPTED: Final = OutcomeKind.STREAM_INTERRUPTED


class Obs:
    """What the checker has seen of one turn.

    Never changed once `observe` returns it: a configuration's record is shared by
    all its successors, and each transition makes a new one (the containers are
    immutable, so a copy is cheap).
    """

    __slots__ = (
        "attempts",
        "backed",
        "banned",
        "committed",
        "cover",
        "cred",
        "cur",
        "events",
        "expect",
        "floor",
        "floor_from",
        "last",
        "nb",
        "nwait",
        "opened",
        "rot",
        "silent",
        "since_wait",
        "started",
        "tnb",
        "total",
        "tried",
        "turn",
        "waited",
        "waits",
    )

    def __init__(self, n: int, turn: int) -> None:
        self.turn = turn  # which turn on this health store (1 = the first)
        self.events = 0  # events fed in this turn
        self.tried: tuple[int, ...] = ()  # targets attempted, in order
        # per target: waits, their seconds, and those while a fallback was eligible (what
        # the time abstraction assumes of them: `timing.note_wait`)
        self.nwait = (0,) * n
        self.waited = (0.0,) * n
        self.backed = (0.0,) * n
        self.opened = (0,) * n  # its breaker's openings when the turn first called it
        self.cur = -1  # the target of the last attempt (-1: none yet)
        self.cred: str | None = None  # the credential of the last attempt
        self.attempts = (0,) * n  # attempts per target
        self.rot = (0,) * n  # credential rotations per target
        self.total = 0  # attempts in the turn
        self.waits = 0.0  # seconds waited in the turn
        self.banned: frozenset[tuple[int, str]] = frozenset()  # (target, credential) not retryable
        self.nb: Mapping[tuple[int, str], float] = {}  # not-before per (target, credential)
        self.tnb: Mapping[int, float] = {}  # not-before per target
        self.floor: int | None = None  # a context length known to be too short
        self.floor_from = -1  # the target whose overflow first made that known
        self.committed: str | None = None  # output a stream already delivered
        self.last: Outcome | None = None  # the outcome of the attempt in flight
        self.since_wait = False  # a wait came after that outcome
        self.expect = -1  # the target a turn-start wait is for
        self.started = 0.0  # when the turn started (the clock at `start`)
        # fallbacks that were eligible, with one whole attempt's time left, when the turn
        # chose to stay on its current target (cleared when it leaves it)
        self.cover: tuple[int, ...] = ()
        self.silent = -1  # the target that did not answer an attempt (-1: none yet)

    def copy(self) -> Obs:
        o = Obs.__new__(Obs)
        o.turn = self.turn
        o.events = self.events
        o.tried = self.tried
        o.nwait = self.nwait
        o.waited = self.waited
        o.backed = self.backed
        o.opened = self.opened
        o.cur = self.cur
        o.cred = self.cred
        o.attempts = self.attempts
        o.rot = self.rot
        o.total = self.total
        o.waits = self.waits
        o.banned = self.banned
        o.nb = self.nb
        o.tnb = self.tnb
        o.floor = self.floor
        o.floor_from = self.floor_from
        o.committed = self.committed
        o.last = self.last
        o.since_wait = self.since_wait
        o.expect = self.expect
        o.started = self.started
        o.cover = self.cover
        o.silent = self.silent
        return o

    def counted(self) -> Obs:
        """This record with one more event and nothing learnt from it (a transition the
        declaration does not have)."""
        o = self.copy()
        o.events += 1
        return o


def observe(
    ctx: Context,
    before: Obs,
    trigger: str,
    kind: OutcomeKind | None,
    outcome: Outcome | None,
    action: Action,
    health: HealthStore,
    now: float,
    ti: int,
    late: bool = False,
    silent: bool = False,
) -> tuple[Obs, Obs]:
    """What one transition tells the checker: `known`, everything the engine had been
    told when it chose `action` (the outcome's bans, Retry-After times, context floor,
    committed output; the wait it asked for), and `after`, that plus the attempt it
    started (when it started one). `known` is `after` when the action is no attempt.

    Straight-line on purpose: this runs once per transition of the search."""
    o = before.copy()
    o.events += 1
    if trigger == DENIED:  # the store refused the attempt: it was not made with that key
        o.cred = None
    cur, cred = o.cur, o.cred
    if trigger == START:
        o.started = now
    elif late:  # the host overran a wait or a rebuild: no stay's worst case holds
        o.cover = ()
    if silent and o.silent < 0:
        o.silent = cur
    if outcome is not None and kind is not None and kind is not _CANCELLED:
        o.last = outcome
        o.since_wait = False
        if cur >= 0 and cred is not None and kind is not _SUCCESS:
            # what a failed attempt's outcome tells about its target and credential
            policy = ctx.policy
            ra = outcome.retry_after
            if not policy.rule(kind).retry:
                o.banned = o.banned | {(cur, cred)}
            if kind is _RATE_LIMITED and ra is not None:
                k = (cur, cred)
                o.nb = {**o.nb, k: max(o.nb.get(k, 0.0), now + ra)}
            elif kind is _OVERLOADED and ra is not None:
                o.tnb = {**o.tnb, cur: max(o.tnb.get(cur, 0.0), now + ra)}
            elif kind is _CONTEXT_TOO_LONG:
                known = policy.targets[cur].context_length
                if known is not None:
                    if o.floor is None:
                        o.floor_from = cur
                    o.floor = max(o.floor or 0, known)
            elif kind is _STREAM_INTERRUPTED:
                o.committed = outcome.partial or ""
    if isinstance(action, Wait):
        w = action.seconds
        if math.isfinite(w) and w >= 0:
            o.waits += w
            if trigger != START and cur >= 0:
                counts = list(o.nwait)
                counts[cur] += 1
                o.nwait = tuple(counts)
                secs = list(o.waited)
                secs[cur] += w
                o.waited = tuple(secs)
                if eligible(ctx, o, health, now, cur):
                    secs = list(o.backed)
                    secs[cur] += w
                    o.backed = tuple(secs)
        o.since_wait = True
        if trigger == START and ti >= 0 and first_ready(ctx, health, now) < 0:
            o.expect = ti
    if (
        cur >= 0
        and o.committed is None
        and (kind is not None and kind is not _SUCCESS and kind is not _CANCELLED)
        and stays(action, cur)
    ):
        o.cover = stay_cover(ctx, o, health, now, cur)
    if not isinstance(action, Attempt):
        return o, o
    a = o.copy()
    j = action.target.index
    if j != cur:
        a.cover = ()
    c = action.credential.id
    if j == cur and cred is not None and c != cred and not o.since_wait:
        counts = list(a.rot)
        counts[j] += 1
        a.rot = tuple(counts)
    counts = list(a.attempts)
    counts[j] += 1
    a.attempts = tuple(counts)
    a.total += 1
    if j not in a.tried:
        a.tried = (*a.tried, j)
        opens = health.record(ctx.keys[j]).get("opens", 0)
        counts = list(a.opened)
        counts[j] = int(opens) if isinstance(opens, NUMBER) else 1 << 20
        a.opened = tuple(counts)
    a.cur = j
    a.cred = c
    a.since_wait = False
    a.last = None
    return o, a


def stays(action: Action, cur: int) -> bool:
    """Whether the turn's answer to an outcome on target `cur` keeps it there: a wait
    (a backoff, a Retry-After), a rebuild, or another attempt on it (a rotation)."""
    if isinstance(action, Attempt):
        return action.target.index == cur
    return isinstance(action, Wait | Rebuild)


def stay_cover(ctx: Context, o: Obs, h: HealthStore, now: float, cur: int) -> tuple[int, ...]:
    """The cover of a stay on `cur`: what it had, plus every fallback eligible now with
    time left for one whole attempt on it (`Policy.attempt_bound`)."""
    left = ctx.policy.deadline - (now - o.started)
    targets = ctx.policy.targets
    fresh = [
        j for j in eligible(ctx, o, h, now, cur) if ctx.policy.attempt_bound(targets[j]) <= left
    ]
    return tuple(sorted({*o.cover, *fresh}))


def ready_at(ctx: Context, h: HealthStore, j: int, now: float) -> float:
    """When target `j` can next be called: its own cooldown, or its soonest free key (with
    pacing, a key its provider said has no requests left is not free until the reset it
    named: `pacing.said_empty_until`)."""
    key = ctx.keys[j]
    pool = ctx.pools[j]
    paced = ctx.policy.pacing and h.room
    soonest = math.inf
    for c in pool:
        u = h.credential_until(key, c.health_id)
        if paced:
            u = max(u, said_empty_until(h.headroom(key, c.health_id), now))
        if u < soonest:
            soonest = u
    return max(h.target_until(key), soonest)


def first_ready(ctx: Context, h: HealthStore, now: float) -> int:
    """The first target in chain order not cooling at `now` (-1: all are)."""
    for j in range(ctx.n):
        if ready_at(ctx, h, j, now) <= now:
            return j
    return -1


def eligible(
    ctx: Context, o: Obs, h: HealthStore, now: float, cur: int, timed: bool = True
) -> list[int]:
    """Fallbacks that could be entered now, best first: untried (nor an identical
    entry), not cooling, and not known to be too short for a context that overflowed.
    Later targets in chain order; after an overflow, those of unknown context_length
    last: in chain order from the target that overflowed first, and (from a target of
    known length) including ones earlier in the chain than the current target. None
    once the deadline has passed (no time left for an attempt: `MIN_ATTEMPT`), unless
    `timed` is False (eligible for any reason but time)."""
    if timed and now - o.started + MIN_ATTEMPT > ctx.policy.deadline:
        return []
    targets = ctx.policy.targets
    tried = o.tried
    floor = o.floor
    ahead: list[int] = []
    unknown: list[int] = []
    if floor is not None and cur >= 0 and targets[cur].context_length is not None:
        unknown_from = o.floor_from + 1
    else:
        unknown_from = cur + 1
    # without a floor only targets after `cur` can be entered; readiness is asked last
    # (the costliest test: this runs on most transitions)
    for j in range(0 if floor is not None else cur + 1, ctx.n):
        if j in tried or not ctx.twins[j].isdisjoint(tried):
            continue
        length = targets[j].context_length
        if floor is not None and length is None:
            into = unknown if j >= unknown_from else None
        elif j > cur and (floor is None or (length is not None and length > floor)):
            into = ahead
        else:
            into = None
        if into is not None and ready_at(ctx, h, j, now) <= now:
            into.append(j)
    if timed and cur >= 0 and targets[cur].group is not None:
        keep = _members_in_time(ctx, o, now, cur, ahead + unknown)
        ahead, unknown = [k for k in ahead if k in keep], [k for k in unknown if k in keep]
    return ahead + unknown


def _members_in_time(ctx: Context, o: Obs, now: float, cur: int, found: list[int]) -> set[int]:
    """`found` without the later members of `cur`'s group whose attempt (its whole bound)
    would leave the first eligible target after the group (in chain order) less than its
    reserve: moving on within one entry spends the next entry's time, as a stay does."""
    p = ctx.policy
    targets = p.targets
    entry = targets[cur].entry
    after = sorted(k for k in found if k > cur and targets[k].entry != entry)
    if p.reserve is False or not after:
        return set(found)
    left = p.deadline - (now - o.started)
    need = p.reserve_for(targets[after[0]])
    return {
        k for k in found if targets[k].entry != entry or left - p.attempt_bound(targets[k]) >= need
    }


def went_back_allowed(ctx: Context, o: Obs, cur: int, j: int) -> bool:
    """Whether a move from target `cur` back up the chain to `j` is the one allowed:
    after an overflow, from a target of known context_length to one of unknown length
    after the target whose overflow set the floor."""
    targets = ctx.policy.targets
    return (
        o.floor is not None
        and targets[cur].context_length is not None
        and targets[j].context_length is None
        and j > o.floor_from
    )


def falls_back(ctx: Context, trigger: str, kind: OutcomeKind | None) -> bool:
    """Whether the policy falls back on this event (a failed rebuild is a transport
    fault)."""
    p = ctx.policy
    if trigger == REBUILD_FAILED:
        return p.rule(_TRANSPORT).fall_back
    if trigger == DENIED:  # the store refused the attempt: always moves on
        return True
    if kind is None or kind is _SUCCESS or kind is _CANCELLED:
        return False
    return p.rule(kind).fall_back
