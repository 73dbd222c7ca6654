"""One turn traced while telemetry is on: its spans, transition events and what feeds the metrics.

`Observed` stands in for the turn in the host loop: it forwards every call of the
turn's protocol unchanged and turns what the turn did into spans (the turn, each
attempt, wait and rebuild), one event per transition and the counts and
measurements of `fsm.telemetry.metrics`. `fsm.telemetry.otel` decides when a turn is observed.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..core.actions import Action, Attempt, Fail, Finish, Rebuild, Wait
from ..core.events import wait_and_detail
from ..host.observe import AttemptFacts
from ..kinds import Outcome, OutcomeKind
from ..redact import redact
from .gauge import STORES

if TYPE_CHECKING:
    from ..core.turn import TurnBase
    from ..host.observe import Telemetry
    from .otel import Instruments


#: Scrubbed texts remembered per policy (then forgotten all at once: a bound, not an LRU).
_CLEAN_KEPT = 256


class _Statics:
    """What a policy's turns of one GenAI operation always record the same way, built
    once per (policy, operation) and kept in the policy's memo: the turn span's name,
    kind and attributes per first target, and the attributes an attempt span and the
    turn's end take from their target. Building these dicts was a fifth of telemetry's
    own work on a one-attempt turn."""

    __slots__ = ("_attempts", "_ends", "_turns", "ins", "operation", "targets")

    def __init__(self, ins: Instruments, targets: Any, operation: str | None) -> None:
        self.ins = ins
        self.targets = targets  # not the policy: the policy's memo holds this
        self.operation = operation
        self._turns: dict[int, tuple[str, Any, dict[str, Any]]] = {}
        self._attempts: dict[int, dict[str, Any]] = {}
        self._ends: dict[int, dict[str, Any]] = {}

    def turn(self, first: int) -> tuple[str, Any, dict[str, Any]]:
        """The turn span's (name, kind, attributes) for a turn starting at `first`."""
        found = self._turns.get(first)
        if found is None:
            targets = self.targets
            t = targets[first]
            attributes: dict[str, Any] = {
                "gen_ai.provider.name": t.provider,
                "gen_ai.request.model": t.model,
            }
            if len(targets) - first > 1:
                attributes["fallgate.chain"] = [x.model for x in targets[first:]]
            if self.operation:
                attributes["gen_ai.operation.name"] = self.operation
                found = (f"{self.operation} {t.model}", self.ins.client, attributes)
            else:
                found = ("fallgate.turn", self.ins.internal, attributes)
            self._turns[first] = found
        return found

    def attempt(self, index: int) -> dict[str, Any]:
        """An attempt span's attributes that come from its target (entry `index`)."""
        found = self._attempts.get(index)
        if found is None:
            t = self.targets[index]
            found = {
                "fallgate.target": t.name,
                "gen_ai.provider.name": t.provider,
                "gen_ai.request.model": t.model,
            }
            if self.operation:
                found["gen_ai.operation.name"] = self.operation
            found.update(self._server(index))
            self._attempts[index] = found
        return found

    def end(self, index: int) -> dict[str, Any]:
        """The turn span's end attributes that come from the target it ended on."""
        found = self._ends.get(index)
        if found is None:
            found = {"fallgate.target": self.targets[index].name, **self._server(index)}
            self._ends[index] = found
        return found

    def _server(self, index: int) -> dict[str, Any]:
        server = self.ins.server(self.targets[index])
        if server is None:
            return {}
        return {"server.address": server[0], "server.port": server[1]}


def _cleaned(policy: Any) -> dict[str, str]:
    """The policy's memo of scrubbed texts, keyed by the keys in force too (an env var
    may change): by their hash, not them."""
    memo, keys = policy.memo, hash(tuple(policy.secrets()))
    kept = memo.get("otel_clean")
    if not (isinstance(kept, tuple) and kept[0] == keys):
        kept = memo["otel_clean"] = (keys, {})
    cleaned: dict[str, str] = kept[1]
    return cleaned


def _statics(ins: Instruments, policy: Any, operation: str | None) -> _Statics:
    """The policy's `_Statics` for `operation` under these instruments (kept in its memo)."""
    memo = policy.memo
    key = "otel_statics" if operation is None else "otel_statics:" + operation
    found = memo.get(key)
    if not (isinstance(found, _Statics) and found.ins is ins):
        found = memo[key] = _Statics(ins, policy.targets, operation)
    return found

# Turns whose attempts the host loop hands out (yield mode), for `attempt_scope`.
YIELDED: weakref.WeakKeyDictionary[Any, Observed] = weakref.WeakKeyDictionary()


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


class Observed:
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
        "cleaned",
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
        "seen",
        "span",
        "statics",
        "turn",
        "turn_ctx",
        "where",
        "yielded",
    )

    def __init__(self, ins: Instruments, turn: TurnBase, telemetry: Telemetry | None) -> None:
        self.ins = ins
        self.turn = turn
        s = self.s = turn.s
        STORES.add(s.health, s.clock)
        if telemetry is not None:
            self.operation = telemetry.operation
            self.describe = telemetry.describe or _duck_facts
        else:
            self.operation, self.describe = None, _duck_facts
        self.statics = _statics(ins, s.policy, self.operation)
        name, kind, attributes = self.statics.turn(s.first)
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
        self.cleaned: dict[str, str] | None = None  # `_clean`'s memo, found on first use
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
        # `type(...) is`, no `typing.cast`: a cast is a Python call at run time
        if type(action) is Attempt:
            self._attempt_began(action)
        elif type(action) is Wait:
            self._wait_began(action)
        elif type(action) is Rebuild:
            self._rebuild_began(action)
        elif type(action) is Finish or type(action) is Fail:
            self._ended(action)
        return action

    # -- spans -----------------------------------------------------------------------------
    def _attempt_began(self, a: Attempt) -> None:
        self.attempt = a
        if not self.recording:  # sampled out: the turn's context stands for the attempt's
            self.attempt_span, self.attempt_ctx = self.span, self.turn_ctx
            return
        attributes = {
            **self.statics.attempt(self.s.visit.index),
            "fallgate.state": self.s.state,
            "fallgate.credential": a.credential.id,
            "fallgate.attempt.number": a.number,
            "fallgate.attempt.timeout": a.timeout,
        }
        span = self.attempt_span = self.ins.tracer.start_span(
            "fallgate.attempt", context=self.turn_ctx, kind=self.ins.client, attributes=attributes
        )
        self.attempt_ctx = self.ins.trace.set_span_in_context(span, self.turn_ctx)

    def _attempt_ended(self, outcome: Outcome | None, why: str | None = None) -> None:
        span = self.attempt_span
        a = self.attempt
        if span is None or a is None:
            return
        self.attempt_span = self.attempt_ctx = self.attempt = None
        if outcome is not None:
            kind = outcome.kind._value_  # not `.value`: a Python-level property per attempt
        else:
            kind = "denied" if why is not None else OutcomeKind.CANCELLED.value
        t = a.target
        self.ins.metrics.attempts.add((t.name, t.provider, t.model, kind))
        if not self.recording:
            return
        attributes: dict[str, Any] = {"fallgate.outcome": kind}
        if outcome is not None:
            # what a replay needs of the request (fsm.replay.player): seconds on the turn's clock
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
        self.pending = ("wait", self._start("fallgate.wait", attributes))

    def _rebuild_began(self, r: Rebuild) -> None:
        if not self.recording:
            return
        t = r.target
        attributes = {
            "fallgate.state": self.s.state,
            "fallgate.target": t.name,
            "gen_ai.request.model": t.model,
        }
        self.pending = ("rebuild", self._start("fallgate.rebuild", attributes))

    def _start(self, name: str, attributes: dict[str, Any]) -> Any:
        """An internal child span of the turn's (a wait, a rebuild)."""
        return self.ins.tracer.start_span(
            name, context=self.turn_ctx, kind=self.ins.internal, attributes=attributes
        )

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
        """`text` scrubbed of the policy's keys, remembered per policy: the same few
        details (a timeout, a 429's message) recur on every turn, and scrubbing is
        most of an event's own cost."""
        cleaned = self.cleaned
        if cleaned is None:
            cleaned = self.cleaned = _cleaned(self.s.policy)
        found = cleaned.get(text)
        if found is None:
            found = redact(text, self.s.policy.secrets())
            if len(cleaned) >= _CLEAN_KEPT:
                cleaned.clear()
            cleaned[text] = found
        return found

    def _transitions(self) -> None:
        """The new transitions as events on the turn's span; a move to another target
        of the chain counted as a fallback."""
        s = self.s
        raw = s._raw  # the turn's transitions as recorded (fsm.core.turn.apply)
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
        # What `fsm.core.turn.trace_event` gives no wait and no detail: neither a Wait nor a
        # Rebuild nor a Fail, and no outcome of this event's own kind to describe.
        if (cls is Attempt or cls is Finish) and (
            o is None or trigger == "success" or o.kind != trigger
        ):
            return attributes
        wait, detail = wait_and_detail(self.s, raw)
        if wait is not None:
            attributes["fallgate.wait.seconds"] = wait
        if detail:
            attributes["fallgate.detail"] = self._clean(detail)
        return attributes

    # -- the end -------------------------------------------------------------------------
    def _ended(self, action: Action) -> None:
        if self.closed:
            return
        self.closed = True
        if self.yielded:
            YIELDED.pop(self.turn, None)
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
            attributes.update(self.statics.end(s.visit.index))
        if self.input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = self.input_tokens
        if self.output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = self.output_tokens
        if type(action) is Finish:
            if self.facts is not None and self.facts.response_model is not None:
                attributes["gen_ai.response.model"] = self.facts.response_model
        else:
            assert type(action) is Fail
            error = action.error
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
            YIELDED.pop(self.turn, None)
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
