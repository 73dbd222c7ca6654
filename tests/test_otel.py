"""OpenTelemetry (fsm/telemetry/otel.py): spans and metrics of real turns, read back in memory.

The turns are real: the openai SDK over loopback HTTP to the fault server through
`fallgate.Fallgate`, and `fallgate.run` with a plain callable. The SDK's HTTP spans
are what an httpx instrumentation makes: a span opened around the transport's
``handle_request`` under whatever span is current (here a wrapping transport).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fallgate.fsm import Policy, Target, TurnFailed, VirtualClock, instant_waits
from fallgate.fsm.telemetry import otel as fsm_otel
from fallgate.providers.openai.http import transport
from fallgate.providers.testing.fault_server import FaultServer
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fallgate

from helpers import KEY_PREFIX, KEY_TAIL, chain, key

ROOT = Path(__file__).resolve().parents[1]
MSG = [{"role": "user", "content": "hi"}]
FALLBACK_KEY = f"{KEY_PREFIX}-env-fallback-{KEY_TAIL}"

# Regression scenario 1: two timeouts (attempt timeout 0.3 s), a rebuild, a 429, the fallback.
SCENARIO_1 = {
    "models": {
        "glm-5.1": [
            {"kind": "timeout", "seconds": 3},
            {"kind": "timeout", "seconds": 3},
            {"kind": "status", "status": 429, "headers": {"retry-after": "171"}},
        ],
        "glm-4.7": [{"kind": "answer", "text": "answered by glm-4.7"}],
    }
}


class Telemetry:
    """An SDK tracer provider and meter provider that keep everything in memory."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("tests")

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """metric name -> [(attributes, value: sum / gauge value / histogram count)]."""
        out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        value = p.count if hasattr(p, "bucket_counts") else p.value
                        out.setdefault(m.name, []).append((dict(p.attributes), value))
        return out

    def metric_points(self) -> list[Any]:
        data = self.reader.get_metrics_data()
        return [
            p
            for rm in (data.resource_metrics if data else ())
            for sm in rm.scope_metrics
            for m in sm.metrics
            for p in m.data.data_points
        ]


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    t = Telemetry()
    fallgate.enable_otel(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    try:
        yield t
    finally:
        fallgate.disable_otel()
        t.tracer_provider.shutdown()
        t.meter_provider.shutdown()


@pytest.fixture
def instant() -> Iterator[VirtualClock]:
    with instant_waits() as clock:
        yield clock


class TracedTransport(transport.http.BaseTransport):
    """What an httpx instrumentation does: a CLIENT span around each request, opened
    under the current span."""

    def __init__(self, tracer: Any, timeout: float) -> None:
        self.tracer = tracer
        self.inner = transport.HTTPTransport(**transport.transport_options())

    def handle_request(self, request: Any) -> Any:
        with self.tracer.start_as_current_span(
            f"{request.method}",
            kind=trace.SpanKind.CLIENT,
            attributes={"http.request.method": request.method, "url.path": request.url.path},
        ):
            return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def traced_factory(t: Telemetry) -> Any:
    def build(target: Target, api_key: str) -> openai.OpenAI:
        return openai.OpenAI(
            api_key=api_key,
            base_url=target.base_url,
            max_retries=0,
            http_client=transport.DefaultClient(transport=TracedTransport(t.tracer, 60.0)),
        )

    return build


def scenario_1_policy(srv: FaultServer) -> Policy:
    return chain(
        "glm-5.1",
        {"model": "glm-4.7", "key_env": "FG_GLM47_KEY"},
        server=srv,
        provider="zai",
        max_attempts=2,
        attempt_timeout=0.3,
    )


def by_parent(spans: list[ReadableSpan]) -> dict[int | None, list[ReadableSpan]]:
    out: dict[int | None, list[ReadableSpan]] = {}
    for s in sorted(spans, key=lambda s: s.start_time or 0):
        out.setdefault(s.parent.span_id if s.parent else None, []).append(s)
    return out


def tree(spans: list[ReadableSpan]) -> list[str]:
    """The span tree as indented names, children in start order."""
    kids = by_parent(spans)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for s in kids.get(parent, []):
            lines.append("  " * depth + s.name)
            walk(s.context.span_id, depth + 1)

    walk(None, 0)
    return lines


def all_values(t: Telemetry) -> list[str]:
    """Every name, attribute and status text of every span, event and metric point."""
    out: list[str] = []
    for s in t.finished():
        out += [s.name, s.status.description or ""]
        out += [json.dumps(dict(s.attributes or {}), default=str)]
        for e in s.events:
            out += [e.name, json.dumps(dict(e.attributes or {}), default=str)]
    for p in t.metric_points():
        out.append(json.dumps(dict(p.attributes), default=str))
    return out


def assert_no_key(t: Telemetry, *keys: str) -> None:
    texts = all_values(t)
    assert texts
    for text in texts:
        assert KEY_PREFIX not in text and KEY_TAIL not in text, text
        for k in keys:
            assert k not in text, text


def events_from_trace(trace_events: Any) -> list[dict[str, Any]]:
    """The transition events a turn's trace calls for: what happened and where it went;
    target and credential when they changed; the wait and the detail when present."""
    out: list[dict[str, Any]] = []
    where: tuple[Any, Any] = (None, None)
    for ev in trace_events:
        e: dict[str, Any] = {"fallgate.event": ev.event, "fallgate.state": ev.dest}
        if ev.target is not None and (ev.target, ev.credential) != where:
            e["fallgate.target"] = ev.target
            if ev.credential is not None:
                e["fallgate.credential"] = ev.credential
        where = (ev.target, ev.credential)
        if ev.wait is not None:
            e["fallgate.wait.seconds"] = ev.wait
        if ev.detail:
            e["fallgate.detail"] = ev.detail
        out.append(e)
    return out


def span_events(span: ReadableSpan) -> list[dict[str, Any]]:
    assert {e.name for e in span.events} <= {"fallgate.transition"}
    return [dict(e.attributes or {}) for e in span.events]


# -- the scenario ---------------------------------------------------------------------------


def test_scenario_1_span_tree_attributes_and_metrics(
    fault_server: FaultServer,
    otel: Telemetry,
    instant: VirtualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FG_GLM47_KEY", FALLBACK_KEY)
    fault_server.script(SCENARIO_1)
    health = fallgate.HealthStore()
    with fallgate.Fallgate(
        scenario_1_policy(fault_server), client_factory=traced_factory(otel), health=health
    ) as gate:
        result = gate.run(messages=MSG)
    assert result.value.choices[0].message.content == "answered by glm-4.7"
    assert fault_server.counts == {"glm-5.1": 3, "glm-4.7": 1}

    spans = otel.finished()
    assert tree(spans) == [
        "chat glm-5.1",
        "  fallgate.attempt",
        "    POST",
        "  fallgate.wait",
        "  fallgate.attempt",
        "    POST",
        "  fallgate.rebuild",
        "  fallgate.attempt",
        "    POST",
        "  fallgate.attempt",
        "    POST",
    ]
    (turn,) = [s for s in spans if s.parent is None]
    assert turn.kind is trace.SpanKind.CLIENT
    a = dict(turn.attributes or {})
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "zai"
    assert a["gen_ai.request.model"] == "glm-5.1"
    assert a["gen_ai.response.model"] == "glm-4.7"
    assert a["fallgate.state"] == "done"
    assert a["fallgate.target"] == "fallback_1"
    assert a["fallgate.attempts"] == 4
    assert a["server.address"] == "127.0.0.1"
    assert a["server.port"] == fault_server.port
    usage = result.usage
    assert usage is not None
    assert a["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert "error.type" not in a
    assert turn.status.is_ok

    # every transition is an event on the turn's span, in order
    events = [dict(e.attributes or {}) for e in turn.events]
    assert [e["fallgate.event"] for e in events] == [
        "start",
        "transport",
        "waited",
        "transport",
        "rebuilt",
        "rate_limited",
        "success",
    ]
    assert [e["fallgate.state"] for e in events] == [t.dest for t in result.trace]
    assert events[1]["fallgate.wait.seconds"] >= 0
    assert events[5]["fallgate.credential"] == "env:FG_GLM47_KEY"
    assert "Retry-After 171" in events[5]["fallgate.detail"]
    assert events == events_from_trace(result.trace)
    assert events[0] == {
        "fallgate.event": "start",
        "fallgate.state": "primary",
        "fallgate.target": "primary",
        "fallgate.credential": "key#1",
    }
    assert events[-1] == {"fallgate.event": "success", "fallgate.state": "done"}

    attempts = [s for s in spans if s.name == "fallgate.attempt"]
    at = [dict(s.attributes or {}) for s in attempts]
    assert [x["fallgate.attempt.number"] for x in at] == [1, 2, 3, 4]
    assert [x["gen_ai.request.model"] for x in at] == ["glm-5.1"] * 3 + ["glm-4.7"]
    assert [x["fallgate.target"] for x in at] == ["primary"] * 3 + ["fallback_1"]
    assert [x["fallgate.outcome"] for x in at] == [
        "transport",
        "transport",
        "rate_limited",
        "success",
    ]
    assert [x.get("error.type") for x in at] == [
        "APITimeoutError",
        "APITimeoutError",
        "RateLimitError",
        None,
    ]
    assert [x["fallgate.credential"] for x in at] == ["key#1"] * 3 + ["env:FG_GLM47_KEY"]
    assert all(x["fallgate.attempt.timeout"] <= 0.3 for x in at)
    assert at[2]["fallgate.retry_after"] == 171
    assert at[2]["http.response.status_code"] == 429
    assert at[3]["gen_ai.response.model"] == "glm-4.7"
    assert at[3]["fallgate.usage.input_tokens"] == usage.prompt_tokens
    assert all(x["gen_ai.provider.name"] == "zai" for x in at)
    assert all(x["server.address"] == "127.0.0.1" for x in at)
    assert all(s.kind is trace.SpanKind.CLIENT for s in attempts)
    assert [s.status.is_ok for s in attempts] == [False, False, False, True]

    (wait,) = [s for s in spans if s.name == "fallgate.wait"]
    w = dict(wait.attributes or {})
    assert w["fallgate.state"] == "primary_transport_backoff"
    assert w["fallgate.wait.reason"] == "transport backoff"
    assert w["fallgate.wait.seconds"] == events[1]["fallgate.wait.seconds"]
    (rebuild,) = [s for s in spans if s.name == "fallgate.rebuild"]
    assert dict(rebuild.attributes or {}) == {
        "fallgate.state": "primary_recovering",
        "fallgate.target": "primary",
        "gen_ai.request.model": "glm-5.1",
        "fallgate.rebuild.ok": True,
    }

    assert_no_key(otel, key(0), FALLBACK_KEY)

    m = otel.metrics()
    assert sorted(
        (p["fallgate.target"], p["fallgate.outcome"], v) for p, v in m["fallgate.attempts"]
    ) == [("fallback_1", "success", 1), ("primary", "rate_limited", 1), ("primary", "transport", 2)]
    assert m["fallgate.fallbacks"] == [
        (
            {
                "fallgate.from_target": "primary",
                "fallgate.to_target": "fallback_1",
                "fallgate.event": "rate_limited",
            },
            1,
        )
    ]
    assert m["fallgate.turns"] == [({"fallgate.state": "done", "gen_ai.operation.name": "chat"}, 1)]
    assert [v for _, v in m["fallgate.turn.duration"]] == [1]
    assert m["fallgate.wait.duration"] == [
        ({"fallgate.target": "primary", "fallgate.wait.reason": "transport backoff"}, 1)
    ]
    # the 429's Retry-After benched the primary's key in this client's store
    cooling = {
        (p["gen_ai.request.model"], p["fallgate.cooldown.scope"]): v
        for p, v in m["fallgate.cooldowns.active"]
    }
    assert cooling[("glm-5.1", "credential")] == 1


def test_a_failed_turn_marks_its_span_and_counts_failed(
    fault_server: FaultServer, otel: Telemetry, instant: VirtualClock
) -> None:
    fault_server.script({"models": {"m0": [{"kind": "status", "status": 401}]}})
    with fallgate.Fallgate(chain("m0", server=fault_server)) as gate, pytest.raises(TurnFailed):
        gate.chat.completions.create(model="m0", messages=MSG)
    (turn,) = [s for s in otel.finished() if s.parent is None]
    a = dict(turn.attributes or {})
    assert turn.name == "chat m0"
    assert a["fallgate.state"] == "failed"
    assert a["error.type"] == "auth"
    assert not turn.status.is_ok
    (attempt,) = [s for s in otel.finished() if s.name == "fallgate.attempt"]
    assert dict(attempt.attributes or {})["error.type"] == "AuthenticationError"
    assert otel.metrics()["fallgate.turns"] == [
        ({"fallgate.state": "failed", "gen_ai.operation.name": "chat"}, 1)
    ]
    assert_no_key(otel, key(0))


def test_transition_events_say_what_each_turns_trace_says(otel: Telemetry) -> None:
    """Property: for every turn, the events on its span are its trace's transitions in
    order (event, state), with the target and credential where they changed and every
    wait and detail the trace holds: the events read the turn's raw record and build
    a transition's full entry only when it has more to say, and this checks that
    shortcut against the trace over turns that retry, wait, rebuild, rotate keys,
    fall back, answer and fail."""
    policy = chain("m0", "m1", keys=2, max_attempts=2)

    class Status(Exception):
        def __init__(self, status: int, retry_after: str | None = None) -> None:
            super().__init__(f"HTTP {status}")
            self.status_code = status
            self.headers = {"retry-after": retry_after} if retry_after else {}

    scripts: dict[str, list[BaseException | None]] = {
        "happy": [None],
        "timeouts then fallback": [TimeoutError("t"), TimeoutError("t"), TimeoutError("t"), None],
        "429 rotates the key": [Status(429, "3"), None],
        "5xx then fallback": [Status(503), Status(503), None],
        "auth fails everywhere": [Status(401)] * 8,
    }
    traces: dict[str, Any] = {}
    for name, steps in scripts.items():
        it = iter(steps)

        def call(target: Target, credential: Any, it: Any = it) -> str:
            step = next(it)
            if step is not None:
                raise step
            return "ok"

        try:
            result = fallgate.run(policy, call, clock=VirtualClock(), health=fallgate.HealthStore())
            traces[name] = result.trace
        except TurnFailed as e:
            traces[name] = e.trace
    turns = [s for s in otel.finished() if s.name == "fallgate.turn"]
    assert len(turns) == len(scripts)
    kinds = set()
    for span, (name, tr) in zip(turns, traces.items(), strict=True):
        assert span_events(span) == events_from_trace(tr), name
        kinds |= {e.action for e in tr}
    assert kinds >= {"Attempt", "Wait", "Rebuild", "Finish", "Fail"}


# -- the sync driver with a plain callable --------------------------------------------------


def test_fallgate_run_with_a_plain_callable(otel: Telemetry) -> None:
    policy = chain("m0", "m1", max_attempts=2)
    current: list[int] = []

    class RateLimited(Exception):
        status_code = 429
        headers = {"retry-after": "2"}

    def call(target: Target, credential: Any) -> str:
        current.append(trace.get_current_span().get_span_context().span_id)
        with otel.tracer.start_as_current_span("inside"):
            pass
        if target.model == "m0":
            raise RateLimited("slow down " + credential.resolve())  # a key in the message
        return "ok"

    with otel.tracer.start_as_current_span("caller") as caller:
        result = fallgate.run(policy, call, clock=VirtualClock(), health=fallgate.HealthStore())
    assert result.value == "ok"
    spans = otel.finished()
    assert tree(spans) == [
        "caller",
        "  fallgate.turn",
        "    fallgate.attempt",
        "      inside",
        "    fallgate.attempt",
        "      inside",
    ]
    turn = next(s for s in spans if s.name == "fallgate.turn")
    assert turn.parent is not None and turn.parent.span_id == caller.get_span_context().span_id
    assert turn.kind is trace.SpanKind.INTERNAL
    assert "gen_ai.operation.name" not in (turn.attributes or {})
    attempts = [s for s in spans if s.name == "fallgate.attempt"]
    # the attempt's span was the current span while the callable ran
    assert current == [s.context.span_id for s in attempts]
    assert [dict(s.attributes or {})["fallgate.outcome"] for s in attempts] == [
        "rate_limited",
        "success",
    ]
    assert dict(attempts[0].attributes or {})["fallgate.retry_after"] == 2
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left attached
    assert_no_key(otel, key(0), key(1))
    m = otel.metrics()
    assert sorted(v for _, v in m["fallgate.attempts"]) == [1, 1]
    assert m["fallgate.turns"] == [({"fallgate.state": "done"}, 1)]
    assert [v for _, v in m["fallgate.fallbacks"]] == [1]


async def test_arun_makes_each_attempt_span_current_in_its_task(otel: Telemetry) -> None:
    policy = chain("m0", "m1")
    current: list[int] = []

    async def call(target: Target, credential: Any) -> str:
        current.append(trace.get_current_span().get_span_context().span_id)
        if target.model == "m0":
            raise TimeoutError("read timed out")
        return "ok"

    result = await fallgate.arun(
        policy,
        call,
        clock=VirtualClock(),
        health=fallgate.HealthStore(),
    )
    assert result.value == "ok"
    spans = otel.finished()
    attempts = [s for s in spans if s.name == "fallgate.attempt"]
    assert current == [s.context.span_id for s in attempts]
    assert len(attempts) == 4  # timeout, timeout (after a wait), rebuild, timeout, fallback
    assert tree(spans)[0] == "fallgate.turn"
    assert {s.name for s in spans} == {
        "fallgate.turn",
        "fallgate.attempt",
        "fallgate.wait",
        "fallgate.rebuild",
    }
    assert trace.get_current_span() is trace.INVALID_SPAN


async def test_async_client_http_spans_nest_under_the_attempts(
    fault_server: FaultServer, otel: Telemetry, instant: VirtualClock
) -> None:
    class AsyncTraced(transport.http.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = transport.AsyncHTTPTransport(**transport.transport_options())

        async def handle_async_request(self, request: Any) -> Any:
            with otel.tracer.start_as_current_span("POST", kind=trace.SpanKind.CLIENT):
                return await self.inner.handle_async_request(request)

        async def aclose(self) -> None:
            await self.inner.aclose()

    def build(target: Target, api_key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            api_key=api_key,
            base_url=target.base_url,
            max_retries=0,
            http_client=transport.DefaultAsyncClient(transport=AsyncTraced()),
        )

    fault_server.script(
        {"models": {"m0": [{"kind": "status", "status": 503}], "m1": [{"kind": "answer"}]}}
    )
    async with fallgate.AsyncFallgate(
        chain("m0", "m1", server=fault_server, max_attempts=1), client_factory=build
    ) as gate:
        reply = await gate.chat.completions.create(messages=MSG)
    assert reply.model == "m1"
    assert tree(otel.finished()) == [
        "chat m0",
        "  fallgate.attempt",
        "    POST",
        "  fallgate.attempt",
        "    POST",
    ]


def test_the_real_httpx_instrumentation_nests_under_the_attempts(
    fault_server: FaultServer, otel: Telemetry, instant: VirtualClock
) -> None:
    """openai 2.x is built on httpx: its instrumentation's spans (sync, stream, async)
    are the attempts' children. (openai 3.x is built on httpx2, which it does not patch.)"""
    if transport.NAME != "httpx":
        pytest.skip(f"openai is built on {transport.NAME}, not httpx")
    instrumentation = pytest.importorskip("opentelemetry.instrumentation.httpx")
    instrumentor = instrumentation.HTTPXClientInstrumentor()
    instrumentor.instrument(tracer_provider=otel.tracer_provider)
    try:
        fault_server.script(
            {
                "models": {
                    "m0": [{"kind": "status", "status": 500}] * 2,
                    "m1": [{"kind": "answer"}, {"kind": "stream", "chunks": 2}, {"kind": "answer"}],
                }
            }
        )
        policy = chain("m0", "m1", server=fault_server, max_attempts=1)
        with fallgate.Fallgate(policy) as gate:
            gate.chat.completions.create(messages=MSG)
            for _ in gate.chat.completions.create(messages=MSG, stream=True):
                pass

        async def asynchronously() -> None:
            async with fallgate.AsyncFallgate(policy) as agate:
                await agate.chat.completions.create(messages=MSG)

        import asyncio

        asyncio.run(asynchronously())
    finally:
        instrumentor.uninstrument()
    spans = otel.finished()
    http = [s for s in spans if s.name.startswith("POST")]
    assert len(http) == 5
    attempts = {s.context.span_id: s for s in spans if s.name == "fallgate.attempt"}
    assert all(s.parent is not None and s.parent.span_id in attempts for s in http)
    assert len([s for s in spans if s.parent is None]) == 3  # three turns
    assert_no_key(otel, key(0), key(1))


# -- streams ---------------------------------------------------------------------------------


def test_a_stream_turn_attempt_spans_hold_the_http_spans(
    fault_server: FaultServer, otel: Telemetry, instant: VirtualClock
) -> None:
    fault_server.script(
        {
            "models": {
                "m0": [{"kind": "status", "status": 500}],
                "m1": [{"kind": "stream", "chunks": 3}],
            }
        }
    )
    policy = chain("m0", "m1", server=fault_server, max_attempts=1)
    with fallgate.Fallgate(policy, client_factory=traced_factory(otel)) as gate:
        stream = gate.chat.completions.create(
            messages=MSG, stream=True, stream_options={"include_usage": True}
        )
        with otel.tracer.start_as_current_span("consumer"):
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == "chunk-1 chunk-2 chunk-3 "
    spans = otel.finished()
    names = tree(spans)
    assert names[:5] == [
        "chat m0",
        "  fallgate.attempt",
        "    POST",
        "  fallgate.attempt",
        "    POST",
    ]
    assert "consumer" in names  # the caller's own span is not put under an attempt
    turn = next(s for s in spans if s.name == "chat m0")
    assert dict(turn.attributes or {})["fallgate.state"] == "done"
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_a_stream_closed_early_ends_its_turn_span_aborted(
    fault_server: FaultServer, otel: Telemetry, instant: VirtualClock
) -> None:
    fault_server.script({"models": {"m0": [{"kind": "stream", "chunks": 5}]}})
    with fallgate.Fallgate(chain("m0", server=fault_server)) as gate:
        stream = gate.chat.completions.create(messages=MSG, stream=True)
        next(iter(stream))
        stream.close()
    (turn,) = [s for s in otel.finished() if s.parent is None]
    a = dict(turn.attributes or {})
    assert a["fallgate.state"] == "aborted"
    assert a["error.type"] == "cancelled"
    (attempt,) = [s for s in otel.finished() if s.name == "fallgate.attempt"]
    assert dict(attempt.attributes or {})["fallgate.outcome"] == "cancelled"
    assert otel.metrics()["fallgate.turns"] == [
        ({"fallgate.state": "aborted", "gen_ai.operation.name": "chat"}, 1)
    ]


# -- switching -------------------------------------------------------------------------------


def test_disable_stops_recording(otel: Telemetry) -> None:
    fallgate.disable_otel()
    assert not fsm_otel.enabled()
    fallgate.run(chain("m0"), lambda t, c: "ok", clock=VirtualClock())
    assert otel.finished() == []
    fallgate.enable_otel(otel.tracer_provider, otel.meter_provider)  # twice: no duplicates
    fallgate.enable_otel(otel.tracer_provider, otel.meter_provider)
    fallgate.run(chain("m0"), lambda t, c: "ok", clock=VirtualClock())
    assert [s.name for s in otel.finished()] == ["fallgate.attempt", "fallgate.turn"]
    assert otel.metrics()["fallgate.turns"] == [({"fallgate.state": "done"}, 1)]


def test_counts_are_monotonic_sums_that_add_up_across_collections(otel: Telemetry) -> None:
    """The counts are kept in process and reported when the reader collects: exported
    as a counter's are (a monotonic, cumulative sum: ``*_total`` in Prometheus), and a
    collection in between loses nothing."""
    policy = chain("m0", "m1", max_attempts=1)

    def call(target: Target, credential: Any) -> str:
        if target.model == "m0":
            raise TimeoutError("timed out")
        return "ok"

    def run() -> None:
        fallgate.run(policy, call, clock=VirtualClock(), health=fallgate.HealthStore())

    run()
    first = otel.metrics()
    run()
    run()
    data = otel.reader.get_metrics_data()
    sums = {
        m.name: m.data
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name in ("fallgate.attempts", "fallgate.fallbacks", "fallgate.turns")
    }
    assert sorted(sums) == ["fallgate.attempts", "fallgate.fallbacks", "fallgate.turns"]
    for d in sums.values():
        assert type(d).__name__ == "Sum" and d.is_monotonic
        assert d.aggregation_temporality.name == "CUMULATIVE"
    assert first["fallgate.turns"] == [({"fallgate.state": "done"}, 1)]
    assert [(dict(p.attributes), p.value) for p in sums["fallgate.turns"].data_points] == [
        ({"fallgate.state": "done"}, 3)
    ]
    assert sorted(
        (dict(p.attributes)["fallgate.outcome"], p.value)
        for p in sums["fallgate.attempts"].data_points
    ) == [("success", 3), ("transport", 6)]  # the primary retried once after its rebuild
    assert [p.value for p in sums["fallgate.fallbacks"].data_points] == [3]


def test_the_cooldown_gauge_holds_health_stores_weakly(otel: Telemetry) -> None:
    policy = chain("gauge-m", provider="gauge-p")

    class Forbidden(Exception):
        status_code = 403
        headers = None

    def call(target: Target, credential: Any) -> str:
        raise Forbidden("no")

    def cooling() -> list[tuple[dict[str, Any], int]]:
        points = otel.metrics().get("fallgate.cooldowns.active", [])
        return [(p, v) for p, v in points if p.get("server.address") == "gauge-p.test"]

    clock = VirtualClock()
    store = fallgate.HealthStore()
    with pytest.raises(TurnFailed):
        fallgate.run(policy, call, clock=clock, health=store)
    assert cooling() == [
        (
            {
                "gen_ai.request.model": "gauge-m",
                "server.address": "gauge-p.test",
                "fallgate.cooldown.scope": "credential",
            },
            1,
        )
    ]
    clock.advance(10_000)  # the cooldown is over (read on the store's own clock): 0
    assert [v for _, v in cooling()] == [0]
    del store
    gc.collect()
    assert cooling() == []


def test_a_sampled_out_turn_records_metrics_and_no_span() -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    t = Telemetry()
    t.tracer_provider = TracerProvider(sampler=ALWAYS_OFF)
    t.tracer_provider.add_span_processor(SimpleSpanProcessor(t.spans))
    fallgate.enable_otel(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    seen: list[bool] = []

    def call(target: Target, credential: Any) -> str:
        seen.append(trace.get_current_span().get_span_context().trace_id != 0)
        if target.model == "m0":
            raise TimeoutError("timed out")
        return "ok"

    try:
        fallgate.run(chain("m0", "m1"), call, clock=VirtualClock(), health=fallgate.HealthStore())
    finally:
        fallgate.disable_otel()
    assert t.finished() == []
    assert seen == [True] * 4  # the (unsampled) turn's context is still propagated
    m = t.metrics()
    assert sorted(v for _, v in m["fallgate.attempts"]) == [1, 3]
    assert [v for _, v in m["fallgate.fallbacks"]] == [1]
    assert m["fallgate.turns"] == [({"fallgate.state": "done"}, 1)]


def test_an_exception_out_of_the_attempt_closes_the_spans(otel: Telemetry) -> None:
    from fallgate.fsm.host.loop import host_loop

    def attempt(a: Any) -> Any:
        raise RuntimeError("the host's own bug")

    turn = fallgate.fsm.Turn(chain("m0"), health=fallgate.HealthStore(), clock=VirtualClock())
    with pytest.raises(RuntimeError):
        next(host_loop(turn, clock=VirtualClock(), attempt=attempt))
    spans = otel.finished()
    assert [s.name for s in spans] == ["fallgate.attempt", "fallgate.turn"]
    assert dict(spans[1].attributes or {})["error.type"] == "RuntimeError"
    assert trace.get_current_span() is trace.INVALID_SPAN


# -- nothing when off ------------------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_and_turns_with_otel_off_import_no_opentelemetry() -> None:
    proc = _python(
        """
        import sys
        import fallgate
        from fallgate.fsm import Policy, Target, VirtualClock
        from fallgate.testing import FaultServer

        solo = Policy([Target("p", "m", "https://p.test/v1", keyless=True)])
        assert fallgate.run(solo, lambda t, c: "ok",
                            clock=VirtualClock()).value == "ok"
        with FaultServer({"default": {"kind": "answer", "text": "hi"}}) as srv:
            policy = Policy([Target("p", "m", srv.base_url, keyless=True)])
            with fallgate.Fallgate(policy) as gate:
                reply = gate.chat.completions.create(messages=[{"role": "user", "content": "x"}])
                assert reply.choices[0].message.content == "hi"
                for chunk in gate.chat.completions.create(
                    messages=[{"role": "user", "content": "x"}], stream=True
                ):
                    pass
        print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_enable_without_the_api_names_the_extra() -> None:
    proc = _python(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if opentelemetry-api were not installed
        import fallgate
        try:
            fallgate.enable_otel()
        except ImportError as e:
            print(e)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'fallgate[otel]'" in proc.stdout


def test_an_attempt_span_carries_its_latency_on_the_turn_clock(otel: Telemetry) -> None:
    clock = VirtualClock()

    def call(target: Target, credential: Any) -> str:
        clock.advance(0.75 if target.model == "m0" else 0.25)
        if target.model == "m0":
            raise TimeoutError("slow")
        return "ok"

    policy = chain("m0", "m1", max_attempts=1)
    fallgate.run(policy, call, clock=clock, health=fallgate.HealthStore())
    at = [dict(s.attributes or {}) for s in otel.finished() if s.name == "fallgate.attempt"]
    seen = [(x["fallgate.outcome"], x["fallgate.attempt.latency"]) for x in at]
    assert seen[0] == ("transport", 0.75) and seen[-1] == ("success", 0.25)
    assert {x for x in seen[:-1]} == {("transport", 0.75)}
