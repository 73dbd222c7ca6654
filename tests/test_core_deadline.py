"""The deadline is a hard stop, in the pure core: no attempt starts at or after it, no
wait is taken that would leave no time for the attempt after it, and every attempt's
timeout ends by it. A host that honours ``Attempt.timeout`` therefore ends every turn
by its deadline."""

from __future__ import annotations

from typing import Any

import pytest
from fallgate.fsm import HealthStore, Outcome, Turn, VirtualClock
from fallgate.fsm.core.actions import Attempt, Fail, Finish, Rebuild, Wait
from fallgate.fsm.host.loop import host_loop
from fallgate.fsm.kinds import OutcomeKind
from hypothesis import given
from hypothesis import strategies as st

from helpers import chain

FAULTS = [k for k in OutcomeKind if k not in (OutcomeKind.SUCCESS, OutcomeKind.CANCELLED)]


class Host:
    """A host that honours each attempt's timeout: an attempt lasts `seconds`, or is
    cut at its timeout, whichever comes first. Records when each attempt started."""

    def __init__(self, policy: Any, outcomes: list[Outcome], seconds: float) -> None:
        self.clock = VirtualClock(1000.0)
        self.turn = Turn(policy, health=HealthStore(), clock=self.clock.now, random=lambda: 1.0)
        self.outcomes = outcomes
        self.seconds = seconds
        self.starts: list[float] = []
        self.timeouts: list[float] = []

    def attempt(self, a: Attempt) -> Outcome:
        self.starts.append(self.clock.t - 1000.0)
        self.timeouts.append(a.timeout)
        self.clock.advance(min(self.seconds, a.timeout))
        if self.outcomes:
            return self.outcomes.pop(0)
        return Outcome(OutcomeKind.TRANSPORT, detail="cut at the attempt's timeout")

    def run(self) -> Fail | Finish | Any:
        return next(host_loop(self.turn, clock=self.clock, attempt=self.attempt))

    @property
    def elapsed(self) -> float:
        return self.clock.t - 1000.0


def test_after_the_deadline_no_fallback_rotation_or_recovery_starts_an_attempt():
    """The issue's case: deadline 1 s, 0.4 s attempts, three targets of two keys, every
    attempt timing out: the old core went on past the deadline with 1 ms attempts."""
    policy = chain("a", "b", "c", keys=2, attempt_timeout=0.4, deadline=1.0)
    host = Host(policy, [], seconds=0.4)
    end = host.run()
    assert isinstance(end, Fail)
    assert host.starts and all(s < 1.0 for s in host.starts), host.starts
    assert all(s + t <= 1.0 + 1e-9 for s, t in zip(host.starts, host.timeouts, strict=True))
    assert min(host.timeouts) > 0.05, f"a sliver of an attempt: {host.timeouts}"
    assert host.elapsed <= 1.0 + 1e-9
    err = end.error
    assert "the 1s deadline had passed" in str(err)
    # the time reserve: no retry whose worst case would leave a fallback no attempt, so
    # the silent targets are each asked once, in time
    assert [policy.targets[i].name for i in host.turn.s.tried] == [
        "primary",
        "fallback_1",
        "fallback_2",
    ]
    assert err.reasons["fallback_1"].startswith("attempted 1x"), err.reasons


def test_without_the_reserve_the_silent_primary_spends_the_deadline_alone():
    """The same chain with ``reserve = false``: the retries and the recovery on the
    primary eat the second the fallbacks needed (the behaviour the reserve ends)."""
    policy = chain("a", "b", "c", keys=2, attempt_timeout=0.4, deadline=1.0, reserve=False)
    host = Host(policy, [], seconds=0.4)
    end = host.run()
    assert isinstance(end, Fail)
    assert end.error.reasons["fallback_1"] == "not tried: the 1s deadline had passed"


def test_a_rate_limit_at_the_deadline_does_not_rotate_to_the_next_key():
    policy = chain("a", keys=2, attempt_timeout=5, deadline=5)
    host = Host(policy, [Outcome(OutcomeKind.RATE_LIMITED, status=429)], seconds=5)
    end = host.run()
    assert isinstance(end, Fail)
    assert len(host.starts) == 1, "rotated to the second key after the deadline"


def test_a_wait_that_would_end_at_the_deadline_is_not_taken():
    """Waiting out a Retry-After that ends exactly at the deadline leaves no time for
    the attempt after it: the turn fails now instead of sleeping, then failing."""
    policy = chain("a", attempt_timeout=5, deadline=10)
    ra = Outcome(OutcomeKind.RATE_LIMITED, status=429, retry_after=10.0)
    host = Host(policy, [ra, Outcome.success("late")], seconds=0.0)
    end = host.run()
    assert isinstance(end, Fail)
    assert host.starts == [0.0]
    assert not [e for e in host.turn.trace if e.action == "Wait"]


def test_a_wait_that_leaves_time_is_still_taken():
    policy = chain("a", attempt_timeout=5, deadline=10)
    ra = Outcome(OutcomeKind.RATE_LIMITED, status=429, retry_after=9.0)
    host = Host(policy, [ra, Outcome.success("in time")], seconds=0.0)
    end = host.run()
    assert isinstance(end, Finish) and end.result == "in time"
    assert host.starts[0] == 0.0 and 9.0 <= host.starts[1] < 10.0  # Retry-After (+ jitter)
    assert host.timeouts[1] == pytest.approx(10.0 - host.starts[1])  # what the deadline leaves


@given(
    n_targets=st.integers(1, 4),
    keys=st.integers(1, 3),
    deadline=st.floats(0.5, 30),
    attempt_timeout=st.floats(0.1, 20),
    seconds=st.floats(0.0, 20),
    kinds=st.lists(st.sampled_from(FAULTS), max_size=40),
    retry_after=st.one_of(st.none(), st.floats(0, 40)),
)
def test_a_host_that_honours_attempt_timeouts_ends_every_turn_by_its_deadline(
    n_targets, keys, deadline, attempt_timeout, seconds, kinds, retry_after
):
    """Property: whatever the outcomes, every attempt starts before the deadline and its
    timeout ends by it, so a turn whose host cuts each attempt at its timeout (and
    sleeps each wait exactly) ends by its deadline."""
    policy = chain(
        *[f"m{i}" for i in range(n_targets)],
        keys=keys,
        deadline=deadline,
        attempt_timeout=attempt_timeout,
    )
    outcomes = [
        Outcome(
            k,
            retry_after=retry_after if k is OutcomeKind.RATE_LIMITED else None,
            partial="p" if k is OutcomeKind.STREAM_INTERRUPTED else None,
        )
        for k in kinds
    ]
    host = Host(policy, outcomes, seconds)
    steps = host_loop(host.turn, clock=host.clock, attempt=host.attempt)
    end = next(steps)
    assert isinstance(end, Fail | Finish | Wait | Rebuild)
    for start, timeout in zip(host.starts, host.timeouts, strict=True):
        assert start < deadline
        assert 0 < timeout and start + timeout <= deadline + 1e-6
    assert host.elapsed <= deadline + 1e-6


class LateHost(Host):
    """A host whose waits and rebuilds overrun: each takes `overrun` seconds more."""

    def __init__(self, *args: Any, overrun: float, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.overrun = overrun
        self.rebuilds = 0

    def run(self) -> Any:
        turn, clock = self.turn, self.clock

        class Late(VirtualClock):
            def sleep(inner, seconds: float) -> None:
                clock.advance(seconds + self.overrun)

        late = Late(clock.t)

        def rebuild(target: Any) -> None:
            self.rebuilds += 1
            clock.advance(self.overrun)

        return next(host_loop(turn, clock=late, attempt=self.attempt, rebuild=rebuild))


def test_a_wait_that_overruns_the_deadline_ends_the_turn_without_another_attempt():
    """The host slept past the deadline (a late wake-up): no 1 ms attempt follows."""
    policy = chain("a", attempt_timeout=5, deadline=10)
    ra = Outcome(OutcomeKind.RATE_LIMITED, status=429, retry_after=8.0)
    host = LateHost(policy, [ra, Outcome.success("too late")], seconds=0.0, overrun=3.0)
    end = host.run()
    assert isinstance(end, Fail)
    assert host.starts == [0.0]
    assert str(end.error).startswith("turn failed: the 10s deadline passed before primary")
    assert host.turn.trace[-1].source == "primary_rate_limited"


def test_a_rebuild_that_overruns_the_deadline_ends_the_turn_without_another_attempt():
    policy = chain(
        "a", "b", attempt_timeout=4, deadline=10, backoff={"initial": 0.0}, reserve=False
    )
    host = LateHost(policy, [], seconds=4.0, overrun=5.0)
    end = host.run()
    assert isinstance(end, Fail)
    assert host.rebuilds == 1
    assert all(s < 10 for s in host.starts), host.starts
    assert "deadline passed before primary could be called" in str(end.error)
    assert end.error.reasons["fallback_1"] == "not tried: the 10s deadline had passed"
