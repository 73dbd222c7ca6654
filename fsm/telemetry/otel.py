"""OpenTelemetry traces and metrics for every turn, attempt and transition (optional).

Off until `enable()` is called (``fallgate.enable_otel()``); `disable()` turns it
off again. While off, nothing here imports ``opentelemetry`` and the host loops
(`fsm.host.loop`) pay one check per turn (``ACTIVE is None``). While on, the host loop
hands every turn to `Instruments.observe` / `Instruments.aobserve`, which wrap it
in an `Observed`: every call of the turn's protocol (start, feed, waited,
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
weakly) and the process-wide `fsm.health.store.DEFAULT`.

No attribute holds a key: credentials appear by id (``env:NAME``, ``key#N``), and
the free texts (outcome details, failure summaries) are scrubbed with
`fsm.redact.redact` against the policy's keys first.

This module is the switch that installs the host loops' hook (`fsm.host.observe`); the
spans and events of one turn are `fsm.telemetry.spans`, the metric instruments
`fsm.telemetry.metrics`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import urlsplit

from ..core.actions import Attempt
from ..host import observe as _hook
from ..host.observe import AttemptFacts, Telemetry
from ..kinds import Outcome
from .metrics import SCOPE, metrics_for, version
from .spans import YIELDED, Observed

if TYPE_CHECKING:
    from ..core.turn import TurnBase
    from ..policy.model import Target

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
    ACTIVE = _hook.ACTIVE = Instruments(tracer_provider, meter_provider)


def disable() -> None:
    """Stop tracing and measuring (turns already running finish their spans)."""
    global ACTIVE
    ACTIVE = _hook.ACTIVE = None


def enabled() -> bool:
    return ACTIVE is not None


_NOSCOPE: Final = nullcontext()
#: What the host loops answer by cancelling the turn (recorded as its end, `aborted`).
_CANCELS: Final = (KeyboardInterrupt, GeneratorExit, asyncio.CancelledError)


def attempt_scope(turn: TurnBase) -> Any:
    """A context manager making `turn`'s current attempt span the current span (a
    no-op while telemetry is off). For hosts that make an attempt themselves after
    the host loop handed it out (streams), around the call that sends it."""
    if ACTIVE is None:
        return _NOSCOPE
    observed = YIELDED.get(turn)
    if observed is None or observed.attempt_span is None:
        return _NOSCOPE
    return observed.scope()


class Instruments:
    """The tracer and metric instruments of one `enable()` call."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        from opentelemetry import context, trace

        self.trace = trace
        self.context = context
        self.tracer = trace.get_tracer(SCOPE, version(), tracer_provider=tracer_provider)
        self.metrics = metrics_for(meter_provider)
        self.client = trace.SpanKind.CLIENT
        self.internal = trace.SpanKind.INTERNAL
        self.error = trace.Status(trace.StatusCode.ERROR)
        self._servers: dict[str | None, tuple[str, int] | None] = {}

    # -- the host loops' hook ------------------------------------------------------------
    def observe(
        self,
        turn: TurnBase,
        attempt: Callable[[Attempt], Outcome] | None,
        telemetry: Telemetry | None,
    ) -> tuple[TurnBase, Callable[[Attempt], Outcome] | None]:
        """`turn` recorded, and `attempt` made with its attempt span current."""
        observed = self._watch(turn, telemetry, attempt is None)
        if attempt is None:
            return cast("TurnBase", observed), None
        attach, detach = self.context.attach, self.context.detach

        # attach / detach inline, not a context manager: two calls fewer per attempt
        def made(a: Attempt) -> Outcome:
            token = attach(observed.attempt_ctx)
            try:
                return attempt(a)
            except BaseException as e:
                _escaped(observed, e)
                raise
            finally:
                detach(token)

        return cast("TurnBase", observed), made

    def aobserve(
        self,
        turn: TurnBase,
        attempt: Callable[[Attempt], Awaitable[Outcome]] | None,
        telemetry: Telemetry | None,
    ) -> tuple[TurnBase, Callable[[Attempt], Awaitable[Outcome]] | None]:
        """The asyncio flavour of `observe` (attaching and detaching never await)."""
        observed = self._watch(turn, telemetry, attempt is None)
        if attempt is None:
            return cast("TurnBase", observed), None
        attach, detach = self.context.attach, self.context.detach

        async def made(a: Attempt) -> Outcome:
            token = attach(observed.attempt_ctx)
            try:
                return await attempt(a)
            except BaseException as e:
                _escaped(observed, e)
                raise
            finally:
                detach(token)

        return cast("TurnBase", observed), made

    def _watch(self, turn: TurnBase, telemetry: Telemetry | None, yields: bool) -> Observed:
        """What both flavours of the hook do: the turn recorded (found by `attempt_scope`
        when it `yields` its attempts)."""
        observed = Observed(self, turn, telemetry)
        if yields:
            YIELDED[turn] = observed
            observed.yielded = True
        return observed

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


def _escaped(observed: Observed, e: BaseException) -> None:
    """An exception escaped an attempt the host loop made: other than a cancellation
    (the loop cancels the turn), it closes the turn's spans."""
    if not isinstance(e, _CANCELS):
        observed.crashed(e)
