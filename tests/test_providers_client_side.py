"""What the adapter marks as a client-side fault (`Outcome.client_side`).

A transport fault is the target's unless the client knows better: the pool saw the
target answer other attempts while this one was out, the attempt's time ran out
before its first network operation (a thousand turns on one busy event loop: the
target never saw the request), or the timer that ended it fired long after it was
due (the process was starved: the reply may have sat unread in the socket). Anything
else, and any other kind, is left as it was.

Before the last rule, a client whose CPU was saturated (1,000 turns on one loop with
CPU hogs beside it: the loop lagged 10-30 s) saw every connect time out with its
timer fired late, read that as a target that is down, and the retry budget and the
breaker stopped the retries: fallgate answered 0-9 of 1,000 where the bare SDK
answered 19-133 (`python -m bench --only overload` with 3 CPU burners).
"""

from __future__ import annotations

import asyncio
import time
import types

import openai
import pytest
from fallgate.fsm import HealthStore, OutcomeKind
from fallgate.fsm.health import records as fleet
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.openai.exceptions import classifier_for
from fallgate.providers.openai.http.bounds import (
    STARVED_AFTER,
    STARVED_SHARE,
    AttemptBound,
    AttemptTimeout,
    _limit,
    _Stream,
    bounded,
    starved,
)
from fallgate.providers.openai.http.transport import http as httpx
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

_CORE = types.SimpleNamespace(ConnectTimeout=TimeoutError, ReadTimeout=TimeoutError)
MSG = [{"role": "user", "content": "hi"}]


def test_a_bound_that_ran_out_before_the_first_network_operation_says_so():
    bound = AttemptBound(0.01, 1024)
    time.sleep(0.02)  # the client was busy: the connect never started
    with pytest.raises(TimeoutError):
        _limit(bound, None, _CORE, "ConnectTimeout")
    err = bound.error()
    assert isinstance(err, AttemptTimeout) and err.unsent
    assert "before it reached the network" in str(err)


def test_a_bound_that_ran_out_after_a_network_operation_does_not():
    bound = AttemptBound(0.05, 1024)
    _limit(bound, None, _CORE, "ConnectTimeout")  # the connect started in time
    time.sleep(0.06)
    with pytest.raises(TimeoutError):
        _limit(bound, None, _CORE, "ReadTimeout")
    err = bound.error()
    assert isinstance(err, AttemptTimeout) and not err.unsent


def _status_error(status: int) -> openai.APIStatusError:
    req = httpx.Request("POST", "https://p0.test/v1/chat/completions")
    resp = httpx.Response(status, request=req, json={"error": {"message": "busy"}})
    return openai.APIStatusError("busy", response=resp, body=None)


@pytest.mark.parametrize(
    ("error", "answered", "client_side"),
    [
        (AttemptTimeout("attempt exceeded its 4 s total time bound", unsent=True), False, True),
        (AttemptTimeout("the connect timer (4 s) fired 9 s late", starved=True), False, True),
        (AttemptTimeout("attempt exceeded its 4 s total time bound"), False, False),
        (AttemptTimeout("attempt exceeded its 4 s total time bound"), True, True),
        (openai.APIConnectionError(request=httpx.Request("POST", "https://p0.test")), True, True),
        (_status_error(503), True, False),  # the server itself said no: the target's
    ],
)
def test_the_classifier_marks_transport_faults_the_client_knows_are_its_own(
    error, answered, client_side
):
    policy = chain("m0")
    target = policy.targets[0]
    classify = classifier_for(policy, lambda: target, lambda t: answered)
    o = classify(error)
    assert o.client_side is client_side, o
    if client_side:
        assert o.kind is OutcomeKind.TRANSPORT


@pytest.mark.parametrize(
    ("late", "length", "verdict"),
    [
        (0.02, 4.0, False),  # ordinary scheduling noise
        (0.5, 4.0, False),  # an eighth of the timer: a busy machine, still the target's
        (1.5, 4.0, True),  # more than a quarter of it: the process did not run
        (0.09, 0.1, False),  # under asyncio's slow-callback threshold however short
        (0.2, 0.1, True),
        (30.0, 4.0, True),  # a saturated loop (the overload bench's p50 was 10-20 s)
    ],
)
def test_a_timer_is_starved_when_it_fired_late_by_a_quarter_of_its_length_and_over_0_1_s(
    late, length, verdict
):
    assert (STARVED_AFTER, STARVED_SHARE) == (0.1, 0.25)
    assert starved(late, length) is verdict


def test_a_bound_notes_a_timer_that_fired_late_and_not_one_that_fired_on_time():
    bound = AttemptBound(5.0, 1024)
    t = _limit(bound, 0.05, _CORE, "ReadTimeout")
    due = bound.due
    time.sleep(0.06)  # the timer fired about on time (a few ms late)
    bound.fired("read timer", t, due)
    assert bound.late == 0.0
    t = _limit(bound, 0.05, _CORE, "ReadTimeout")
    due = bound.due
    time.sleep(0.3)  # the process was kept from running: seen 0.25 s after it was due
    bound.fired("read timer", t, due)
    assert bound.late >= 0.25
    err = bound.error()
    assert isinstance(err, AttemptTimeout) and err.starved and err.client_side
    assert "read timer fired 0." in str(err) and "starved" in str(err)


def test_a_deadline_noticed_long_after_it_passed_between_network_operations_is_starved():
    """The connect went out in time (so not `unsent`), then the process did not run
    until long past the deadline: nothing was waiting on the target when it passed."""
    bound = AttemptBound(0.05, 1024)
    _limit(bound, None, _CORE, "ConnectTimeout")
    time.sleep(0.3)
    with pytest.raises(TimeoutError):
        _limit(bound, None, _CORE, "ReadTimeout")
    err = bound.error()
    assert isinstance(err, AttemptTimeout) and not err.unsent and err.starved


class _LateStream:
    """A network stream whose read times out, but whose thread gets to run again only
    `late` seconds after the timeout was due (another thread held the interpreter)."""

    def __init__(self, late: float) -> None:
        self.late = late

    def get_extra_info(self, info: str) -> None:
        return None

    def close(self) -> None:
        pass

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        time.sleep((timeout or 0.0) + self.late)
        raise _CORE.ReadTimeout("timed out")


@pytest.mark.parametrize(("late", "client_side"), [(0.0, False), (0.4, True)])
def test_a_sync_read_that_timed_out_is_client_side_only_when_its_thread_ran_late(late, client_side):
    """The threaded driver's wrappers measure the same way as the asyncio ones."""
    stream = _Stream(_LateStream(late), _CORE)
    bound = AttemptBound(0.1, 1024)
    policy = chain("m0")
    classify = classifier_for(policy, lambda: policy.targets[0])
    with pytest.raises(Exception) as caught:
        with bounded(bound):
            stream.read(1024, 0.1)
    assert classify(caught.value).client_side is client_side, caught.value


def _drained(policy) -> HealthStore:
    """A health store where earlier retries used the target's whole retry budget."""
    health = HealthStore()
    for _ in range(int(policy.retry_budget.size)):
        health._apply(policy.targets[0].key, lambda r, t: fleet.spend(r, policy), 0.0)
    return health


def test_a_timeout_that_fired_late_because_the_event_loop_was_blocked_is_the_clients(
    fault_server: FaultServer,
):
    """The target holds the first request; while the attempt waits for the reply (its
    0.5 s timer armed), something on the event loop blocks it for 1.5 s: the timer
    fires a second late. Nobody else was answered meanwhile and the request reached
    the network, so only the late timer tells this apart from a target that is down:
    the fault is client-side, so the turn backs off and retries without a retry token
    (the budget is empty) or a breaker report, and the retry is answered. On the engine
    before this rule the turn failed: "no retry: the retry budget of primary is empty"."""
    fault_server.script({"models": {"a": [{"kind": "timeout", "seconds": 5}, {"kind": "answer"}]}})
    policy = chain("a", server=fault_server, attempt_timeout=0.5)
    health = _drained(policy)
    key = policy.targets[0].key

    async def main() -> list:
        async with AsyncFallgate(policy, health=health) as gate:
            turn = asyncio.ensure_future(gate.arun(messages=MSG))
            while not fault_server.requests:  # the request is in: the server holds it
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # the client is waiting for the reply
            time.sleep(1.5)  # blocks the event loop (a burst of CPU work on it)
            result = await turn
            return list(result.trace)

    trace = asyncio.run(main())
    assert [(e.event, e.action) for e in trace] == [
        ("start", "Attempt"),
        ("transport", "Wait"),
        ("waited", "Attempt"),
        ("success", "Finish"),
    ]
    assert "timer fired 1" in trace[1].detail and "s late" in trace[1].detail
    assert "fails" not in health.record(key) and health.target_until(key) == 0.0


def test_a_timeout_that_fired_on_time_is_still_the_targets(fault_server: FaultServer):
    """The same turn with the loop free: the timer fires on time, the target held the
    request past it, and with the budget empty there is no retry: the refusal trips the
    breaker (the target's fault, no fallback), the turn waits for its verdict and makes
    a first attempt, the probe, which the target answers. The budget stays empty."""
    fault_server.script({"models": {"a": [{"kind": "timeout", "seconds": 5}, {"kind": "answer"}]}})
    policy = chain("a", server=fault_server, attempt_timeout=0.5, cooldown={"initial": 0.2})
    health = _drained(policy)
    with Fallgate(policy, health=health) as gate:
        result = gate.run(messages=MSG)
    trace = list(result.trace)
    assert [(e.event, e.action) for e in trace] == [
        ("start", "Attempt"),
        ("transport", "Wait"),
        ("waited", "Attempt"),
        ("success", "Finish"),
    ]
    assert trace[1].dest == "primary_cooling" and "late" not in trace[1].detail
    assert len(fault_server.requests) == 2
    assert health.retry_tokens(policy.targets[0].key, policy) < 1.0  # no token spent


def test_a_timeout_on_time_while_the_process_starved_meanwhile_is_the_clients_too():
    """Attempt A's timer fires on time, but while A was out another attempt's timer
    fired long past its due time: the process starved while A was out, and each of
    A's steps waited on it too (on a saturated loop no single timer need be very late
    for an attempt of many steps to run out). An attempt that began after it is not."""
    a = AttemptBound(5.0, 1024)
    b = AttemptBound(0.05, 1024)
    time.sleep(0.3)
    b.fired("read timer", 0.05, b.started + 0.05)  # 0.25 s late: starved
    assert b.starved()
    a.fired("connect timer", 5.0, time.monotonic())  # on time
    assert a.starved() and "starved" in str(a.error())
    c = AttemptBound(5.0, 1024)  # began after the starvation
    c.fired("connect timer", 5.0, time.monotonic())
    assert not c.starved()
