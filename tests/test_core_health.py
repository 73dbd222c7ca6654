"""The health store: shared by concurrent turns, thread-safe, never self-extending."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from fsm import HealthStore, instant_waits, run
from fsm.testing import FakeClock, play

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
    assert {c for (_, c) in creds} == {"key#1", "key#2"}
    assert all(t == policy.targets[0].key for (t, _) in creds)
    # once benched, later turns go straight to the fallback: far fewer than 3 calls per turn
    assert len(calls) < 2 * 200


def test_a_new_turn_starts_clean_whatever_the_previous_turn_left_behind():
    """Property 7 by example: only health facts cross turns, never counters."""
    policy = chain("m0", "m1", max_attempts=2)
    health, clock = HealthStore(), FakeClock()
    play(policy, ["transport"] * 6, health=health, clock=clock, rebuild_ok=[True, True])
    clock.advance(1000)
    again = play(
        policy, ["transport", "transport", "transport", "success"], health=health, clock=clock
    )
    # the same path as on a fresh store: retry, recover once, then fall back
    fresh = play(policy, ["transport", "transport", "transport", "success"])
    assert again.path == fresh.path
    assert again.rebuilds == fresh.rebuilds == ("primary",)
