"""What OpenTelemetry costs a turn, counted (never timed): the SDK calls its telemetry
makes and the Python calls fallgate's own telemetry code makes around them.

The turns are regression scenario 1's on the pure core (two timeouts, a rebuild, a 429,
the fallback: 4 attempts, a wait, a rebuild, 7 transitions) and a one-attempt turn, fed
scripted outcomes on a virtual clock. What users get is `tests/test_otel.py`'s; here
the work behind it is bounded: one SDK span per turn, attempt, wait and rebuild, one
event per transition, each span's attributes given at its start and at most once more
at its end, and a bounded number of Python calls of fallgate's own per turn (`python -m
bench --only otel` measures the CPU that follows: fallgate's part over the same SDK
calls made without it).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
from fallgate.fsm import Outcome, OutcomeKind, Policy, Target, Turn, VirtualClock
from fallgate.fsm.health.store import HealthStore
from fallgate.fsm.host.loop import host_loop
from fallgate.fsm.policy.model import Credential
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

import fallgate

#: Python calls of fallgate's telemetry (fsm/telemetry) per turn, over the SDK's own:
#: scenario 1's turn made 85 and a one-attempt turn 28 while each attempt's span was made
#: current by a context manager and its target's attributes were built anew each time.
SCENARIO_1_CALLS = 75
ONE_ATTEMPT_CALLS = 25

SCENARIO_1 = (
    Outcome(OutcomeKind.TRANSPORT, detail="timeout: Timeout"),
    Outcome(OutcomeKind.TRANSPORT, detail="timeout: Timeout"),
    Outcome(OutcomeKind.RATE_LIMITED, status=429, detail="Rate limit reached"),
    Outcome(OutcomeKind.SUCCESS, value="ok"),
)
ONE_ATTEMPT = (Outcome(OutcomeKind.SUCCESS, value="ok"),)


def policy() -> Policy:
    url = "http://127.0.0.1:9/v1"
    return Policy(
        targets=[
            Target("zai", "glm-5.1", url, credentials=[Credential.literal("a")]),
            Target("zai", "glm-4.7", url, credentials=[Credential.literal("b")]),
        ],
        max_attempts=2,
    )


def turn(p: Policy, outcomes: tuple[Outcome, ...]) -> None:
    """One turn on the host loop, attempt k coming to `outcomes[k]`."""
    t = Turn(p, health=HealthStore(), clock=VirtualClock())
    next(host_loop(t, clock=VirtualClock(), attempt=lambda a: outcomes[a.number - 1]))


@pytest.fixture
def sdk() -> Iterator[None]:
    tracer, meter = TracerProvider(), MeterProvider(metric_readers=[InMemoryMetricReader()])
    fallgate.enable_otel(tracer_provider=tracer, meter_provider=meter)
    try:
        yield
    finally:
        fallgate.disable_otel()
        tracer.shutdown()
        meter.shutdown()


def telemetry_calls(p: Policy, outcomes: tuple[Outcome, ...]) -> Counter[str]:
    """Python calls per function of fallgate's telemetry in one turn (after warm turns)."""
    for _ in range(3):
        turn(p, outcomes)
    calls: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and "/fsm/telemetry/" in frame.f_code.co_filename.replace("\\", "/"):
            calls[frame.f_code.co_name] += 1

    sys.setprofile(profile)
    try:
        turn(p, outcomes)
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.usefixtures("sdk")
@pytest.mark.parametrize(
    ("outcomes", "budget"), [(SCENARIO_1, SCENARIO_1_CALLS), (ONE_ATTEMPT, ONE_ATTEMPT_CALLS)]
)
def test_fallgates_own_telemetry_makes_a_bounded_number_of_python_calls_per_turn(
    outcomes: tuple[Outcome, ...], budget: int
) -> None:
    calls = telemetry_calls(policy(), outcomes)
    assert calls["_forward"] >= len(outcomes)  # the count saw the observed turn
    assert sum(calls.values()) <= budget, f"{sum(calls.values())} calls (budget {budget}): {calls}"


class _Recorder:
    """A tracer provider that notes every SDK call telemetry makes on spans."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.per_span: Counter[tuple[int, str]] = Counter()
        self.spans = 0

    def get_tracer(self, *args: Any, **kwargs: Any) -> _Recorder:
        return self

    def start_span(self, name: str, *args: Any, **kwargs: Any) -> _Span:
        self.calls["start_span"] += 1
        self.spans += 1
        return _Span(self, self.spans)


class _Span(trace.NonRecordingSpan):
    def __init__(self, rec: _Recorder, n: int) -> None:
        super().__init__(trace.INVALID_SPAN_CONTEXT)
        self.rec, self.n = rec, n

    def _note(self, what: str) -> None:
        self.rec.calls[what] += 1
        self.rec.per_span[(self.n, what)] += 1

    def is_recording(self) -> bool:
        return True

    def add_event(self, *args: Any, **kwargs: Any) -> None:
        self._note("add_event")

    def set_attributes(self, *args: Any) -> None:
        self._note("set_attributes")

    def set_attribute(self, *args: Any) -> None:
        self._note("set_attribute")

    def set_status(self, *args: Any, **kwargs: Any) -> None:
        self._note("set_status")

    def end(self, *args: Any) -> None:
        self._note("end")


def test_one_sdk_span_per_turn_attempt_wait_and_rebuild_one_event_per_transition() -> None:
    rec = _Recorder()
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()])
    fallgate.enable_otel(tracer_provider=rec, meter_provider=meter)
    try:
        turn(policy(), SCENARIO_1)
    finally:
        fallgate.disable_otel()
        meter.shutdown()
    transitions = 7  # start, transport, waited, transport, rebuilt, rate_limited, success
    assert rec.calls["start_span"] == 1 + 4 + 1 + 1  # the turn, 4 attempts, a wait, a rebuild
    assert rec.calls["end"] == rec.calls["start_span"]
    assert rec.calls["add_event"] == transitions
    assert rec.calls["set_status"] == 3  # the three failed attempts
    # attributes go in at a span's start, and once more at most when it ends
    assert all(n == 1 for (_, what), n in rec.per_span.items() if what != "add_event")
