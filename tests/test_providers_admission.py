"""The adaptive limit on attempts in flight (`providers.openai.http.admission`).

A starved client (timers firing late) halves the attempts it lets out at once, each
success raises the limit by one, and once it no longer binds it is lifted. Attempts
over the limit wait for a slot, oldest first, within the turn's deadline, and their
time bound starts when the slot comes. Before it, 1,000 concurrent turns on a
saturated client all went out at once, every loop iteration took seconds, nearly
every connect timed out unobserved and fallgate answered 0-132 of 1,000 where the bare
SDK answered 4-372 (`python -m bench --only overload` beside CPU burners); with it,
895-1000 where the SDK answered 4-981 at the same moments (`python -m bench --only
overload`, as the machine was, beside CPU burners, and saturated on one CPU).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
from fallgate.providers import AsyncFallgate, Fallgate
from fallgate.providers.openai.http.admission import MIN_LIMIT, Admission, AsyncAdmission, _Limit
from fallgate.providers.openai.http.bounds import AttemptBound, AttemptTimeout
from fallgate.providers.testing.fault_server import FaultServer

from helpers import chain

MSG = [{"role": "user", "content": "hi"}]


def _in_flight(limit: _Limit, n: int) -> None:
    for _ in range(n):
        limit.take()


def test_a_limit_is_not_engaged_until_a_timer_fires_late():
    lim = _Limit()
    _in_flight(lim, 500)
    lim.give(ok=False, late=0.05)  # a timeout on time: the target's business
    lim.give(ok=True, late=0.0)
    assert lim.limit == math.inf and lim.cuts == 0


def test_a_late_timer_halves_what_is_in_flight_once_per_lateness():
    lim = _Limit()
    _in_flight(lim, 400)
    lim.give(ok=False, late=2.0)  # the process is 2 s behind
    assert lim.limit == 200 and lim.cuts == 1
    for _ in range(100):  # the others in flight saw the same starvation: one cut for all
        lim.give(ok=False, late=2.0)
    assert lim.limit == 200 and lim.cuts == 1
    lim._quiet_until = 0.0  # 2 s later
    lim.give(ok=False, late=2.0)
    assert lim.limit == 100 and lim.cuts == 2


def test_the_limit_never_goes_below_its_floor():
    lim = _Limit()
    _in_flight(lim, 3)
    lim.give(ok=False, late=1.0)
    assert lim.limit == MIN_LIMIT


def test_successes_raise_the_limit_by_one_until_it_no_longer_binds_and_is_lifted():
    lim = _Limit()
    _in_flight(lim, 40)
    lim.give(ok=False, late=1.0)
    assert lim.limit == 20
    for _ in range(20):
        lim.take()
        lim.give(ok=True, late=0.0)
    assert lim.limit == 40
    lim.take()
    lim.give(ok=True, late=0.0)  # past the most it ever had in flight (40): lifted
    assert lim.limit == math.inf


def test_async_attempts_over_the_limit_wait_their_turn_oldest_first():
    async def main() -> list[int]:
        adm = AsyncAdmission()
        adm._state.limit = 2
        order: list[int] = []
        bounds = [AttemptBound(5.0, 1024) for _ in range(5)]
        assert adm.admit_now() and adm.admit_now()
        assert not adm.admit_now()

        async def waiter(i: int) -> None:
            await adm.admit(bounds[i], 10.0)
            order.append(i)

        tasks = [asyncio.ensure_future(waiter(i)) for i in (2, 3, 4)]
        await asyncio.sleep(0.2)
        assert order == []  # two in flight: the others wait
        adm.release(False, 0.0)  # (a success would raise the limit)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert order == [2]
        adm.release(False, 0.0)
        adm.release(False, 0.0)
        await asyncio.gather(*tasks)
        # the waiters' bounds started when their slot came, not when they asked
        assert bounds[2].left() > 4.7
        return order

    assert asyncio.run(main()) == [2, 3, 4]


def test_an_attempt_that_gets_no_slot_before_the_deadline_was_never_sent():
    async def main() -> None:
        adm = AsyncAdmission()
        adm._state.limit = 1
        assert adm.admit_now()
        with pytest.raises(AttemptTimeout) as caught:
            await adm.admit(AttemptBound(5.0, 1024), 0.1)
        assert caught.value.unsent and caught.value.client_side
        assert "before the turn's deadline" in str(caught.value)
        assert not adm._waiters

    asyncio.run(main())


def test_threaded_attempts_over_the_limit_wait_for_a_slot():
    adm = Admission()
    adm._state.limit = 1
    adm.admit(AttemptBound(5.0, 1024), 10.0)
    got: list[float] = []

    def second() -> None:
        t = time.monotonic()
        adm.admit(AttemptBound(5.0, 1024), 10.0)
        got.append(time.monotonic() - t)

    th = threading.Thread(target=second)
    th.start()
    time.sleep(0.2)
    assert got == []
    adm.release(False, 0.0)
    th.join(5)
    assert got and got[0] >= 0.15
    with pytest.raises(AttemptTimeout) as caught:
        adm.admit(AttemptBound(5.0, 1024), 0.05)
    assert caught.value.unsent


def test_a_threaded_slot_held_for_a_block_counts_as_answered_only_when_the_block_ends_well():
    """`Admission.admitted` (the sync client's slot): released when the block ends, and
    an attempt that raised never raises the limit; one that got no slot holds none."""
    adm = Admission()
    adm._state.limit, adm._state.peak = 10, 20  # engaged
    with adm.admitted(AttemptBound(5.0, 1024), 10.0):
        assert adm._state.in_flight == 1
    assert (adm._state.in_flight, adm.limit) == (0, 11)  # answered: one more
    with pytest.raises(RuntimeError), adm.admitted(AttemptBound(5.0, 1024), 10.0):
        raise RuntimeError("connection reset")
    assert (adm._state.in_flight, adm.limit) == (0, 11)  # not answered: no rise
    adm._state.limit = 1
    adm.admit(AttemptBound(5.0, 1024), 10.0)
    with pytest.raises(AttemptTimeout), adm.admitted(AttemptBound(5.0, 1024), 0.05):
        pytest.fail("admitted without a slot")
    assert adm._state.in_flight == 1  # the slot of the first only


def test_a_blocked_event_loop_engages_the_limit_and_every_turn_is_still_answered(
    fault_server: FaultServer,
):
    """40 turns wait on replies the server holds for 3 s (attempt timeout 0.5 s) when
    something blocks the event loop for 1.5 s: their timers fire a second late, the
    wrapper cuts its limit to half of what was in flight (20), the retries do not all
    go out at once and all of them are answered; the limit grows back by one per
    success, and past the most it had in flight it is lifted."""
    turns = 40
    fault_server.script(
        {
            "models": {
                "a": [{"kind": "timeout", "seconds": 3}] * turns + [{"kind": "answer"}] * turns
            }
        }
    )
    # exact waits: the 40 retries all go at once, so the limit is what holds them back
    policy = chain("a", server=fault_server, attempt_timeout=0.5, backoff={"jitter": False})

    class Recording(_Limit):
        most_after_cut = 0

        def take(self) -> None:
            super().take()
            assert self.in_flight <= self.limit
            if self.cuts:
                self.most_after_cut = max(self.most_after_cut, self.in_flight)

    state = Recording()

    async def main() -> tuple[list[str], int, float]:
        async with AsyncFallgate(policy) as gate:
            gate._admission._state = state
            calls = [asyncio.ensure_future(gate.arun(messages=MSG)) for _ in range(turns)]
            while len(fault_server.requests) < turns:
                await asyncio.sleep(0.01)
            time.sleep(1.5)  # blocks the event loop
            results = await asyncio.gather(*calls)
            adm = gate._admission
            return [r.model for r in results], adm.cuts, adm.limit

    models, cuts, limit = asyncio.run(main())
    assert models == ["a"] * turns
    assert cuts >= 1  # (a busy machine may starve the loop once more)
    # the 40 retries wanted out at once: at most 20 went, the others as slots came (a
    # success frees one and adds one)
    assert state.most_after_cut < turns
    assert limit == math.inf  # 20 successes later it no longer bound: lifted


def test_a_sync_client_shares_one_limit_across_its_threads(fault_server: FaultServer):
    policy = chain("a", server=fault_server)
    with Fallgate(policy) as gate:
        derived = gate.with_options(timeout=30)
        assert derived._admission is gate._admission
        gate.run(messages=MSG)
        assert gate._admission._state.in_flight == 0
