"""The sync and async drivers: same semantics, real (interruptible) waits on a Clock.

Turns here pass no health store unless they must not share one: they use the
process-wide `fsm.health.store.DEFAULT`, emptied before every test (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from fallgate.fsm import HealthStore, TurnFailed, VirtualClock, arun, drive, instant_waits, run
from fallgate.fsm.core.actions import Attempt
from fallgate.fsm.core.turn import TransitionsTurn, Turn
from fallgate.fsm.trace import TraceEvent, from_jsonl, to_jsonl

from helpers import chain


class Status(Exception):
    def __init__(self, status: int, headers: dict[str, str] | None = None, body: str = ""):
        super().__init__(f"HTTP {status}: {body}")
        self.status_code = status
        self.headers = headers or {}
        self.body = body


def no_jitter() -> float:
    """A random source that draws 0: waits are exactly the Retry-After or backoff."""
    return 0.0


def scripted(*effects: object):
    calls: list[str] = []
    it = iter(effects)

    def call(target, credential):
        calls.append(target.model)
        e = next(it)
        if isinstance(e, BaseException):
            raise e
        return e

    return call, calls


def test_sync_run_retries_recovers_and_falls_back_with_real_exceptions():
    call, calls = scripted(TimeoutError(), ConnectionResetError(), Status(429), "answer")
    rebuilt: list[str] = []
    with instant_waits():
        result = run(
            chain("m0", "m1", max_attempts=2),
            call,
            rebuild=lambda t: rebuilt.append(t.name),
        )
    assert result.value == "answer"
    assert calls == ["m0", "m0", "m0", "m1"]
    assert rebuilt == ["primary"]
    assert (result.target, result.model, result.attempts) == ("fallback_1", "m1", 4)


async def test_async_run_has_the_same_semantics_as_sync():
    effects = (TimeoutError(), ConnectionResetError(), Status(429), "answer")
    call, sync_calls = scripted(*effects)
    # each driver on its own store: the second turn must not inherit the first's cooldown
    with instant_waits():
        sync = run(chain("m0", "m1", max_attempts=2), call, health=HealthStore())
    it = iter(effects)
    async_calls: list[str] = []

    async def acall(target, credential):
        async_calls.append(target.model)
        e = next(it)
        if isinstance(e, BaseException):
            raise e
        return e

    with instant_waits():
        result = await arun(chain("m0", "m1", max_attempts=2), acall, health=HealthStore())
    assert async_calls == sync_calls
    assert [(e.source, e.event, e.dest) for e in result.trace] == [
        (e.source, e.event, e.dest) for e in sync.trace
    ]


def test_a_failed_turn_raises_turn_failed_naming_every_target():
    call, _ = scripted(Status(400, body="bad"), "never")
    with pytest.raises(TurnFailed) as info:
        run(chain("m0", "m1"), call)
    assert info.value.state == "failed"
    assert set(info.value.reasons) == {"primary", "fallback_1"}
    assert "bad_request (HTTP 400)" in str(info.value)
    assert info.value.trace[-1].dest == "failed"


async def test_an_async_turn_cancelled_during_a_30s_wait_aborts_within_100ms():
    events: list[TraceEvent] = []

    async def rate_limited(target, credential):
        raise Status(429, {"retry-after": "30"})

    policy = chain("m", retry_after_cap=60)
    task = asyncio.create_task(
        arun(policy, rate_limited, on_transition=events.append, random=no_jitter)
    )
    while not events or events[-1].action != "Wait":
        await asyncio.sleep(0.005)
    assert events[-1].wait == pytest.approx(30, abs=0.5)
    t0 = time.perf_counter()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.perf_counter() - t0 < 0.1
    assert events[-1].dest == "aborted"


class InterruptedClock(VirtualClock):
    """A clock whose every sleep is interrupted by Ctrl-C."""

    def sleep(self, seconds: float) -> None:
        raise KeyboardInterrupt


def test_keyboard_interrupt_during_a_wait_aborts_the_turn_and_propagates():
    events: list[TraceEvent] = []
    call, _ = scripted(TimeoutError(), "never")
    with pytest.raises(KeyboardInterrupt):
        run(
            chain("m0", "m1"),
            call,
            clock=InterruptedClock(),
            on_transition=events.append,
        )
    assert [e.dest for e in events] == ["primary", "primary_transport_backoff", "aborted"]


def test_keyboard_interrupt_during_an_attempt_aborts_the_turn_and_propagates():
    events: list[TraceEvent] = []
    call, _ = scripted(KeyboardInterrupt(), "never")
    with pytest.raises(KeyboardInterrupt):
        run(chain("m0", "m1"), call, on_transition=events.append)
    assert [e.dest for e in events] == ["primary", "aborted"]


def test_a_virtual_clock_carries_the_waits_and_the_trace_times_of_run_and_arun():
    policy = chain("m", retry_after_cap=60)
    for driver in ("run", "arun"):  # each on its own store and clock
        clock = VirtualClock(start=50.0)
        call, calls = scripted(Status(429, {"retry-after": "20"}), "ok")
        t0 = time.perf_counter()
        if driver == "run":
            result = run(policy, call, health=HealthStore(), clock=clock, random=no_jitter)
        else:

            async def acall(target, credential, call=call):
                return call(target, credential)

            result = asyncio.run(
                arun(policy, acall, health=HealthStore(), clock=clock, random=no_jitter)
            )
        assert time.perf_counter() - t0 < 1.0, driver
        assert clock.now() == pytest.approx(70.0, abs=0.05), driver
        assert result.trace[-1].time == pytest.approx(20.0, abs=0.05), driver
        assert calls == ["m", "m"], driver


def test_a_clock_that_is_not_a_clock_is_refused_by_name():
    call, _ = scripted("ok")
    with pytest.raises(TypeError, match=r"clock must be an fsm\.Clock .* got function"):
        run(chain("m0", "m1"), call, clock=lambda: 0.0)  # type: ignore[arg-type]


def one_turn(driver: str, call, **options):
    """A turn of `call` on the sync driver (``"run"``) or the asyncio one (``"arun"``)."""

    async def acall(target, credential):
        return call(target, credential)

    if driver == "run":
        return run(chain("m"), call, **options)
    return asyncio.run(arun(chain("m"), acall, **options))


@pytest.mark.parametrize("driver", ["run", "arun"])
def test_a_health_store_url_given_as_health_is_refused_by_name(driver):
    """A string (a store's URL) is not a store: refused before the turn, not inside it."""
    call, _ = scripted("ok")
    refused = r"health must be a fallgate\.HealthStore .* got str"
    with pytest.raises(TypeError, match=refused):
        one_turn(driver, call, health="redis://cache:6379/0")


def test_a_random_source_that_is_not_callable_is_refused_by_name():
    call, _ = scripted("ok")
    with pytest.raises(TypeError, match=r"random must be a callable .* got float"):
        run(chain("m"), call, random=0.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("driver", ["run", "arun"])
def test_an_unknown_keyword_is_refused_by_name_before_any_attempt(driver):
    """The drivers' keywords are one `TypedDict` (`Options`): a misspelt one is still
    refused, naming it and what is taken, as a signature would."""
    call, calls = scripted("ok")
    refused = r"unexpected keyword argument 'retries' \(it takes: affinity, classify, .*telemetry\)"
    with pytest.raises(TypeError, match=refused):
        one_turn(driver, call, retries=3)
    assert calls == []


def test_instant_waits_take_no_real_time_but_keep_cooldowns_honest():
    call, calls = scripted(Status(429, {"retry-after": "20"}), "ok")
    policy = chain("m")
    t0 = time.perf_counter()
    with instant_waits():
        result = run(policy, call, random=no_jitter)
    assert time.perf_counter() - t0 < 1.0
    assert [e.wait for e in result.trace if e.wait] == [pytest.approx(20.0, abs=0.05)]
    assert calls == ["m", "m"]


def test_a_broken_classifier_or_rebuild_never_crashes_the_engine():
    def classify(e: BaseException):
        raise RuntimeError("classifier bug")

    call, _ = scripted(TimeoutError(), "never")
    with pytest.raises(TurnFailed, match="classifier raised RuntimeError"):
        run(chain("m0", "m1"), call, classify=classify)

    def rebuild(target):
        raise OSError("cannot build client")

    call, calls = scripted(TimeoutError(), TimeoutError(), "fallback answer")
    with instant_waits():
        result = run(chain("m0", "m1"), call, rebuild=rebuild)
    assert calls == ["m0", "m0", "m1"]
    assert any(e.event == "rebuild_failed" for e in result.trace)


def test_the_transitions_engine_drives_the_same_turn():
    call, calls = scripted(TimeoutError(), Status(401), "ok")
    with instant_waits():
        result = run(chain("m0", "m1"), call, engine=TransitionsTurn)
    assert calls == ["m0", "m0", "m1"]
    assert result.state == "done"


def test_the_trace_round_trips_through_json_lines():
    call, _ = scripted(TimeoutError(), "ok")
    with instant_waits():
        result = run(chain("m0", "m1"), call)
    text = to_jsonl(result.trace)
    assert len(text.splitlines()) == len(result.trace)
    assert from_jsonl(text) == list(result.trace)
    with pytest.raises(ValueError, match="trace line 1: missing"):
        from_jsonl('{"seq": 1}\n')


@pytest.mark.parametrize("on", ["start", "success"])
def test_a_hook_that_raises_is_logged_once_and_the_turn_keeps_its_answer(on, caplog):
    """The hook observes, never steers: an observer that fails (a metrics backend down)
    neither throws away an answer already paid for nor leaves the turn unended."""
    seen: list[str] = []

    def hook(ev: TraceEvent) -> None:
        seen.append(ev.event)
        if ev.event in (on, "overloaded"):  # twice in the turn: logged once
            raise RuntimeError("metrics backend down")

    call, calls = scripted(Status(503), "ok")
    result = run(chain("m0", "m1", max_attempts=1), call, on_transition=hook)
    assert result.value == "ok" and calls == ["m0", "m1"]
    assert seen[0] == "start" and seen[-1] == "success", "every later transition still observed"
    warnings = [r for r in caplog.records if "on_transition hook raised" in r.getMessage()]
    assert len(warnings) == 1, "once per turn, with the exception"
    assert warnings[0].exc_info is not None


@pytest.mark.parametrize(
    ("mistake", "says"),
    [
        (lambda: run({"primary": {"model": "m"}}, lambda t, c: "x"), "must be a fallgate Policy"),
        (lambda: Turn({"primary": {"model": "m"}}), "policy must be a fallgate Policy"),
        (lambda: _started().feed("success"), "feed takes the attempt's Outcome"),
        (lambda: _started().feed(None), r"feed takes the attempt's Outcome .*, got NoneType"),
        (lambda: run(chain("m"), _async_call), "call is a coroutine function"),
    ],
    ids=["run-a-dict", "turn-a-dict", "feed-a-string", "feed-none", "run-an-async-call"],
)
def test_a_caller_mistake_is_a_type_error_that_says_what_to_give(mistake, says):
    with pytest.raises(TypeError, match=says):
        mistake()


def _started() -> Turn:
    turn = Turn(chain("m"), health=HealthStore())
    turn.start()
    return turn


async def _async_call(target, credential):
    return "answer"


def test_time_a_slow_hook_spends_is_the_turns_and_no_attempt_goes_out_past_the_deadline():
    """A hook that takes 1 s per transition (on the turn's clock), a 1.5 s deadline: the
    first attempt goes out 1 s after the turn decided it, with the 0.5 s the deadline
    leaves as its timeout, not the whole of it; the fallback, decided at 1 s and handed
    over at 2 s, is not made (before, it went out past the deadline)."""
    clock = VirtualClock()
    handed: list[tuple[str, float, float]] = []

    def attempt(a: Attempt) -> Any:
        handed.append((a.target.model, a.timeout, clock.now()))
        raise Status(503)

    policy = chain("m0", "m1", max_attempts=1, deadline=1.5)
    with pytest.raises(TurnFailed) as failed:
        drive(policy, attempt, clock=clock, on_transition=lambda ev: clock.advance(1.0))
    assert [(m, round(t, 6)) for m, t, _ in handed] == [("m0", 0.5)]
    assert "went before the attempt could go out" in str(failed.value)
