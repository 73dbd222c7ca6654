"""OpenTelemetry overhead: client CPU per turn with tracing and metrics on vs off.

Both in one process, rounds interleaved (off, on, then on, off, ...), CPU time
(`time.process_time`), best round of each; "on" is `fallgate.enable_otel()` with
the SDK's providers: a `TracerProvider` whose `SimpleSpanProcessor` hands every
span to an exporter that drops it, and a `MeterProvider` with an
`InMemoryMetricReader` (collected after each round, outside the timing).

- **http**: `fallgate.Fallgate` chat turns through the real openai SDK over
  loopback HTTP to a fast fault server in its own process (its CPU is not
  counted): one attempt per turn, as most turns are.
- **core**: regression scenario 1's faulty turn on the pure core (`bench.core`:
  the host loop fed scripted outcomes on a virtual clock): 4 attempts, a wait, a
  rebuild and 7 transitions in ~20 µs of engine work, the most telemetry per
  unit of work there is.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

from fallgate.fsm import Policy, Target, Turn, VirtualClock

import fallgate

from .core import FAULT_SCRIPT_CORE, _drive_core, bench_policy
from .scenarios import PRIMARY
from .throughput import server_process

MESSAGES = [{"role": "user", "content": "Say hi."}]


def _providers() -> tuple[Any, Any, Any]:
    """SDK tracer and meter providers that keep nothing: (tracer, meter, reader)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):  # type: ignore[misc]
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(Drop()))
    reader = InMemoryMetricReader()
    return tracer, MeterProvider(metric_readers=[reader]), reader


def _cpu_rounds(
    turn: Callable[[], object], number: int, rounds: int, on: Callable[[bool], None]
) -> dict[str, float]:
    """Best CPU seconds per turn, off and on, over interleaved rounds."""
    best = {"off": float("inf"), "on": float("inf")}
    for mode in ("off", "on"):  # warm both paths
        on(mode == "on")
        for _ in range(max(3, number // 10)):
            turn()
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                on(mode == "on")
                t0 = time.process_time()
                for _ in range(number):
                    turn()
                dt = (time.process_time() - t0) / number
                best[mode] = min(best[mode], dt)
                on(False)
                gc.collect()
    finally:
        if was:
            gc.enable()
        fallgate.disable_otel()
    return best


def measure(quick: bool = False, log: Any = None) -> dict[str, Any]:
    tracer, meter, reader = _providers()

    def switch(enabled: bool) -> None:
        if enabled:
            fallgate.enable_otel(tracer_provider=tracer, meter_provider=meter)
        else:
            fallgate.disable_otel()
            reader.get_metrics_data()  # collect (and forget) outside the timing

    # core: the pure engine's faulty turn
    policy, clock = bench_policy(), VirtualClock()
    core = _cpu_rounds(
        lambda: _drive_core(Turn, policy, FAULT_SCRIPT_CORE, None, clock),
        number=200 if quick else 1000,
        rounds=3 if quick else 15,
        on=switch,
    )
    if log is not None:
        log(f"  core: off {core['off'] * 1e6:.1f} µs, on {core['on'] * 1e6:.1f} µs per turn")

    # http: real SDK turns against a fault server in its own process
    with server_process() as base_url:
        gate = fallgate.Fallgate(
            Policy([Target("fault", PRIMARY, base_url, keyless=True)], attempt_timeout=30)
        )

        def one() -> None:
            reply = gate.chat.completions.create(messages=MESSAGES)
            if not reply.choices[0].message.content:
                raise RuntimeError("benchmark turn not answered")

        with gate:
            http = _cpu_rounds(
                one, number=40 if quick else 300, rounds=3 if quick else 10, on=switch
            )
    if log is not None:
        log(f"  http: off {http['off'] * 1e3:.3f} ms, on {http['on'] * 1e3:.3f} ms CPU per turn")
    tracer.shutdown()
    meter.shutdown()
    return {
        "off_cpu_ms_per_turn": round(http["off"] * 1e3, 4),
        "on_cpu_ms_per_turn": round(http["on"] * 1e3, 4),
        "ratio": round(http["on"] / http["off"], 3),
        "core_off_us_per_turn": round(core["off"] * 1e6, 2),
        "core_on_us_per_turn": round(core["on"] * 1e6, 2),
        "core_ratio": round(core["on"] / core["off"], 3),
    }
