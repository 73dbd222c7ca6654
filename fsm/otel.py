"""OpenTelemetry traces and metrics for every turn, attempt and transition (optional).

Off until `enable()` is called (``fallgate.enable_otel()``); `disable()` turns it
off again. While off, nothing here imports ``opentelemetry`` and the host loops
(`fsm.host`) pay one check per turn (``ACTIVE is None``). While on, the host loop
hands every turn to `Instruments.observe` / `Instruments.aobserve`, which wrap it
in an `_Observed`: every call of the turn's protocol (start, feed, waited,
rebuilt, cancel) is forwarded unchanged and what it did is recorded. The engine
is not touched: the recording reads the turn's actions, the outcomes fed to it
and its record of transitions (`fsm.trace.TraceEvent`, built only for the few
transitions that carry a wait or a detail).

Traces (one per turn, as its caller's child)::

    chat glm-5.1                 the turn: `{gen_ai.operation.name} {model}`, or `fallgate.turn`
    ├── fallgate.attempt         one per attempt; current while it runs, so the SDK's
    │   └── POST (httpx)         own HTTP spans nest under it
    ├── fallgate.wait            one per Wait (backoff, Retry-After)
    └── fallgate.rebuild         one per client rebuild (transport recovery)

and every transition is an event (``fallgate.transition``) on the turn's span.

Metrics: the counts ``fallgate.attempts`` (by target and outcome kind),
``fallgate.fallbacks`` and ``fallgate.turns`` (by end state), kept in process and
reported as observable counters when a reader collects; the histograms
``fallgate.wait.duration`` and ``fallgate.turn.duration`` (seconds, on the turn's
clock; one measurement per wait and per turn); and the observable gauge
``fallgate.cooldowns.active`` read from the health stores turns have used (held
weakly) and the process-wide `fsm.health.DEFAULT`.

No attribute holds a key: credentials appear by id (``env:NAME``, ``key#N``), and
the free texts (outcome details, failure summaries) are scrubbed with
`fsm.redact.redact` against the policy's keys first.

This module is the switch and the host loops' hook; the spans and events of one
turn are `fsm.otel_spans`, the metric instruments `fsm.otel_metrics`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import urlsplit

import attrs

from .actions import Attempt
from .otel_metrics import _SCOPE, _metrics_for, _version
from .otel_spans import _YIELDED, AttemptFacts, _Observed
from .outcomes import Outcome

if TYPE_CHECKING:
    from .policy import Target
    from .turn import _TurnBase

__all__ = [
    "ACTIVE",
    "AttemptFacts",
    "Instruments",
    "Telemetry",
    "attempt_scope",
    "disable",
    "enable",
    "enabled",
]

#: The instruments in force, or None while telemetry is off (the host loops' one check).
ACTIVE: Instruments | None = None

EXTRA = "fallgate[otel]"


@attrs.frozen(slots=True)
class Telemetry:
    """What a turn's caller knows beyond the engine, for its telemetry.

    `operation` is the GenAI operation name (``"chat"``, ``"embeddings"``): with it
    the turn's span is named ``"{operation} {model}"``, without it ``fallgate.turn``.
    `describe(outcome)` says what an attempt's reply reported (response model, token
    usage); without it the reply (or a billed error's ``completion``) is read the
    way the openai SDK shapes it (``model``, ``usage``).
    """

    operation: str | None = None
    describe: Callable[[Outcome], AttemptFacts] | None = None


def enable(tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Trace and measure every turn from now on, with these providers (default: the
    global ones, looked up when used). Needs ``opentelemetry-api`` (``pip install
    'fallgate[otel]'``)."""
    global ACTIVE
    for arg, value, method in (
        ("tracer_provider", tracer_provider, "get_tracer"),
        ("meter_provider", meter_provider, "get_meter"),
    ):
        if value is not None and not callable(getattr(value, method, None)):
            raise TypeError(
                f"enable_otel: {arg} must be an OpenTelemetry {arg.replace('_', ' ')} "
                f"(with {method}()), not {type(value).__name__}"
            )
    try:
        import opentelemetry.metrics
        import opentelemetry.trace  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"fallgate.enable_otel() needs the OpenTelemetry API, which is not installed: "
            f"pip install '{EXTRA}' (or opentelemetry-api)"
        ) from e
    ACTIVE = Instruments(tracer_provider, meter_provider)


def disable() -> None:
    """Stop tracing and measuring (turns already running finish their spans)."""
    global ACTIVE
    ACTIVE = None


def enabled() -> bool:
    return ACTIVE is not None


_NO_SCOPE: Final = nullcontext()
#: What the host loops answer by cancelling the turn (recorded as its end, `aborted`).
_CANCELS: Final = (KeyboardInterrupt, GeneratorExit, asyncio.CancelledError)


def attempt_scope(turn: _TurnBase) -> Any:
    """A context manager making `turn`'s current attempt span the current span (a
    no-op while telemetry is off). For hosts that make an attempt themselves after
    the host loop handed it out (streams), around the call that sends it."""
    if ACTIVE is None:
        return _NO_SCOPE
    observed = _YIELDED.get(turn)
    if observed is None or observed.attempt_span is None:
        return _NO_SCOPE
    return observed.scope()


class Instruments:
    """The tracer and metric instruments of one `enable()` call."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        from opentelemetry import context, trace

        self.trace = trace
        self.context = context
        self.tracer = trace.get_tracer(_SCOPE, _version(), tracer_provider=tracer_provider)
        self.metrics = _metrics_for(meter_provider)
        self.client = trace.SpanKind.CLIENT
        self.internal = trace.SpanKind.INTERNAL
        self.error = trace.Status(trace.StatusCode.ERROR)
        self._servers: dict[str | None, tuple[str, int] | None] = {}

    # -- the host loops' hook ------------------------------------------------------------
    def observe(
        self,
        turn: _TurnBase,
        attempt: Callable[[Attempt], Outcome] | None,
        telemetry: Telemetry | None,
    ) -> tuple[_TurnBase, Callable[[Attempt], Outcome] | None]:
        """`turn` recorded, and `attempt` made with its attempt span current."""
        observed = _Observed(self, turn, telemetry)
        if attempt is None:
            _YIELDED[turn] = observed
            observed.yielded = True
            return cast("_TurnBase", observed), None
        attach, detach = self.context.attach, self.context.detach

        def made(a: Attempt) -> Outcome:
            token = attach(observed.attempt_ctx)
            try:
                return attempt(a)
            except _CANCELS:
                raise  # the host loop cancels the turn
            except BaseException as e:
                observed.crashed(e)
                raise
            finally:
                detach(token)

        return cast("_TurnBase", observed), made

    def aobserve(
        self,
        turn: _TurnBase,
        attempt: Callable[[Attempt], Awaitable[Outcome]] | None,
        telemetry: Telemetry | None,
    ) -> tuple[_TurnBase, Callable[[Attempt], Awaitable[Outcome]] | None]:
        """The asyncio twin of `observe`."""
        observed = _Observed(self, turn, telemetry)
        if attempt is None:
            _YIELDED[turn] = observed
            observed.yielded = True
            return cast("_TurnBase", observed), None
        attach, detach = self.context.attach, self.context.detach

        async def made(a: Attempt) -> Outcome:
            token = attach(observed.attempt_ctx)
            try:
                return await attempt(a)
            except _CANCELS:
                raise  # the host loop cancels the turn
            except BaseException as e:
                observed.crashed(e)
                raise
            finally:
                detach(token)

        return cast("_TurnBase", observed), made

    def server(self, target: Target) -> tuple[str, int] | None:
        """``server.address`` and ``server.port`` of a target's base_url."""
        url = target.base_url
        if url not in self._servers:
            found: tuple[str, int] | None = None
            if url:
                try:
                    parts = urlsplit(url)
                    host = parts.hostname
                    if host:
                        port = parts.port or (443 if parts.scheme == "https" else 80)
                        found = (host, port)
                except ValueError:
                    found = None
            self._servers[url] = found
        return self._servers[url]
