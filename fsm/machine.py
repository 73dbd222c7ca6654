"""The turn machine, declared once, as data.

`declare(policy)` generates the states (one group per target of the user's
chain) and the ordered, guarded transitions. Everything else reads this
declaration: the `transitions` executor, the compiled fast executor, the
diagrams and the model checker. Nothing restates it.

Semantics of one event: the outcome is first *observed* (credential
cooldowns, counters), then the transitions declared for (state, trigger) are
tried in order; the first whose guard holds is taken and its effect returns
the next action. The last candidate of every group has no guard, so every
declared (state, trigger) pair always has a way out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import attrs

from .outcomes import FAULT_KINDS, OutcomeKind
from .policy import Policy

# Internal triggers (what the host feeds back after non-attempt actions).
START: Final = "start"
WAITED: Final = "waited"
REBUILT: Final = "rebuilt"
REBUILD_FAILED: Final = "rebuild_failed"
CANCELLED: Final = OutcomeKind.CANCELLED.value
SUCCESS: Final = OutcomeKind.SUCCESS.value

IDLE: Final = "idle"
DONE: Final = "done"
FAILED: Final = "failed"
ABORTED: Final = "aborted"
TERMINALS: Final = (DONE, FAILED, ABORTED)

# Phases of a target: "" is "an attempt is in flight".
CALLING: Final = ""
TIMING_OUT: Final = "timing_out"
RECOVERING: Final = "recovering"
RATE_LIMITED: Final = "rate_limited"
BACKING_OFF: Final = "backing_off"
CONTINUING: Final = "continuing"  # a committed stream being resent (opt-in continuation)
PHASES: Final = (CALLING, TIMING_OUT, RECOVERING, RATE_LIMITED, BACKING_OFF, CONTINUING)
WAIT_PHASES: Final = (TIMING_OUT, RATE_LIMITED, BACKING_OFF)

#: What each guard means, for diagrams and the checker's reports.
GUARD_TEXT: Final = {
    "transport_retry": "streak < {faults} and attempts < {attempts}, not recovered",
    "can_recover": "recovery not yet used",
    "can_rotate": "another credential free (rotations < pool-1)",
    "overload_retry": "attempts < {attempts}, Retry-After <= cap",
    "can_wait": "attempts < {attempts}, wait <= {cap}s and deadline",
    "stream_retry": "continuation on, attempts < {attempts}",
    "next_is": "next eligible = {target}",
    "first_is": "first free = {target}",
    "soonest_is": "all cooling; soonest free = {target}",
}


@attrs.frozen(slots=True)
class State:
    name: str
    target: int | None = None  # index into policy.targets; None for idle/terminals
    phase: str = CALLING

    @property
    def terminal(self) -> bool:
        return self.name in TERMINALS


@attrs.frozen(slots=True)
class Transition:
    """One declared edge. `arg` is the target index a guard or effect is about."""

    trigger: str
    source: str
    dest: str
    guard: str | None = None
    effect: str = ""
    arg: int = -1

    def label(self, policy: Policy) -> str:
        if self.guard is None:
            return self.trigger
        text = GUARD_TEXT[self.guard].format(
            faults=policy.transport_faults_before_recovery,
            attempts=policy.max_attempts,
            cap=_num(policy.retry_after_cap),
            target=policy.targets[self.arg].name if self.arg >= 0 else "?",
        )
        return f"{self.trigger} [{text}]"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def state_name(target_name: str, phase: str) -> str:
    return target_name if not phase else f"{target_name}_{phase}"


@attrs.frozen(slots=True)
class Declaration:
    """States, triggers and ordered transitions of one policy's machine."""

    policy: Policy = attrs.field(repr=False)
    states: tuple[State, ...]
    transitions: tuple[Transition, ...]
    triggers: tuple[str, ...]
    initial: str = IDLE
    prepare: str = "observe"  # runs once per event before any guard

    def state(self, name: str) -> State:
        for s in self.states:
            if s.name == name:
                return s
        raise KeyError(name)

    def outgoing(self, source: str, trigger: str) -> tuple[Transition, ...]:
        return tuple(t for t in self.transitions if t.source == source and t.trigger == trigger)

    def groups(self) -> dict[tuple[str, str], tuple[Transition, ...]]:
        """(source, trigger) -> candidates in declared order."""
        out: dict[tuple[str, str], list[Transition]] = {}
        for t in self.transitions:
            out.setdefault((t.source, t.trigger), []).append(t)
        return {k: tuple(v) for k, v in out.items()}


def declare(policy: Policy) -> Declaration:
    """Generate the machine for `policy` (cached on the policy: build once)."""
    cache = _cache(policy)
    found = cache.get("declaration")
    if isinstance(found, Declaration):
        return found
    decl = _declare(policy)
    cache["declaration"] = decl
    return decl


def _cache(policy: Policy) -> dict[str, object]:
    """Per-policy memo (declaration, compiled table, default health store)."""
    found = _CACHES.get(id(policy))
    if found is None:
        found = _CACHES.setdefault(id(policy), _finalized(policy))
    return found


_CACHES: dict[int, dict[str, object]] = {}


def _finalized(policy: Policy) -> dict[str, object]:
    import weakref

    key = id(policy)
    weakref.finalize(policy, _CACHES.pop, key, None)
    return {}


def _declare(policy: Policy) -> Declaration:
    targets = policy.targets
    n = len(targets)
    continuation = policy.continue_streams and policy.rule(OutcomeKind.STREAM_INTERRUPTED).retry
    states: list[State] = [State(IDLE)]
    for t in targets:
        for phase in PHASES:
            if phase == RECOVERING and not policy.recover_transport:
                continue
            if phase == CONTINUING and not continuation:
                continue
            states.append(State(state_name(t.name, phase), t.index, phase))
    states += [State(DONE), State(FAILED), State(ABORTED)]
    tr: list[Transition] = []

    # Turn start: the first target not cooling; if all are cooling, wait for the soonest.
    for j in range(n):
        tr.append(Transition(START, IDLE, targets[j].name, "first_is", "enter", j))
    for j in range(n):
        tr.append(
            Transition(
                START,
                IDLE,
                state_name(targets[j].name, RATE_LIMITED),
                "soonest_is",
                "wait_for_target",
                j,
            )
        )
    tr.append(Transition(START, IDLE, FAILED, None, "fail"))

    for t in targets:
        i = t.index
        here = t.name
        fallbacks = [
            Transition("", here, targets[j].name, "next_is", "fall_back", j)
            for j in range(i + 1, n)
        ]

        def to_fallbacks(
            kind: str, src: str = here, fallbacks: list[Transition] = fallbacks
        ) -> Iterator[Transition]:
            for f in fallbacks:
                yield attrs.evolve(f, trigger=kind, source=src)

        # An attempt in flight on t.
        tr.append(Transition(SUCCESS, here, DONE, None, "finish"))
        for kind in FAULT_KINDS:
            rule = policy.rule(kind)
            k = kind.value
            if kind is OutcomeKind.TRANSPORT:
                if rule.retry:
                    tr.append(
                        Transition(
                            k, here, state_name(here, TIMING_OUT), "transport_retry", "back_off"
                        )
                    )
                    if policy.recover_transport:
                        tr.append(
                            Transition(
                                k, here, state_name(here, RECOVERING), "can_recover", "rebuild"
                            )
                        )
            elif kind is OutcomeKind.STREAM_INTERRUPTED:
                if continuation:
                    tr.append(
                        Transition(k, here, state_name(here, CONTINUING), "stream_retry", "attempt")
                    )
            if rule.rotate:
                tr.append(Transition(k, here, here, "can_rotate", "rotate"))
            # Waits on this target (a Retry-After, a server-error backoff) come after the
            # fallbacks: never sleep while an eligible fallback is available now, unless the
            # policy prefers waiting.
            wait: Transition | None = None
            if kind is OutcomeKind.RATE_LIMITED and rule.retry:
                wait = Transition(
                    k, here, state_name(here, RATE_LIMITED), "can_wait", "wait_rate_limit"
                )
            elif kind is OutcomeKind.OVERLOADED and rule.retry:
                wait = Transition(
                    k, here, state_name(here, BACKING_OFF), "overload_retry", "back_off"
                )
            if wait is not None and policy.prefer_waiting:
                tr.append(wait)
            if rule.fall_back:
                tr.extend(to_fallbacks(k))
            if wait is not None and not policy.prefer_waiting:
                tr.append(wait)
            tr.append(Transition(k, here, FAILED, None, "fail"))

        # A committed stream being continued: it may only finish, continue again or fail;
        # no rotation, no fallback (output already reached the caller).
        if continuation:
            cont = state_name(here, CONTINUING)
            tr.append(Transition(SUCCESS, cont, DONE, None, "finish"))
            for kind in FAULT_KINDS:
                if kind is OutcomeKind.STREAM_INTERRUPTED:
                    tr.append(Transition(kind.value, cont, cont, "stream_retry", "attempt"))
                tr.append(Transition(kind.value, cont, FAILED, None, "fail"))

        # Waiting and recovering phases.
        for phase in WAIT_PHASES:
            tr.append(Transition(WAITED, state_name(here, phase), here, None, "attempt"))
        if policy.recover_transport:
            rec = state_name(here, RECOVERING)
            tr.append(Transition(REBUILT, rec, here, None, "recovered"))
            if policy.rule(OutcomeKind.TRANSPORT).fall_back:  # a failed rebuild is transport
                tr.extend(to_fallbacks(REBUILD_FAILED, rec))
            tr.append(Transition(REBUILD_FAILED, rec, FAILED, None, "fail"))

    for s in states:
        if not s.terminal:
            tr.append(Transition(CANCELLED, s.name, ABORTED, None, "abort"))

    triggers = (START, *[k.value for k in OutcomeKind], WAITED, REBUILT, REBUILD_FAILED)
    return Declaration(policy, tuple(states), tuple(tr), triggers)
