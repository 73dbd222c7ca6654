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
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Final, NamedTuple, cast
from urllib.parse import urlsplit

import attrs

from .actions import Action, Attempt, Fail, Finish, Rebuild, Wait
from .health_gauge import STORES
from .outcomes import Outcome, OutcomeKind
from .redact import redact

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
_SCOPE = "fallgate"
#: Histogram buckets in seconds (those of the GenAI client duration metric).
_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                   40.96, 81.92)  # fmt: skip


class AttemptFacts(NamedTuple):
    """What an attempt's reply said, as far as the caller can tell (None: unknown)."""

    response_model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


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


# Turns whose attempts the host loop hands out (yield mode), for `attempt_scope`.
_YIELDED: weakref.WeakKeyDictionary[Any, _Observed] = weakref.WeakKeyDictionary()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("fallgate")
    except Exception:  # pragma: no cover - not installed as a distribution
        return "0"


class _Tally:
    """A counter kept in process and reported when a reader collects (an observable
    counter): a turn pays a dict update, not the SDK's per-measurement work (building
    a Measurement, cleaning and hashing its attributes), which over a one-attempt
    turn was most of the metrics' cost. Totals are cumulative, as a counter's are."""

    __slots__ = ("_attributes", "_counts", "_lock", "_names")

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names
        self._counts: dict[tuple[Any, ...], int] = {}
        self._attributes: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def add(self, key: tuple[Any, ...]) -> None:
        """Count one for these attribute values (in `names` order; None: left out)."""
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def observe(self, options: Any) -> Iterator[Any]:
        from opentelemetry.metrics import Observation

        with self._lock:
            counts = list(self._counts.items())
        for key, n in counts:
            attributes = self._attributes.get(key)
            if attributes is None:
                attributes = self._attributes[key] = {
                    name: v for name, v in zip(self._names, key, strict=True) if v is not None
                }
            yield Observation(n, attributes)


class _Metrics:
    """The metric instruments of one meter (made once per meter provider)."""

    def __init__(self, meter: Any) -> None:
        self.attempts = _Tally(
            ("fallgate.target", "gen_ai.provider.name", "gen_ai.request.model", "fallgate.outcome")
        )
        self.fallbacks = _Tally(("fallgate.from_target", "fallgate.to_target", "fallgate.event"))
        self.turns = _Tally(("fallgate.state", "gen_ai.operation.name"))
        meter.create_observable_counter(
            "fallgate.attempts",
            callbacks=[self.attempts.observe],
            unit="{attempt}",
            description="Attempts, by target and outcome",
        )
        meter.create_observable_counter(
            "fallgate.fallbacks",
            callbacks=[self.fallbacks.observe],
            unit="{fallback}",
            description="Moves of a turn from one target of its chain to another",
        )
        meter.create_observable_counter(
            "fallgate.turns",
            callbacks=[self.turns.observe],
            unit="{turn}",
            description="Turns ended, by end state",
        )
        self.waits = _histogram(
            meter, "fallgate.wait.duration", "Waits a turn asked for (backoff, Retry-After)"
        )
        self.turn_duration = _histogram(
            meter, "fallgate.turn.duration", "Turn duration on the turn's clock"
        )
        meter.create_observable_gauge(
            "fallgate.cooldowns.active",
            callbacks=[self._cooldowns],
            unit="{cooldown}",
            description="Active cooldowns in the health stores in use, per target",
        )

    def _cooldowns(self, options: Any) -> Iterator[Any]:
        active = ACTIVE
        if active is None or active.metrics is not self:
            return
        from opentelemetry.metrics import Observation

        for attributes, n in STORES.cooldowns().items():
            yield Observation(n, dict(attributes))


def _histogram(meter: Any, name: str, description: str) -> Any:
    try:
        return meter.create_histogram(
            name,
            unit="s",
            description=description,
            explicit_bucket_boundaries_advisory=list(_BUCKETS),
        )
    except TypeError:  # pragma: no cover - opentelemetry-api < 1.23
        return meter.create_histogram(name, unit="s", description=description)


_METRICS: weakref.WeakKeyDictionary[Any, _Metrics] = weakref.WeakKeyDictionary()
_GLOBAL_METRICS: list[_Metrics] = []
_metrics_lock = threading.Lock()


def _metrics_for(meter_provider: Any) -> _Metrics:
    """One set of instruments per meter provider: enabling twice registers nothing twice."""
    from opentelemetry import metrics

    with _metrics_lock:
        if meter_provider is None:
            if not _GLOBAL_METRICS:
                _GLOBAL_METRICS.append(_Metrics(metrics.get_meter(_SCOPE, _version())))
            return _GLOBAL_METRICS[0]
        found = _METRICS.get(meter_provider)
        if found is None:
            meter = metrics.get_meter(_SCOPE, _version(), meter_provider=meter_provider)
            found = _METRICS[meter_provider] = _Metrics(meter)
        return found


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


def _duck_facts(o: Outcome) -> AttemptFacts:
    """Response model and usage of an openai-shaped reply (or a billed error's completion)."""
    reply = o.value if o.kind is OutcomeKind.SUCCESS else getattr(o.error, "completion", None)
    if reply is None:
        return AttemptFacts()
    model = getattr(reply, "model", None)
    usage = getattr(reply, "usage", None)
    return AttemptFacts(
        model if isinstance(model, str) else None,
        _count(usage, "prompt_tokens", "input_tokens"),
        _count(usage, "completion_tokens", "output_tokens"),
    )


def _count(usage: Any, *names: str) -> int | None:
    if usage is None:
        return None
    for name in names:
        v = getattr(usage, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
    return None


class _Observed:
    """One turn while telemetry is on: the host loop calls this instead of the turn.

    Every protocol call is forwarded to the turn; the action it returns opens the
    span it stands for (attempt, wait, rebuild), the next call closes it, the end
    (Finish / Fail) closes the turn's span, and every new transition becomes an
    event on the turn's span.

    Kept to the fewest SDK calls a turn needs (the SDK's per-call work is most of
    telemetry's cost): attributes go in at a span's start and once more at its end,
    counts go to in-process tallies (`_Tally`), one histogram measurement per turn,
    and a transition's event is read from the turn's raw record, building its
    `TraceEvent` only when it has more to say (a wait, a failure, an outcome's detail).
    """

    __slots__ = (
        "attempt",
        "attempt_ctx",
        "attempt_span",
        "closed",
        "credential",
        "describe",
        "facts",
        "index",
        "input_tokens",
        "ins",
        "operation",
        "output_tokens",
        "pending",
        "recording",
        "s",
        "secrets",
        "seen",
        "span",
        "turn",
        "turn_ctx",
        "where",
        "yielded",
    )

    def __init__(self, ins: Instruments, turn: _TurnBase, telemetry: Telemetry | None) -> None:
        self.ins = ins
        self.turn = turn
        s = self.s = turn.s
        STORES.add(s.health, s.clock)
        if telemetry is not None:
            self.operation = telemetry.operation
            self.describe = telemetry.describe or _duck_facts
        else:
            self.operation, self.describe = None, _duck_facts
        targets = s.policy.targets
        first = targets[s.first]
        attributes: dict[str, Any] = {
            "gen_ai.provider.name": first.provider,
            "gen_ai.request.model": first.model,
        }
        if len(targets) - s.first > 1:
            attributes["fallgate.chain"] = [t.model for t in targets[s.first :]]
        if self.operation:
            attributes["gen_ai.operation.name"] = self.operation
            name, kind = f"{self.operation} {first.model}", ins.client
        else:
            name, kind = "fallgate.turn", ins.internal
        self.span = ins.tracer.start_span(name, kind=kind, attributes=attributes)
        self.turn_ctx = ins.trace.set_span_in_context(self.span)
        #: False when the turn's trace is sampled out: then only metrics are recorded.
        self.recording: bool = self.span.is_recording()
        self.attempt: Attempt | None = None
        self.attempt_span: Any = None
        self.attempt_ctx: Any = None
        self.pending: tuple[str, Any] | None = None  # ("wait" | "rebuild", span)
        self.facts: AttemptFacts | None = None  # the answering attempt's
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.index = -1  # the chain entry the turn is on
        self.where: int = -1  # the target index and credential the last event was on
        self.credential: Any = None
        self.closed = False
        self.yielded = False  # its attempts are handed out (`attempt_scope` finds it)
        self.secrets: list[str] | None = None
        self.seen = 0  # transitions already recorded

    # -- the turn's protocol, forwarded ----------------------------------------------------
    @property
    def state(self) -> str:
        return self.turn.state

    @property
    def done(self) -> bool:
        return self.turn.done

    def start(self) -> Action:
        return self._forward(self.turn.start)

    def feed(self, outcome: Outcome) -> Action:
        self._attempt_ended(outcome)
        return self._forward(self.turn.feed, outcome)

    def waited(self) -> Action:
        self._pending_ended(None)
        return self._forward(self.turn.waited)

    def rebuilt(self, ok: bool = True) -> Action:
        self._pending_ended(ok)
        return self._forward(self.turn.rebuilt, ok)

    def deny(self, why: str) -> Action:
        """The health store refused the attempt: its span ends without an outcome."""
        self._attempt_ended(None, why)
        return self._forward(self.turn.deny, why)

    def cancel(self) -> Action:
        if self.attempt_span is not None:
            self._attempt_ended(None)
        self._pending_ended(None)
        return self._forward(self.turn.cancel)

    def _forward(self, step: Callable[..., Action], *args: Any) -> Action:
        try:
            action = step(*args)
        except BaseException as e:  # a ProtocolError: the turn did not move
            self.crashed(e)
            raise
        self._transitions()
        cls = type(action)
        if cls is Attempt:
            self._attempt_began(cast(Attempt, action))
        elif cls is Wait:
            self._wait_began(cast(Wait, action))
        elif cls is Rebuild:
            self._rebuild_began(cast(Rebuild, action))
        elif cls is Finish or cls is Fail:
            self._ended(action)
        return action

    # -- spans -----------------------------------------------------------------------------
    def _child(self, name: str, kind: Any, attributes: dict[str, Any]) -> Any:
        return self.ins.tracer.start_span(
            name, context=self.turn_ctx, kind=kind, attributes=attributes
        )

    def _attempt_began(self, a: Attempt) -> None:
        self.attempt = a
        if not self.recording:  # sampled out: the turn's context stands for the attempt's
            self.attempt_span, self.attempt_ctx = self.span, self.turn_ctx
            return
        t = a.target
        attributes: dict[str, Any] = {
            "fallgate.state": self.s.state,
            "fallgate.target": t.name,
            "fallgate.credential": a.credential.id,
            "fallgate.attempt.number": a.number,
            "fallgate.attempt.timeout": a.timeout,
            "gen_ai.provider.name": t.provider,
            "gen_ai.request.model": t.model,
        }
        if self.operation:
            attributes["gen_ai.operation.name"] = self.operation
        server = self.ins.server(t)
        if server is not None:
            attributes["server.address"], attributes["server.port"] = server
        span = self.attempt_span = self._child("fallgate.attempt", self.ins.client, attributes)
        self.attempt_ctx = self.ins.trace.set_span_in_context(span, self.turn_ctx)

    def _attempt_ended(self, outcome: Outcome | None, why: str | None = None) -> None:
        span = self.attempt_span
        a = self.attempt
        if span is None or a is None:
            return
        self.attempt_span = self.attempt_ctx = self.attempt = None
        if outcome is not None:
            kind = outcome.kind.value
        else:
            kind = "denied" if why is not None else OutcomeKind.CANCELLED.value
        t = a.target
        self.ins.metrics.attempts.add((t.name, t.provider, t.model, kind))
        if not self.recording:
            return
        attributes: dict[str, Any] = {"fallgate.outcome": kind}
        if outcome is not None:
            # what a replay needs of the request (fsm.replay): seconds on the turn's clock
            attributes["fallgate.attempt.latency"] = self.s.clock() - self.s.attempt_started
            if outcome.status is not None:
                attributes["http.response.status_code"] = outcome.status
            if outcome.retry_after is not None:
                attributes["fallgate.retry_after"] = outcome.retry_after
            try:
                facts = self.describe(outcome)
            except Exception:  # a broken describe must not break the turn
                facts = AttemptFacts()
            model, n_in, n_out = facts
            if model is not None:
                attributes["gen_ai.response.model"] = model
            if n_in is not None:
                attributes["fallgate.usage.input_tokens"] = n_in
                self.input_tokens = (self.input_tokens or 0) + n_in
            if n_out is not None:
                attributes["fallgate.usage.output_tokens"] = n_out
                self.output_tokens = (self.output_tokens or 0) + n_out
            if outcome.kind is OutcomeKind.SUCCESS:
                self.facts = facts
        if kind != OutcomeKind.SUCCESS:
            error = outcome.error if outcome is not None else None
            attributes["error.type"] = type(error).__qualname__ if error is not None else kind
            status = f"{kind} (HTTP {outcome.status})" if outcome and outcome.status else kind
            span.set_status(self.ins.trace.Status(self.ins.trace.StatusCode.ERROR, status))
        span.set_attributes(attributes)
        span.end()

    def _wait_began(self, w: Wait) -> None:
        t = self.s.target
        self.ins.metrics.waits.record(
            w.seconds, {"fallgate.target": t.name, "fallgate.wait.reason": w.reason}
        )
        if not self.recording:
            return
        attributes = {
            "fallgate.state": self.s.state,
            "fallgate.target": t.name,
            "fallgate.wait.seconds": w.seconds,
            "fallgate.wait.reason": w.reason,
        }
        self.pending = ("wait", self._child("fallgate.wait", self.ins.internal, attributes))

    def _rebuild_began(self, r: Rebuild) -> None:
        if not self.recording:
            return
        t = r.target
        attributes = {
            "fallgate.state": self.s.state,
            "fallgate.target": t.name,
            "gen_ai.request.model": t.model,
        }
        self.pending = ("rebuild", self._child("fallgate.rebuild", self.ins.internal, attributes))

    def _pending_ended(self, ok: bool | None) -> None:
        pending = self.pending
        if pending is None:
            return
        self.pending = None
        what, span = pending
        if what == "rebuild":
            if ok is None:
                span.set_attribute("fallgate.rebuild.cancelled", True)
            else:
                span.set_attribute("fallgate.rebuild.ok", ok)
                if not ok:
                    span.set_status(self.ins.error)
        span.end()

    def scope(self) -> Any:
        """The attempt span current while a yielded attempt is made (`attempt_scope`)."""
        return _attached(self.ins.context, self.attempt_ctx)

    # -- transitions -----------------------------------------------------------------------
    def _clean(self, text: str) -> str:
        if self.secrets is None:
            self.secrets = self.s.policy.secrets()
        return redact(text, self.secrets)

    def _transitions(self) -> None:
        """The new transitions as events on the turn's span; a move to another target
        of the chain counted as a fallback."""
        s = self.s
        raw = s._raw  # the turn's transitions as recorded (fsm.turn.apply)
        n = len(raw)
        if self.recording:
            add = self.span.add_event
            for i in range(self.seen, n):
                add("fallgate.transition", self._event_attributes(raw[i], i))
        self.seen = n
        here = s.visit.index
        before = self.index
        if here != before:
            self.index = here
            if before >= 0 and here >= 0:
                targets = s.policy.targets
                self.ins.metrics.fallbacks.add(
                    (targets[before].name, targets[here].name, str(raw[-1][3]))
                )

    def _event_attributes(self, raw: tuple[Any, ...], i: int) -> dict[str, Any]:
        """A transition's event: what happened and where it went; the target and
        credential when it entered another one (the start, a fallback, a key rotation);
        the wait and the detail when it has them (read from its `TraceEvent`)."""
        _, _, _, trigger, dest, action, ti, cred, o, _ = raw
        trigger = str(trigger)
        attributes: dict[str, Any] = {"fallgate.event": trigger, "fallgate.state": dest}
        if ti >= 0 and (ti != self.where or cred is not self.credential):
            attributes["fallgate.target"] = self.s.policy.targets[ti].name
            if cred is not None:
                attributes["fallgate.credential"] = cred.id
        self.where, self.credential = ti, cred
        cls = type(action)
        # What `fsm.turn.trace_event` gives no wait and no detail: neither a Wait nor a
        # Rebuild nor a Fail, and no outcome of this event's own kind to describe.
        if (cls is Attempt or cls is Finish) and (
            o is None or trigger == "success" or o.kind != trigger
        ):
            return attributes
        ev = self.s.trace[i]
        if ev.wait is not None:
            attributes["fallgate.wait.seconds"] = ev.wait
        if ev.detail:
            attributes["fallgate.detail"] = self._clean(ev.detail)
        return attributes

    # -- the end -------------------------------------------------------------------------
    def _ended(self, action: Action) -> None:
        if self.closed:
            return
        self.closed = True
        if self.yielded:
            _YIELDED.pop(self.turn, None)
        s = self.s
        state = s.state
        m = self.ins.metrics
        operation = self.operation
        m.turns.add((state, operation))
        labels: dict[str, Any] = {"fallgate.state": state}
        if operation:
            labels["gen_ai.operation.name"] = operation
        m.turn_duration.record(max(0.0, s.clock() - s.started), labels)
        if not self.recording:
            return
        span = self.span
        attributes: dict[str, Any] = {
            "fallgate.state": state,
            "fallgate.attempts": s.total_attempts,
        }
        if s.visit.index >= 0:
            t = s.target
            attributes["fallgate.target"] = t.name
            server = self.ins.server(t)
            if server is not None:
                attributes["server.address"], attributes["server.port"] = server
        if self.input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = self.input_tokens
        if self.output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = self.output_tokens
        if type(action) is Finish:
            if self.facts is not None and self.facts.response_model is not None:
                attributes["gen_ai.response.model"] = self.facts.response_model
        else:
            error = cast(Fail, action).error
            last = error.last_outcome
            attributes["error.type"] = last.kind.value if last is not None else state
            span.set_status(
                self.ins.trace.Status(self.ins.trace.StatusCode.ERROR, self._clean(error.summary))
            )
        span.set_attributes(attributes)
        span.end()

    def crashed(self, e: BaseException) -> None:
        """An exception escaped the turn's host (not through `cancel`): close what is open."""
        if self.closed:
            return
        self.closed = True
        if self.yielded:
            _YIELDED.pop(self.turn, None)
        if self.attempt_span is not None:
            self._attempt_ended(None)
        self._pending_ended(None)
        self.span.set_attribute("error.type", type(e).__qualname__)
        self.span.set_status(self.ins.error)
        self.span.end()


@contextmanager
def _attached(context: Any, ctx: Any) -> Iterator[None]:
    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)
