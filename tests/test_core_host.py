"""The host loop (fsm.host.loop): the one place that carries out waits and rebuilds,
hands attempts out, and aborts a turn that is abandoned."""

from __future__ import annotations

import asyncio

from fallgate.fsm import HealthStore, Outcome, Policy, Turn, VirtualClock
from fallgate.fsm.core.actions import Action, Attempt, Fail, Finish
from fallgate.fsm.host.loop import ahost_loop, host_loop


class RecordingClock(VirtualClock):
    """A virtual clock that remembers what it was asked to sleep."""

    def __init__(self) -> None:
        super().__init__()
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        super().sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        super().sleep(seconds)


def two_targets() -> Policy:
    return Policy.from_dict(
        {
            "primary": {"provider": "openai", "model": "m0", "api_key": "sk-primary-0000"},
            "fallback_providers": [{"provider": "groq", "model": "m1", "api_key": "sk-fallback-1"}],
            "max_attempts": 3,
        }
    )


TRANSPORT = Outcome.of("transport")
OK = Outcome.success("hi")


def new_turn(clock: VirtualClock) -> Turn:
    return Turn(two_targets(), health=HealthStore(), clock=clock.now, random=lambda: 1.0)


def test_without_an_attempt_callable_the_loop_hands_out_attempts_and_does_the_rest():
    clock = RecordingClock()
    rebuilt: list[str] = []

    def rebuild(target):
        rebuilt.append(target.name)
        raise OSError("cannot build a client")

    turn = new_turn(clock)
    steps = host_loop(turn, clock=clock, rebuild=rebuild)
    handed: list[Action] = [next(steps)]
    for outcome in (TRANSPORT, TRANSPORT, OK):
        assert type(handed[-1]) is Attempt
        handed.append(steps.send(outcome))
    assert [a.target.model for a in handed if type(a) is Attempt] == ["m0", "m0", "m1"]
    assert type(handed[-1]) is Finish and handed[-1].result == "hi"
    assert len(clock.slept) == 1 and clock.slept[0] > 0  # the backoff, slept on the clock
    assert rebuilt == ["primary"]  # and its failure moved the turn on to the fallback
    assert any(e.event == "rebuild_failed" for e in turn.trace)


def test_a_zero_wait_is_not_slept():
    clock = RecordingClock()

    def transport_fault_once(a: Attempt) -> Outcome:
        return TRANSPORT if a.number == 1 else OK

    # the random source draws 0: a backoff of zero seconds
    turn = Turn(two_targets(), health=HealthStore(), clock=clock.now, random=lambda: 0.0)
    end = next(host_loop(turn, clock=clock, attempt=transport_fault_once))
    assert type(end) is Finish
    assert [e.wait for e in turn.trace if e.action == "Wait"] == [0.0]
    assert clock.slept == []


def test_closing_the_loop_while_an_attempt_is_out_aborts_the_turn():
    clock = RecordingClock()
    turn = new_turn(clock)
    steps = host_loop(turn, clock=clock)
    assert type(next(steps)) is Attempt
    steps.close()
    assert turn.state == "aborted"
    assert turn.trace[-1].dest == "aborted"


def test_the_async_loop_has_the_same_protocol():
    clock = RecordingClock()

    async def rebuild(target) -> None:
        return None

    async def main() -> tuple[list[Action], Turn, Turn]:
        turn = new_turn(clock)
        steps = ahost_loop(turn, clock=clock, rebuild=rebuild)
        handed: list[Action] = [await anext(steps)]
        for outcome in (TRANSPORT, TRANSPORT, TRANSPORT, Outcome.of("bad_request")):
            handed.append(await steps.asend(outcome))
        await steps.aclose()
        abandoned = new_turn(clock)
        steps = ahost_loop(abandoned, clock=clock)
        await anext(steps)
        await steps.aclose()
        return handed, turn, abandoned

    handed, turn, abandoned = asyncio.run(main())
    # retry, recover (the rebuild succeeds), fall back on the next fault; a 400 fails the turn
    assert [a.target.model for a in handed if type(a) is Attempt] == ["m0", "m0", "m0", "m1"]
    assert type(handed[-1]) is Fail and turn.state == "failed"
    assert len(clock.slept) == 1
    assert abandoned.state == "aborted"
