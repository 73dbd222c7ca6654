"""The pure core's hot path, pinned by structure, never by time: what one turn calls,
builds and locks (counted with a profile hook and counting stand-ins, in this process).

The turn is regression scenario 1's, as the core bench runs it (`python -m bench --only
core`): timeout, timeout, transport recovery, 429, fallback, success — four attempts on a
fresh in-memory store. The figures these budgets hold were measured beside tenacity
making the same attempts (docs/bench.md, "Core overhead")."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import attrs
import pytest
import tenacity
from fallgate.fsm import HealthStore, Outcome, OutcomeKind, Turn, VirtualClock
from fallgate.fsm.core.actions import (
    Attempt,
    Finish,
    Rebuild,
    Wait,
    new_attempt,
    new_finish,
    new_rebuild,
    new_wait,
)
from fallgate.fsm.core.machine import FanOut
from fallgate.fsm.core.state import TurnState
from fallgate.fsm.host.loop import host_loop

from helpers import chain

POLICY = chain("m0", "m1", max_attempts=2)
SCENARIO_1 = (
    Outcome(OutcomeKind.TRANSPORT, detail="timeout: Timeout"),
    Outcome(OutcomeKind.TRANSPORT, detail="timeout: Timeout"),
    Outcome(OutcomeKind.RATE_LIMITED, status=429, detail="Rate limit reached"),
    Outcome(OutcomeKind.SUCCESS, value="ok"),
)


def scripted(a: Attempt) -> Outcome:
    return SCENARIO_1[a.number - 1]


def drive(health: HealthStore | None = None) -> Turn:
    """One scenario-1 turn on the host loop, on a virtual clock, as the core bench runs it."""
    clock = VirtualClock()
    turn = Turn(POLICY, health=health or HealthStore(), clock=clock.now, random=lambda: 0.5)
    next(host_loop(turn, clock=clock, attempt=scripted))
    return turn


def faulty_turn(health: HealthStore | None = None) -> Turn:
    """`drive`, checked: the turn took scenario 1's path."""
    turn = drive(health)
    assert type(turn.s.action) is Finish and turn.s.action.result == "ok"
    models = [e.model for e in turn.trace if e.action == "Attempt"]
    assert models == ["m0", "m0", "m0", "m1"], models
    return turn


def calls(f: Callable[[], object]) -> list[CodeType]:
    """The Python functions `f` calls (code objects, in order; a generator's every
    resumption counts)."""
    seen: list[CodeType] = []

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            seen.append(frame.f_code)

    f()  # warm: memoised declaration and table
    sys.setprofile(hook)
    try:
        f()
    finally:
        sys.setprofile(None)
    return seen


def test_a_fallback_builds_no_edge_and_asks_its_pick_once():
    """A fan-out is compiled to its destinations: taking one of its edges (the start, the
    429's fallback) builds no `Transition` and asks the guard's pick once per event (the
    fallback's pick is `TurnState.next_eligible` itself, without a wrapper's frame; it
    judges the one later target once, then answers from its per-event cache)."""
    faulty_turn()
    codes = calls(drive)
    built = [c for c in codes if "Transition" in c.co_filename]
    assert built == [], "a Transition was built while the turn ran"
    assert FanOut.edge.__code__ not in codes and FanOut.covers.__code__ not in codes
    picks = [c.co_name for c in codes if c.co_name in ("_first_free", "_next_eligible")]
    assert picks == ["_first_free"]  # the start's
    assert codes.count(TurnState.ineligible.__code__) == 1  # the 429's fallback judged m1 once


def test_a_fallback_asks_the_store_once_per_later_target():
    """Whether a later target is ready (its open span, another turn's probe lease, its
    keys' cooldowns) is one read of the store (`HealthStore.ready_at`)."""
    faulty_turn()
    codes = calls(drive)
    store = {c.co_name for c in codes if c.co_filename.endswith("health.py")}
    ready = [c for c in codes if c is HealthStore.ready_at.__code__]
    assert len(ready) == 1
    assert not store & {"target_until", "lease_until"}, store


class CountingLock:
    """A lock that counts its acquisitions (with or without `with`)."""

    def __init__(self) -> None:
        self.inner = threading.Lock()
        self.taken = 0

    def acquire(self, *a: Any) -> bool:
        self.taken += 1
        return self.inner.acquire(*a)

    def release(self) -> None:
        self.inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class CountingRecords(dict[Any, Any]):
    """The store's target records, counting writes."""

    writes = 0

    def __setitem__(self, key: Any, value: Any) -> None:
        self.writes += 1
        super().__setitem__(key, value)


def counting_store() -> tuple[HealthStore, CountingLock, CountingRecords]:
    store = HealthStore()
    lock, records = CountingLock(), CountingRecords()
    store._lock = lock  # type: ignore[assignment]
    store._targets = records
    return store, lock, records


def test_a_retry_grant_locks_once_and_writes_one_record():
    """Each retry's grant is one lock and one record write (its token); a first attempt
    on a target the store knows nothing of takes neither."""
    store, lock, records = counting_store()
    clock = VirtualClock()
    turn = Turn(POLICY, health=store, clock=clock.now, random=lambda: 0.5)
    first = turn.start()
    assert isinstance(first, Attempt) and not first.retry
    assert store.grant(turn.s, first) is None
    assert (lock.taken, records.writes) == (0, 0)
    turn.feed(SCENARIO_1[0])
    retry = turn.waited()
    assert isinstance(retry, Attempt) and retry.retry
    assert store.grant(turn.s, retry) is None
    assert (lock.taken, records.writes) == (1, 1)
    assert store.record(POLICY.targets[0].key) == {"tokens": POLICY.retry_budget.size - 1}


def test_the_faulty_turn_takes_the_store_lock_four_times():
    """Two retry grants, the 429's key cooldown with its cause (one acquisition: the
    cause is noted where the bench is set), the success: four acquisitions of the store's
    lock for the whole turn, two record writes."""
    store, lock, records = counting_store()
    faulty_turn(store)
    assert lock.taken == 4
    assert records.writes == 2


def tenacity_turn() -> Callable[[], object]:
    """Tenacity making the same four attempts (its sleep a no-op), as the core bench does."""
    steps: list[type[BaseException] | None] = [TimeoutError, TimeoutError, ConnectionError, None]
    i = [0]

    @tenacity.retry(
        retry=tenacity.retry_if_exception_type((TimeoutError, ConnectionError)),
        stop=tenacity.stop_after_attempt(5),
        wait=tenacity.wait_random_exponential(multiplier=0.5, max=8),
        sleep=lambda _: None,
        reraise=True,
    )
    def call() -> str:
        exc = steps[i[0]]
        i[0] += 1
        if exc is not None:
            raise exc()
        return "ok"

    def one() -> object:
        i[0] = 0
        return call()

    return one


def test_the_faulty_turn_makes_fewer_python_calls_than_its_budget():
    """Python-level calls of the whole faulty turn (construction, host loop, store
    included): at most 0.43x what tenacity makes for the same four attempts, measured here
    (it was 0.50x once the fleet's bookkeeping had come in; the compiled fan-outs, the
    one-read readiness and the executor's setup hook brought it to 0.44x, 148 calls; the
    actions built through their slots, the fallback's bare pick, the cause noted with the
    bench and the grant's precomputed class check to 0.42x, 143; the time reserve each
    retry and the recovery ask, its guard, worst wait, attempt bound and largest reserve,
    to 0.47x, 158)."""
    faulty_turn()
    ours = len(calls(drive))
    theirs = len(calls(tenacity_turn()))
    assert ours <= 0.47 * theirs, (ours, theirs)


def test_the_turn_builds_its_actions_without_attrs_init():
    """The seven actions of the faulty turn (four attempts, a wait, a rebuild, the finish)
    are built through their slots' setters (`fsm.core.actions.new_attempt`, ...): attrs' frozen
    `__init__`, which looks every field up by name, is never run."""
    faulty_turn()
    codes = set(calls(drive))
    inits = {
        cls.__name__ for cls in (Attempt, Wait, Rebuild, Finish) if cls.__init__.__code__ in codes
    }
    assert inits == set()


@pytest.mark.parametrize(
    ("cls", "build", "args"),
    [
        (
            Attempt,
            new_attempt,
            (POLICY.targets[0], POLICY.targets[0].pool()[0], 4.5, 2, True, True, 30.0, "Once "),
        ),
        (Wait, new_wait, (0.25, "transport backoff")),
        (Rebuild, new_rebuild, (POLICY.targets[1],)),
        (Finish, new_finish, ("ok",)),
    ],
)
def test_a_fast_builder_builds_what_the_class_builds(cls: Any, build: Any, args: Any):
    """Each builder fills every field of its class, in order, into an equal, frozen
    object: a field added to an action without its builder fails here."""
    assert len(args) == len(attrs.fields(cls))
    built = build(*args)
    assert type(built) is cls and built == cls(*args)
    assert [getattr(built, f.name) for f in attrs.fields(cls)] == list(args)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        built.__setattr__(attrs.fields(cls)[0].name, None)


def test_a_turn_is_slotted():
    """A turn object carries no instance dict: one block less to build and free per turn
    (the checker's copies and the otel registry's weak references still work)."""
    turn = Turn(POLICY, health=HealthStore())
    assert not hasattr(turn, "__dict__")
