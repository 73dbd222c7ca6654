"""OpenTelemetry overhead: client CPU per turn with tracing and metrics on vs off.

Both in one process, rounds interleaved (off, on, then on, off, ...), CPU time
(`time.process_time`), best round of each; "on" is `fallgate.enable_otel()` with
the SDK's providers: a `TracerProvider` whose `SimpleSpanProcessor` hands every
span to an exporter that drops it, and a `MeterProvider` with an
`InMemoryMetricReader` (collected after each round, outside the timing).

- **http**: `fallgate.Fallgate` chat turns through the real openai SDK over
  loopback HTTP to a fast fault server in its own process (its CPU is not
  counted): one attempt per turn, as most turns are.
- **floor**: the same http turns with fallgate's telemetry off, each followed by
  the fewest SDK calls a one-attempt turn's telemetry can make: a turn span and a
  child attempt span without attributes, an event per transition (2), one
  histogram measurement. What the SDK costs next to a real turn whatever fallgate
  does: the ratio fallgate's "on" cannot go below.
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
    turn: Callable[[], object],
    number: int,
    rounds: int,
    modes: dict[str, Callable[[], None]],
    reset: Callable[[], None],
) -> dict[str, float]:
    """Best CPU seconds per turn of each mode, over interleaved rounds (each round
    runs every mode, the order rotated; ``modes[m]()`` switches mode m on, ``reset()``
    back off, outside the timing)."""
    names = list(modes)
    best = dict.fromkeys(names, float("inf"))
    for name in names:  # warm every path
        modes[name]()
        for _ in range(max(3, number // 10)):
            turn()
        reset()
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                modes[name]()
                t0 = time.process_time()
                for _ in range(number):
                    turn()
                dt = (time.process_time() - t0) / number
                best[name] = min(best[name], dt)
                reset()
                gc.collect()
    finally:
        if was:
            gc.enable()
        reset()
    return best


def measure(quick: bool = False, log: Any = None) -> dict[str, Any]:
    tracer, meter, reader = _providers()
    floor_on = [False]

    def on() -> None:
        fallgate.enable_otel(tracer_provider=tracer, meter_provider=meter)

    def off() -> None:
        pass

    def floor() -> None:
        floor_on[0] = True

    def reset() -> None:
        fallgate.disable_otel()
        floor_on[0] = False
        reader.get_metrics_data()  # collect (and forget) outside the timing

    # core: the pure engine's faulty turn
    policy, clock = bench_policy(), VirtualClock()
    core = _cpu_rounds(
        lambda: _drive_core(Turn, policy, FAULT_SCRIPT_CORE, None, clock),
        number=200 if quick else 1000,
        rounds=3 if quick else 15,
        modes={"off": off, "on": on},
        reset=reset,
    )
    if log is not None:
        log(f"  core: off {core['off'] * 1e6:.1f} µs, on {core['on'] * 1e6:.1f} µs per turn")

    # http: real SDK turns against a fault server in its own process
    sdk_floor = _floor_calls(tracer, meter)
    with server_process() as base_url:
        gate = fallgate.Fallgate(
            Policy([Target("fault", PRIMARY, base_url, keyless=True)], attempt_timeout=30)
        )

        def one() -> None:
            reply = gate.chat.completions.create(messages=MESSAGES)
            if not reply.choices[0].message.content:
                raise RuntimeError("benchmark turn not answered")
            if floor_on[0]:
                sdk_floor()

        with gate:
            http = _cpu_rounds(
                one,
                number=40 if quick else 300,
                rounds=3 if quick else 10,
                modes={"off": off, "on": on, "floor": floor},
                reset=reset,
            )
    if log is not None:
        log(
            f"  http: off {http['off'] * 1e3:.3f} ms, on {http['on'] * 1e3:.3f} ms, "
            f"SDK floor {http['floor'] * 1e3:.3f} ms CPU per turn"
        )
    tracer.shutdown()
    meter.shutdown()
    return {
        "off_cpu_ms_per_turn": round(http["off"] * 1e3, 4),
        "on_cpu_ms_per_turn": round(http["on"] * 1e3, 4),
        "ratio": round(http["on"] / http["off"], 3),
        "floor_cpu_ms_per_turn": round(http["floor"] * 1e3, 4),
        "floor_ratio": round(http["floor"] / http["off"], 3),
        "core_off_us_per_turn": round(core["off"] * 1e6, 2),
        "core_on_us_per_turn": round(core["on"] * 1e6, 2),
        "core_ratio": round(core["on"] / core["off"], 3),
    }


def _floor_calls(tracer_provider: Any, meter_provider: Any) -> Callable[[], None]:
    """The fewest SDK calls a one-attempt turn's telemetry makes: two spans (the turn,
    its attempt as a child), an event per transition, one histogram measurement."""
    from opentelemetry import trace

    tracer = tracer_provider.get_tracer("bench.floor")
    histogram = meter_provider.get_meter("bench.floor").create_histogram("bench.floor", unit="s")

    def calls() -> None:
        span = tracer.start_span("turn")
        span.add_event("transition")
        tracer.start_span("attempt", context=trace.set_span_in_context(span)).end()
        span.add_event("transition")
        histogram.record(0.0)
        span.end()

    return calls


def table(o: dict[str, Any]) -> list[str]:
    """The section's Markdown table (bench.md, README)."""
    lines = [
        "**OpenTelemetry overhead** (`fallgate.enable_otel()` with the SDK's providers, "
        "spans dropped at export; client CPU per turn, best round, one process)",
        "",
        "| turn | off | on | on / off |",
        "|---|---:|---:|---:|",
        f"| `Fallgate` chat turn, real SDK over loopback HTTP (1 attempt) "
        f"| {o['off_cpu_ms_per_turn']:.3f} ms | {o['on_cpu_ms_per_turn']:.3f} ms "
        f"| {o['ratio']:.2f}x |",
    ]
    if "floor_ratio" in o:
        lines.append(
            f"| the same turn, fallgate's telemetry off, plus the SDK floor (2 bare spans, "
            f"2 events, 1 histogram measurement) | {o['off_cpu_ms_per_turn']:.3f} ms "
            f"| {o['floor_cpu_ms_per_turn']:.3f} ms | {o['floor_ratio']:.2f}x |"
        )
    lines += [
        f"| pure core, scenario 1's faulty turn (4 attempts, a wait, a rebuild) "
        f"| {o['core_off_us_per_turn']:.1f} µs | {o['core_on_us_per_turn']:.1f} µs "
        f"| {o['core_ratio']:.2f}x |",
        "",
    ]
    return lines


def turns(mode: str, n: int) -> None:
    """`n` chat turns in one mode ("off", "on", "floor") after 30 warm ones, for a
    count that machine load does not blur: run it under valgrind with `n` and with
    0 and subtract (``valgrind --tool=cachegrind --cache-sim=no python -m bench.otel
    on 200``; the server is a child process, not counted)."""
    if mode not in ("off", "on", "floor"):
        raise SystemExit(f"mode: {mode!r} is not one of off, on, floor")
    tracer, meter, _ = _providers()
    sdk_floor = _floor_calls(tracer, meter)
    if mode == "on":
        fallgate.enable_otel(tracer_provider=tracer, meter_provider=meter)
    with server_process() as base_url:
        gate = fallgate.Fallgate(
            Policy([Target("fault", PRIMARY, base_url, keyless=True)], attempt_timeout=30)
        )
        with gate:
            for i in range(30 + n):
                if i == 30:
                    gc.collect()
                    gc.disable()
                gate.chat.completions.create(messages=MESSAGES)
                if mode == "floor":
                    sdk_floor()
    gc.enable()
    fallgate.disable_otel()


if __name__ == "__main__":
    import sys

    turns(sys.argv[1], int(sys.argv[2]))
