"""The thirteen properties, as pure functions over one transition.

The search fires an event, checks the transition is one the declaration has
(`declaration_equals_execution`), lets the oracle record what the turn learnt, and
hands the frozen `TransitionRecord` to every function in `CHECKS` (`ON_ATTEMPT` when
the action is an attempt). Each returns the first `Finding` of its property on that
transition, or None; the search keeps the first finding of each property it meets
(breadth-first, so with a shortest event sequence). Termination and the fallback gate
are also judged over the whole graph after the search (`graph`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Final

from ..core.actions import Action, Attempt, Fail, Finish, Rebuild, Wait
from ..core.machine import (
    DENIED,
    DONE,
    FAILED,
    REBUILD_FAILED,
    REBUILT,
    START,
    TERMINALS,
    WAITED,
)
from ..core.turn import ProtocolError, TurnState
from ..kinds import CREDENTIAL_KINDS, OutcomeKind
from ..trace import TraceEvent
from .configuration import PER_TURN_SLOTS
from .context import Context
from .oracle import Obs, eligible, falls_back, first_ready, went_back_allowed
from .pacing_properties import no_call_on_an_empty_key, reservations_released
from .timing import EPS
from .transition import Finding, TransitionRecord

#: The thirteen properties, in order (the names used in JSON output).
PROPERTIES: Final = (
    "fallback_gate",
    "termination",
    "no_ping_pong",
    "honest_waits",
    "non_retryable_not_retried",
    "bounded_rotation",
    "clean_turn_start",
    "committed_streams_not_replayed",
    "secrets_never_leak",
    "declaration_equals_execution",
    "clock_never_closes_gate",
    "no_call_on_an_empty_key",
    "reservations_released",
)

CRED_LEVEL: Final = CREDENTIAL_KINDS  #: a credential's fault (a rotation may follow them)

# enum members as plain names: a member lookup on the class costs more than the check
_SUCCESS: Final = OutcomeKind.SUCCESS
_CANCELLED: Final = OutcomeKind.CANCELLED
_RATE_LIMITED: Final = OutcomeKind.RATE_LIMITED

# -- 1. the fallback gate -------------------------------------------------------------------------


def fallback_gate(rec: TransitionRecord) -> Finding | None:
    """A fallback-triggering outcome may not end the turn, nor be slept on (a 429 unless
    the policy prefers waiting; a grant the store refused, with pacing one refused for
    headroom), while an eligible fallback exists; a fallback goes to
    the first eligible target, and only on an outcome whose rule says so. A failed turn
    gives a reason for every target."""
    ctx, action, known = rec.ctx, rec.action, rec.known
    names = ctx.names
    cur = known.cur
    if isinstance(action, Fail):
        if rec.dest != FAILED:
            return None
        err = action.error
        if not err.reasons.keys() >= ctx.name_set:
            missing = [t for t in names if t not in err.reasons]
            return Finding(
                "fallback_gate", f"the turn failed without a reason for {', '.join(missing)}"
            )
        if falls_back(ctx, rec.trigger, rec.kind) and known.committed is None and cur >= 0:
            el = eligible(ctx, known, rec.health, rec.now, cur)
            if el:
                return Finding(
                    "fallback_gate",
                    f"{rec.trigger} on {names[cur]} ended the turn `failed` although "
                    f"{names[el[0]]} was eligible",
                )
        return None
    if isinstance(action, Wait):
        if rec.trigger == DENIED and known.committed is None and cur >= 0:
            el = eligible(ctx, known, rec.health, rec.now, cur)
            if el:  # a refused grant moves on (with pacing: a key without headroom)
                return Finding(
                    "fallback_gate",
                    f"waited {action.seconds:g} s after the store refused {names[cur]} "
                    f"although {names[el[0]]} was eligible now",
                )
        policy = ctx.policy
        kind = rec.kind
        if (
            kind is _RATE_LIMITED
            and policy.rule(kind).fall_back
            and not policy.prefer_waiting
            and known.committed is None
            and cur >= 0
        ):
            el = eligible(ctx, known, rec.health, rec.now, cur)
            if el:
                return Finding(
                    "fallback_gate",
                    f"slept {action.seconds:g} s on a 429 from {names[cur]} although "
                    f"{names[el[0]]} was eligible now",
                )
        return None
    if isinstance(action, Attempt):
        j = action.target.index
        if cur >= 0 and j != cur and known.committed is None:  # a continuation: property 8
            name = names[j]
            if not falls_back(ctx, rec.trigger, rec.kind):
                return Finding(
                    "fallback_gate",
                    f"fell back to {name} on {rec.trigger}, which the policy does not fall back on",
                )
            el = eligible(ctx, known, rec.health, rec.now, cur)
            if not el or el[0] != j:
                first = names[el[0]] if el else "none"
                return Finding(
                    "fallback_gate", f"fell back to {name}; the first eligible fallback was {first}"
                )
    return None


# -- 11. the clock never closes the gate ----------------------------------------------------------


def clock_never_closes_gate(rec: TransitionRecord) -> Finding | None:
    """Time belongs to the chain: a turn that chose to stay on a target (a retry, a wait,
    a rebuild, a rotation) while a fallback was eligible with time left for one whole
    attempt on it does not end failed on a fallback outcome (or a host's on-time
    reply) without having asked that fallback. Attempts take time in the model (a
    silent one its whole bound), so a stay that spends the fallback's time shows."""
    if not isinstance(rec.action, Fail) or rec.dest != FAILED:
        return None
    known = rec.known
    if not known.cover or known.committed is not None:
        return None
    trigger = rec.trigger
    if not (falls_back(rec.ctx, trigger, rec.kind) or trigger in (WAITED, REBUILT)):
        return None
    # ... and still eligible but for the time (an overflow may have ruled one out since)
    untimed = eligible(rec.ctx, known, rec.health, rec.now, known.cur, timed=False)
    missing = [j for j in known.cover if j in untimed]
    if not missing:
        return None
    names = rec.ctx.names
    left = rec.ctx.policy.deadline - (rec.now - known.started)
    return Finding(
        "clock_never_closes_gate",
        f"the turn stayed on {names[known.cur]} while {names[missing[0]]} was eligible with "
        f"time for a whole attempt, then ended `failed` on {trigger} ({max(left, 0.0):g} s "
        f"of the {rec.ctx.policy.deadline:g} s deadline left) without asking {names[missing[0]]}",
    )


# -- 2. termination -------------------------------------------------------------------------------


def termination(rec: TransitionRecord) -> Finding | None:
    """Attempts in one turn stay within the policy's bounds (per target: max_attempts,
    one per extra key, one after a transport recovery)."""
    action = rec.action
    if not isinstance(action, Attempt):
        return None
    b = rec.ctx.bounds
    j = action.target.index
    after = rec.after
    if after.attempts[j] > b.per_target[j]:
        return Finding(
            "termination",
            f"{after.attempts[j]} attempts on {rec.ctx.names[j]} in one turn (bound "
            f"{b.per_target[j]})",
        )
    if after.total > b.attempts:
        return Finding("termination", f"{after.total} attempts in one turn (bound {b.attempts})")
    return None


def engine_crashed(e: Exception) -> Finding:
    """A crash inside the engine is a turn that never ends well: a finding, not a
    checker error."""
    return Finding("termination", f"the engine raised {type(e).__name__}: {e}")


def still_running(ctx: Context, o: Obs) -> Finding | None:
    """A turn may not outlast the policy's event bound (checked before each expansion)."""
    if o.events >= ctx.bounds.events:
        return Finding(
            "termination",
            f"the turn is still running after {o.events} events "
            f"(bound from the policy: {ctx.bounds.events})",
        )
    return None


# -- 3. no ping-pong ------------------------------------------------------------------------------


def no_ping_pong(rec: TransitionRecord) -> Finding | None:
    """A turn never returns to a target it left, nor goes back up the chain, except
    to an untried target of unknown context_length passed over, after a context
    overflow, for one known to be larger."""
    action = rec.action
    if not isinstance(action, Attempt):
        return None
    j = action.target.index
    known = rec.known
    names = rec.ctx.names
    if j != known.cur and j in known.tried:
        return Finding("no_ping_pong", f"returned to {names[j]} after leaving it")
    if j < known.cur and not went_back_allowed(rec.ctx, known, known.cur, j):
        return Finding("no_ping_pong", f"went back from {names[known.cur]} to {names[j]}")
    return None


# -- 4. honest waits ------------------------------------------------------------------------------


def honest_waits(rec: TransitionRecord) -> Finding | None:
    """Waits are finite, within the caps and the deadline; no call before a not-before
    time (a Retry-After, a cooldown); a running cooldown is never extended."""
    for which, k, old, new in rec.changes:
        if which < 2 and old > rec.then + EPS and new > old + EPS:
            return Finding(
                "honest_waits",
                f"a cooldown of {_show_key(k, rec.ctx)} still running was extended by "
                f"{new - old:g} s (cooldowns never extend themselves)",
            )
    action = rec.action
    if isinstance(action, Wait):
        w = action.seconds
        if not (math.isfinite(w) and w >= 0):
            return Finding("honest_waits", f"asked to wait {w!r} s")
        b = rec.ctx.bounds
        if w > b.single_wait + EPS:
            return Finding(
                "honest_waits", f"a single wait of {w:g} s exceeds the cap ({b.single_wait:g} s)"
            )
        deadline = rec.ctx.policy.deadline
        if rec.known.waits > deadline + EPS:
            return Finding(
                "honest_waits",
                f"waits total {rec.known.waits:g} s, beyond the deadline ({deadline:g} s)",
            )
        return None
    if isinstance(action, Attempt):
        j = action.target.index
        c = action.credential.id
        key = rec.ctx.keys[j]
        h = rec.health
        known = rec.known
        late = max(
            h.target_until(key),
            h.credential_until(key, action.credential.health_id),
            known.nb.get((j, c), 0.0),
            known.tnb.get(j, 0.0),
        )
        if late > rec.now + EPS:
            return Finding(
                "honest_waits",
                f"called {rec.ctx.names[j]} with {c} {late - rec.now:g} s before its "
                "not-before time",
            )
    return None


# -- 5. non-retryable outcomes are not retried ----------------------------------------------------


def non_retryable_not_retried(rec: TransitionRecord) -> Finding | None:
    """After an outcome whose rule says no retry, the same target and credential are not
    called again in the turn."""
    action = rec.action
    if not isinstance(action, Attempt):
        return None
    j = action.target.index
    c = action.credential.id
    known = rec.known
    if (j, c) in known.banned:
        last = known.last.kind.value if known.last is not None else "a non-retryable outcome"
        return Finding(
            "non_retryable_not_retried",
            f"called {rec.ctx.names[j]} with {c} again after {last} (not retryable)",
        )
    return None


# -- 6. bounded rotation --------------------------------------------------------------------------


def bounded_rotation(rec: TransitionRecord) -> Finding | None:
    """An outcome changes only the health of the target (or credential) that produced
    it: a success clears its own target and credential, a credential-level fault cools
    that credential, any other outcome (or a failed rebuild) that target, and an outcome
    adds to that target's failure streak. A credential is rotated only after its own
    fault, on a rule that rotates, at most once per other key in the pool."""
    if rec.changes:
        cur, cid = rec.before.cur, rec.before.cred
        key = rec.ctx.keys[cur] if cur >= 0 else None
        cred = rec.ctx.health_id(cur, cid) if cid is not None else None
        kind = rec.kind
        trigger = rec.trigger
        # a refused retry leaves the target: the outcome before it is reported then
        is_outcome = (kind is not None and kind is not _CANCELLED) or trigger == DENIED
        for which, k, _old, new in rec.changes:
            if kind is _SUCCESS:
                ok = new == 0 and (k == key or k == (key, cred))
            elif which == 0:  # a target cooldown
                ok = k == key and (
                    (is_outcome and kind not in CRED_LEVEL) or trigger == REBUILD_FAILED
                )
            elif which == 1:  # a credential cooldown
                ok = k == (key, cred) and kind in CRED_LEVEL
            else:  # a failure streak
                ok = k == key and (is_outcome or trigger == REBUILD_FAILED)
            if not ok:
                where = rec.ctx.names[cur] if cur >= 0 else "no target"
                return Finding(
                    "bounded_rotation",
                    f"{trigger} on {where}{f' ({cid})' if cid else ''} changed the health "
                    f"of {_show_key(k, rec.ctx)}",
                )
    action = rec.action
    if not isinstance(action, Attempt):
        return None
    j = action.target.index
    c = action.credential.id
    known = rec.known
    if not (j == known.cur and known.cred is not None and c != known.cred):
        return None
    name = rec.ctx.names[j]
    last_kind = known.last.kind if known.last is not None else None
    if last_kind not in CRED_LEVEL:
        why = last_kind.value if last_kind is not None else "nothing"
        return Finding(
            "bounded_rotation",
            f"switched {name} from {known.cred} to {c} after {why} (not the key's fault)",
        )
    if known.since_wait:
        return None
    if last_kind is not None and not rec.ctx.policy.rule(last_kind).rotate:
        return Finding(
            "bounded_rotation",
            f"rotated {name} to {c} on {last_kind.value}, which the policy does not rotate on",
        )
    pool = len(rec.ctx.pools[j])
    if rec.after.rot[j] > pool - 1:
        return Finding(
            "bounded_rotation",
            f"rotated {name}'s credential {_times(rec.after.rot[j])} (pool of {pool})",
        )
    return None


# -- 7. a clean turn start ------------------------------------------------------------------------


def clean_turn_start(rec: TransitionRecord) -> Finding | None:
    """A turn starts on the first target not cooling; when every target is cooling it
    waits (or fails), and then calls the target it waited for."""
    action = rec.action
    ctx = rec.ctx
    if rec.trigger == START:
        ready = first_ready(ctx, rec.health, rec.now)
        if ready >= 0:
            if not (isinstance(action, Attempt) and action.target.index == ready):
                return Finding(
                    "clean_turn_start",
                    f"the turn started with {_show(action)}, not on {ctx.names[ready]} "
                    "(the first target not cooling)",
                )
        elif isinstance(action, Attempt):
            return Finding(
                "clean_turn_start",
                f"the turn started with {_show(action)} while every target was cooling",
            )
    if isinstance(action, Attempt):
        known = rec.known
        j = action.target.index
        if known.expect >= 0 and j != known.expect and known.cur < 0:
            return Finding(
                "clean_turn_start",
                f"waited for {ctx.names[known.expect]} at turn start, then called {ctx.names[j]}",
            )
    return None


def clean_next_turn(new: TurnState, fresh: TurnState, previous: TurnState) -> Finding | None:
    """A next turn on a used health store starts exactly like a brand-new turn (`fresh`)
    and shares no per-turn container with the turn before it (`previous`)."""
    for name in PER_TURN_SLOTS:
        mine, ref = getattr(new, name), getattr(fresh, name)
        if mine != ref:
            return Finding(
                "clean_turn_start",
                f"a new turn on a used health store starts with {name}={mine!r} "
                f"(a brand-new turn has {ref!r})",
            )
        if isinstance(mine, dict | set | list) and mine is getattr(previous, name):
            return Finding("clean_turn_start", f"the new turn shares {name} with the last one")
    return None


# -- 8. committed streams are not replayed --------------------------------------------------------


def committed_streams_not_replayed(rec: TransitionRecord) -> Finding | None:
    """A committed stream is never replayed: it is continued or failed. Once a stream
    delivered output, every further call continues it (its delivered text as the
    prefix) on a target that takes one: the target it broke on, or the first eligible
    one after the current target that can; never one whose break said no text prefix
    can carry it (`Outcome.uncontinuable`); and a failure carries that output."""
    committed = rec.known.committed
    if committed is None:
        return None
    action = rec.action
    if isinstance(action, Fail):
        if rec.dest == FAILED and action.error.partial != committed:
            return Finding(
                "committed_streams_not_replayed",
                "the turn failed after a committed stream without its partial output",
            )
        return None
    if isinstance(action, Attempt):
        ctx, known = rec.ctx, rec.known
        policy = ctx.policy
        j, cur = action.target.index, known.cur
        name = ctx.names[j]
        if rec.outcome is not None and (why := rec.outcome.uncontinuable) is not None:
            said = f"its break said no text prefix can carry it ({why})"
            return Finding("committed_streams_not_replayed", f"asked {name} to continue: {said}")
        if not (policy.continues and action.target.continues):
            return Finding(
                "committed_streams_not_replayed",
                f"called {name} after a stream had delivered output (a replay: it cannot "
                "continue the stream)",
            )
        if action.prefix != committed:
            return Finding(
                "committed_streams_not_replayed",
                f"called {name} after a stream had delivered output without that output "
                "as its prefix (a replay)",
            )
        if j != cur:
            able = [
                k
                for k in eligible(ctx, known, rec.health, rec.now, cur)
                if k > cur and policy.targets[k].continues
            ]
            if not able or min(able) != j:
                first = ctx.names[min(able)] if able else "none"
                return Finding(
                    "committed_streams_not_replayed",
                    f"continued the stream on {name}; the first eligible target that can "
                    f"continue it was {first}",
                )
    return None


# -- 9. secrets never leak ------------------------------------------------------------------------


def secrets_never_leak(rec: TransitionRecord) -> Finding | None:
    """No key appears in any string a transition produces: its trace record, its action
    (and the repr of its target and credential), its error."""
    te = rec.te
    action = rec.action
    parts = [te.source, te.event, te.dest, te.action, te.detail]
    parts += [te.target or "", te.model or "", te.credential or ""]
    cls = type(action)
    if cls is Fail:
        err = action.error  # type: ignore[union-attr]
        text = str(err)  # its summary, every reason and the partial output's length
        parts += [text] if rec.ctx.plain else [text, repr(err), repr(err.reasons)]
        if err.summary not in text:
            parts.append(err.summary)
    elif cls is Attempt or cls is Rebuild:
        objs: tuple[Any, ...] = (action.target,)  # type: ignore[union-attr]
        if cls is Attempt:
            objs = (action.target, action.credential)  # type: ignore[union-attr]
        scanned = rec.ctx.scanned
        for obj in objs:
            if id(obj) not in scanned:
                parts += [repr(obj), str(obj)]
                scanned.add(id(obj))
    elif cls is Wait:
        parts.append(action.reason)  # type: ignore[union-attr]
    text = "\x00".join(parts)
    if not any(secret in text for secret in rec.ctx.secrets):
        return None
    leak = rec.ctx.leak
    m = leak.search(text)
    assert m is not None
    at = max(0, m.start() - 40)
    shown = leak.sub("***", text[at : m.end() + 20]).replace(chr(0), " | ")
    return Finding("secrets_never_leak", "a key appears in " + repr(shown))


# -- 10. declaration = execution ------------------------------------------------------------------


def declaration_equals_execution(
    ctx: Context, source: str, trigger: str, dest: str, made: Sequence[TraceEvent]
) -> Finding | None:
    """The transition taken is one the declaration has, recorded once, into a declared
    state (then `ends_as_declared` judges its action).

    Judged before the record is built: a transition the declaration does not have is
    neither followed nor judged by the other properties."""
    prop = "declaration_equals_execution"
    if len(made) != 1:
        return Finding(prop, f"{len(made)} trace records for one event {trigger!r} in {source!r}")
    te = made[0]
    if (te.source, te.event, te.dest) not in ctx.triples or te.source != source or te.dest != dest:
        return Finding(
            prop,
            f"executed {source} --{trigger}--> {dest} (trace: {te.source} --{te.event}--> "
            f"{te.dest}), which the declaration does not have",
        )
    if dest not in ctx.state_names:
        return Finding(prop, f"undeclared state {dest!r}")
    return None


def ends_as_declared(dest: str, action: Action) -> Finding | None:
    """A declared transition's action fits its destination: a terminal state ends the
    turn (Finish in `done`, Fail otherwise), any other state asks for more."""
    terminal = dest in TERMINALS
    if terminal != isinstance(action, Finish | Fail) or isinstance(action, Finish) != (
        dest == DONE
    ):
        return Finding(
            "declaration_equals_execution", f"state {dest!r} with action {type(action).__name__}"
        )
    return None


def engine_rejected(e: ProtocolError) -> Finding:
    """The machine refusing an event the host may feed: the declaration and the
    execution disagree on what the state accepts."""
    return Finding("declaration_equals_execution", f"the machine rejected a host event: {e}")


#: The checks the search runs on every record (in any order: each judges one property,
#: and the search keeps the first finding of each).
CHECKS: Final[tuple[Callable[[TransitionRecord], Finding | None], ...]] = (
    fallback_gate,
    honest_waits,
    bounded_rotation,
    clean_turn_start,
    committed_streams_not_replayed,
    secrets_never_leak,
    clock_never_closes_gate,
    reservations_released,
)

#: ... and, when the action is an `Attempt`, these too (they judge nothing else).
ON_ATTEMPT: Final[tuple[Callable[[TransitionRecord], Finding | None], ...]] = (
    *CHECKS,
    termination,
    no_ping_pong,
    non_retryable_not_retried,
    no_call_on_an_empty_key,
)


def _show(a: Action) -> str:
    if isinstance(a, Attempt):
        return f"an attempt on {a.target.name}"
    if isinstance(a, Wait):
        return f"a wait of {a.seconds:g} s"
    return type(a).__name__


def _show_key(k: Any, ctx: Context | None = None) -> str:
    if isinstance(k, tuple) and len(k) == 2 and isinstance(k[1], str) and isinstance(k[0], tuple):
        cid = k[1]
        for pool in ctx.pools if ctx is not None else ():
            cid = next((c.id for c in pool if c.health_id == k[1]), cid)
        return f"credential {cid} of {'/'.join(x for x in k[0] if x)}"
    if isinstance(k, tuple):
        return f"target {'/'.join(str(x) for x in k if x)}"
    return str(k)


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"
