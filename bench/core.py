"""Core overhead: µs per turn of the pure core beside tenacity and a bare loop.

Every system makes the same attempts against the same script and none of them
really waits: fallgate's core runs on its host loop (`fsm.host_loop`) fed
scripted outcomes, on a virtual clock (waits advance it); `fsm.run` gets the
same virtual clock; tenacity's `sleep` is a no-op, the hand-written loop calls
the same no-op. The faulty turn is regression scenario 1's (docs/design.md):
timeout, timeout, transport recovery, 429, fallback, success (4 attempts).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import random
from collections.abc import Callable
from typing import Any

import tenacity
from fallgate.fsm import HealthStore, Outcome, OutcomeKind, Policy, Target, Turn, VirtualClock, run
from fallgate.fsm.core.actions import Attempt, Finish
from fallgate.fsm.core.turn import TransitionsTurn
from fallgate.fsm.host.loop import host_loop
from fallgate.fsm.policy.model import Credential

from .timing import best_of


class Timeout(TimeoutError):
    """What a client timeout looks like to a retry library."""


class RateLimited(Exception):
    """A 429 as SDKs raise it: the status travels on the exception."""

    status_code = 429
    headers = None
    body = '{"error": {"message": "Rate limit reached", "type": "requests"}}'


def bench_policy() -> Policy:
    """Regression scenario 1's chain: glm-5.1 -> glm-4.7, two attempts per target."""
    return Policy(
        targets=[
            Target(
                "zai", "glm-5.1", "http://127.0.0.1:9/v1", credentials=[Credential.literal("sk-a")]
            ),
            Target(
                "zai", "glm-4.7", "http://127.0.0.1:9/v1", credentials=[Credential.literal("sk-b")]
            ),
        ],
        max_attempts=2,
    )


FAULT_SCRIPT: tuple[type[BaseException] | None, ...] = (Timeout, Timeout, RateLimited, None)
FAULT_OUTCOMES = (
    Outcome(OutcomeKind.TRANSPORT, detail="timeout: Timeout"),
    Outcome(OutcomeKind.TRANSPORT, detail="timeout: Timeout"),
    Outcome(OutcomeKind.RATE_LIMITED, status=429, detail="Rate limit reached"),
    Outcome(OutcomeKind.SUCCESS, value="ok"),
)
HAPPY_OUTCOMES = (Outcome(OutcomeKind.SUCCESS, value="ok"),)


def _script(outcomes: tuple[Outcome, ...]) -> Callable[[Attempt], Outcome]:
    """The remote side for the pure core: attempt k of a turn comes to `outcomes[k]`."""
    return lambda a: outcomes[a.number - 1]


FAULT_SCRIPT_CORE = _script(FAULT_OUTCOMES)
HAPPY_SCRIPT_CORE = _script(HAPPY_OUTCOMES)


class Script:
    """The remote side: attempt k raises `steps[k]` (None answers "ok")."""

    __slots__ = ("i", "steps")

    def __init__(self, steps: tuple[type[BaseException] | None, ...]) -> None:
        self.steps = steps
        self.i = 0

    def reset(self) -> None:
        self.i = 0

    def __call__(self, *_: object) -> str:
        exc = self.steps[self.i]
        self.i += 1
        if exc is not None:
            raise exc()
        return "ok"


def _nosleep(_: float) -> None:
    return None


def _drive_core(
    engine: type[Any],
    policy: Policy,
    attempt: Callable[[Attempt], Outcome],
    health: HealthStore | None,
    clock: VirtualClock,
) -> Any:
    """One turn of the sans-IO core on fallgate's host loop, as a user with their own
    transport runs it: each attempt's outcome comes from the script."""
    turn = engine(
        policy,
        health=health if health is not None else HealthStore(),
        clock=clock.now,
        random=random.random,
    )
    end = next(host_loop(turn, clock=clock, attempt=attempt))
    if type(end) is not Finish:
        raise RuntimeError(f"benchmark turn failed: {end}")
    return turn


def _bare_loop(
    call: Callable[[str], str],
    targets: tuple[str, ...],
    max_attempts: int = 2,
    faults_before_recovery: int = 2,
) -> str:
    """What people write by hand: retry timeouts with backoff, rebuild once, fall back."""
    last: BaseException | None = None
    for target in targets:
        attempts = streak = 0
        recovered = False
        while True:
            attempts += 1
            try:
                return call(target)
            except TimeoutError as e:
                last = e
                streak += 1
                if not recovered and streak < faults_before_recovery and attempts < max_attempts:
                    _nosleep(min(8.0, 0.5 * 2.0 ** (streak - 1)) * random.random())
                    continue
                if not recovered:
                    recovered, streak = True, 0  # rebuild the client here
                    continue
                break
            except RateLimited as e:
                last = e
                if attempts < max_attempts:
                    _nosleep(min(8.0, 0.5 * 2.0 ** (attempts - 1)) * random.random())
                    continue
                break
    raise RuntimeError("all targets failed") from last


def systems(
    policy: Policy | None = None,
) -> tuple[dict[str, Callable[[], object]], Callable[[], None]]:
    """name -> one turn; plus a check that every system took the expected path."""
    policy = policy or bench_policy()
    shared = HealthStore()
    clock = VirtualClock()
    fault, happy = Script(FAULT_SCRIPT), Script((None,))
    retry_cfg = dict(
        retry=tenacity.retry_if_exception_type((Timeout, RateLimited)),
        stop=tenacity.stop_after_attempt(5),
        wait=tenacity.wait_random_exponential(multiplier=0.5, max=8),
        sleep=_nosleep,
        reraise=True,
    )

    @tenacity.retry(**retry_cfg)  # type: ignore[call-overload]
    def tenacity_fault() -> str:
        return fault()

    @tenacity.retry(**retry_cfg)  # type: ignore[call-overload]
    def tenacity_happy() -> str:
        return happy()

    targets = (policy.targets[0].model, policy.targets[1].model)

    def reset_then(script: Script, f: Callable[[], object]) -> Callable[[], object]:
        def one() -> object:
            script.i = 0
            return f()

        return one

    out: dict[str, Callable[[], object]] = {
        "fallgate_happy": lambda: _drive_core(Turn, policy, HAPPY_SCRIPT_CORE, shared, clock),
        "tenacity_happy": reset_then(happy, tenacity_happy),
        "bare_loop_happy": reset_then(happy, lambda: _bare_loop(happy, targets)),
        "fallgate_run_happy": reset_then(
            happy, lambda: run(policy, happy, health=shared, clock=clock)
        ),
        "transitions_happy": lambda: _drive_core(
            TransitionsTurn, policy, HAPPY_SCRIPT_CORE, shared, clock
        ),
        "fallgate_fault": lambda: _drive_core(Turn, policy, FAULT_SCRIPT_CORE, None, clock),
        "tenacity_fault": reset_then(fault, tenacity_fault),
        "bare_loop_fault": reset_then(fault, lambda: _bare_loop(fault, targets)),
        "fallgate_run_fault": reset_then(
            fault, lambda: run(policy, fault, health=HealthStore(), clock=clock)
        ),
        "transitions_fault": lambda: _drive_core(
            TransitionsTurn, policy, FAULT_SCRIPT_CORE, None, clock
        ),
    }

    def check() -> None:
        for name in ("fallgate_fault", "transitions_fault"):
            turn = out[name]()
            models = [e.model for e in turn.trace if e.action == "Attempt"]  # type: ignore[attr-defined]
            assert models == ["glm-5.1"] * 3 + ["glm-4.7"], (name, models)
        res = out["fallgate_run_fault"]()
        assert res.model == "glm-4.7" and res.attempts == 4, res  # type: ignore[attr-defined]
        for name in ("tenacity_fault", "bare_loop_fault"):
            out[name]()
            assert fault.i == 4, (name, fault.i)
        for name in ("fallgate_happy", "transitions_happy"):
            assert out[name]().attempts == 1  # type: ignore[attr-defined]
        for name in ("tenacity_happy", "bare_loop_happy", "fallgate_run_happy"):
            out[name]()
            assert happy.i == 1, name

    return out, check


def measure(
    number: int = 300, rounds: int = 40, per_round: dict[str, list[float]] | None = None
) -> dict[str, float]:
    """µs per turn for every system (best round, interleaved). Many short rounds:
    on a shared machine the best of them finds the quiet moments for every system."""
    fns, check = systems()
    check()
    return best_of(fns, number=number, rounds=rounds, per_round=per_round)


def profile(which: str = "fallgate_fault", turns: int = 20000, top: int = 25) -> str:
    """cProfile of one system; the top functions by own time."""
    fns, check = systems()
    check()
    f = fns[which]
    for _ in range(200):
        f()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(turns):
        f()
    prof.disable()
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(top)
    return buf.getvalue()
