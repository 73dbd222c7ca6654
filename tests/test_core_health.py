"""The health store: shared by concurrent turns, thread-safe, never self-extending;
one named process-wide default for turns given none."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import fallgate.fsm.health.store
from fallgate.fsm import HealthStore, Outcome, OutcomeKind, Turn, VirtualClock, instant_waits, run
from fallgate.fsm.core.actions import Attempt, Finish
from fallgate.fsm.host.loop import host_loop
from fallgate.fsm.host.scripted import play

from helpers import chain


class Status(Exception):
    def __init__(self, status: int, retry_after: str | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status
        self.headers = {"retry-after": retry_after} if retry_after else {}


def test_many_threads_running_turns_on_one_store_all_end_and_attribute_cooldowns_correctly():
    policy = chain("m0", "m1", keys=(2, 1))
    health = HealthStore()
    lock = threading.Lock()
    calls: list[tuple[str, str]] = []

    def call(target, credential):
        with lock:
            calls.append((target.model, credential.id))
        if target.model == "m0":
            raise Status(429, "600")
        return "ok"

    with instant_waits(), ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda _: run(policy, call, health=health), range(200)))
    assert all(r.value == "ok" and r.model == "m1" for r in results)
    snap = health.snapshot()
    creds = snap["credentials"]
    assert isinstance(creds, dict)
    # only the primary's two keys are benched; the fallback that answered is not
    assert {c for (_, c) in creds} == {c.health_id for c in policy.targets[0].credentials}
    assert all(t == policy.targets[0].key for (t, _) in creds)
    # once benched, later turns go straight to the fallback: far fewer than 3 calls per turn
    assert len(calls) < 2 * 200


def test_a_new_turn_starts_clean_whatever_the_previous_turn_left_behind():
    """Property 7 by example: only health facts cross turns, never counters."""
    policy = chain("m0", "m1", max_attempts=2)
    health, clock = HealthStore(), VirtualClock()
    play(policy, ["transport"] * 6, health=health, clock=clock, rebuild_ok=[True, True])
    clock.advance(1000)
    again = play(
        policy, ["transport", "transport", "transport", "success"], health=health, clock=clock
    )
    # the same path as on a fresh store: retry, recover once, then fall back
    fresh = play(policy, ["transport", "transport", "transport", "success"])
    assert again.path == fresh.path
    assert again.rebuilds == fresh.rebuilds == ("primary",)


def test_turns_given_no_store_share_the_named_process_wide_default():
    """Two unrelated callers, each with its own policy object for the same endpoints:
    without ``health=`` both use `fallgate.fsm.health.store.DEFAULT`, so a cooldown one of them
    caused is seen by the other, and by anyone who reads the default."""
    first, second = chain("m0", "m1"), chain("m0", "m1")
    assert first is not second
    assert Turn(first).s.health is fallgate.fsm.health.store.DEFAULT is HealthStore.default()
    clock = VirtualClock()
    models: list[str] = []

    def call(target, credential):
        models.append(target.model)
        if target.model == "m0":
            raise Status(429, "60")
        return "ok"

    run(first, call, clock=clock)
    assert models == ["m0", "m1"]
    cooling = fallgate.fsm.health.store.DEFAULT.snapshot()["credentials"]
    key1 = first.targets[0].credentials[0].health_id
    assert cooling == {(first.targets[0].key, key1): clock.now() + 60}
    assert run(second, call, clock=clock).model == "m1"
    assert models == ["m0", "m1", "m1"]  # the second caller skipped the cooling primary


def test_a_turn_given_its_own_store_neither_reads_nor_writes_the_default():
    calls: list[str] = []

    def call(target, credential):
        calls.append(target.model)
        if target.model == "m0":
            raise Status(429, "60")
        return "ok"

    clock = VirtualClock()
    run(chain("m0", "m1"), call, clock=clock)  # benches the primary's key in the default store
    own = HealthStore()
    assert run(chain("m0", "m1"), call, health=own, clock=clock).model == "m1"
    assert calls == ["m0", "m1", "m0", "m1"]  # the default's cooldown did not apply
    primary = chain("m0", "m1").targets[0]
    key1 = primary.credentials[0].health_id
    assert own.snapshot()["credentials"] == {(primary.key, key1): clock.now() + 60}


def test_many_threads_sharing_one_store_spend_the_retry_budget_exactly():
    """Retry tokens are taken under the store's lock however turns interleave: 16 threads
    run 640 turns whose primary always times out, each wanting two retries of it; exactly
    the bucket's 7 tokens are spent (no retry beyond them, none lost), and every turn
    answers from the fallback."""
    policy = chain(
        "m0",
        "m1",
        max_attempts=2,
        retry_budget={"size": 7, "refill": 0},
        breaker={"allowed_failures": 1000},  # keep the primary in play: the budget binds
    )
    health = HealthStore()
    clock = VirtualClock()
    lock = threading.Lock()
    retries: list[int] = []

    def attempt(a: Attempt) -> Outcome:
        if a.target.model == "m1":
            return Outcome(OutcomeKind.SUCCESS, value="ok")
        if a.retry:
            with lock:
                retries.append(a.number)
        return Outcome(OutcomeKind.TRANSPORT, detail="timeout")

    def turns(_: int) -> list[object]:
        out = []
        for _ in range(40):
            turn = Turn(policy, health=health, clock=clock.now)
            end = next(host_loop(turn, clock=clock, attempt=attempt))
            out.append(end.result if isinstance(end, Finish) else end)
        return out

    with ThreadPoolExecutor(max_workers=16) as pool:
        ends = [e for batch in pool.map(turns, range(16)) for e in batch]
    assert ends == ["ok"] * 640
    assert len(retries) == 7
    assert health.record(policy.targets[0].key).get("tokens") == 0
