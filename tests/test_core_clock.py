"""One injected clock: the system clock by default, a virtual one for tests."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from fallgate.fsm import HealthStore, Policy, Turn, VirtualClock, instant_waits, run
from fallgate.fsm.clock import SYSTEM, Clock, SystemClock, default_clock


class Status(Exception):
    def __init__(self, status: int, headers: dict[str, str] | None = None):
        super().__init__(f"HTTP {status}")
        self.status_code = status
        self.headers = headers or {}


def one_target() -> Policy:
    return Policy.from_dict(
        {
            "primary": {"provider": "openai", "model": "m", "api_key": "sk-1234"},
            "retry_after_cap": 60,
        }
    )


def rate_limited_once(seconds: int):
    calls: list[float] = []

    def call(target, credential):
        calls.append(default_clock().now())
        if len(calls) == 1:
            raise Status(429, {"retry-after": str(seconds)})
        return "ok"

    return call, calls


def test_both_clocks_are_clocks_and_the_system_clock_is_the_default():
    assert isinstance(SYSTEM, Clock) and isinstance(VirtualClock(), Clock)
    assert default_clock() is SYSTEM
    assert isinstance(SYSTEM, SystemClock)
    before = time.monotonic()
    assert before <= SYSTEM.now() <= time.monotonic()
    assert Turn(one_target()).s.clock is SYSTEM.now


def test_a_virtual_clock_only_moves_when_told_and_never_backwards():
    clock = VirtualClock(start=10.0)
    assert clock.now() == clock() == 10.0
    clock.sleep(2.5)
    asyncio.run(clock.asleep(1.5))
    clock.advance(6)
    assert clock.now() == 20.0
    for bad in (-5.0, 0.0, float("nan")):
        clock.advance(bad)
        clock.sleep(bad)
    assert clock.now() == 20.0
    with pytest.raises(ValueError, match="start must be a finite number"):
        VirtualClock(float("inf"))


def test_a_virtual_clock_is_thread_safe():
    clock = VirtualClock(start=0.0)

    def tick() -> None:
        for _ in range(20_000):
            clock.sleep(1.0)

    threads = [threading.Thread(target=tick) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clock.now() == 80_000.0


def test_instant_waits_swaps_in_a_virtual_clock_that_starts_now_and_keeps_time_honest():
    call, calls = rate_limited_once(20)
    t0 = time.perf_counter()
    with instant_waits() as clock:
        assert default_clock() is clock
        assert clock.now() == pytest.approx(time.monotonic(), abs=1.0)
        started = clock.now()
        result = run(one_target(), call, health=HealthStore(), random=lambda: 0.0)
        # the wait advanced the virtual clock by the Retry-After, and took no real time
        assert calls[1] - calls[0] == pytest.approx(20.0, abs=0.05)
        assert clock.now() - started == pytest.approx(20.0, abs=0.05)
    assert time.perf_counter() - t0 < 1.0
    assert result.value == "ok"
    assert default_clock() is SYSTEM


def test_instant_waits_lets_time_pass_between_turns_so_cooldowns_end():
    health = HealthStore()
    two = Policy.from_dict(
        {
            "primary": {"provider": "openai", "model": "m0", "api_key": "sk-1234"},
            "fallback_providers": [{"provider": "groq", "model": "m1", "api_key": "sk-5678"}],
        }
    )
    models: list[str] = []

    def call(target, credential):
        models.append(target.model)
        if target.model == "m0" and len(models) == 1:
            raise Status(429, {"retry-after": "30"})
        return "ok"

    with instant_waits() as clock:
        run(two, call, health=health)  # the primary's key cools for 30 s: fallback
        run(two, call, health=health)  # still cooling: straight to the fallback
        clock.advance(31)
        run(two, call, health=health)  # the cooldown is over: the primary again
    assert models == ["m0", "m1", "m1", "m0"]


def test_instant_waits_reaches_worker_threads_and_nested_blocks_keep_time_monotone():
    seen: list[Clock] = []
    with instant_waits() as outer:
        worker = threading.Thread(target=lambda: seen.append(default_clock()))
        worker.start()
        worker.join()
        with instant_waits() as inner:
            assert default_clock() is inner and inner.now() == outer.now()
            inner.advance(100)
        assert default_clock() is outer
        assert outer.now() == inner.now()  # the inner block's time is not lost
    assert seen == [outer]
    assert default_clock() is SYSTEM


def test_turns_given_their_own_clock_ignore_instant_waits():
    clock = VirtualClock(start=0.0)
    call, _ = rate_limited_once(5)
    with instant_waits() as instant:
        before = instant.now()
        run(one_target(), call, health=HealthStore(), clock=clock, random=lambda: 0.0)
        assert instant.now() == before
    assert clock.now() == pytest.approx(5.0, abs=0.05)
