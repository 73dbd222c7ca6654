"""Streaming turns: the sans-IO `fsm.Turn` driven from inside a (async) generator.

One stream class per I/O style serves every API that streams (chat
completions, the Responses API); `providers.openai.deliveries` says, per API, which
events carry output and how a stream ends. Before the first event with output
reaches the caller, a failing stream is an ordinary outcome: retried, rotated
or fallen back like any other. Leading events without output (a chat role-only
opener, ``response.created``...) are held back until output arrives, so a
stream that dies before saying anything costs the caller nothing. Once an
event has been handed over the turn is *committed*: a later error becomes
`stream_interrupted` carrying the text already delivered, and the caller gets
`fsm.TurnFailed` with `.partial` — never a replay, never duplicate text — unless
the turn continues it: the engine's next `Attempt` then carries the delivered text
as its `prefix`, sent as the assistant's message to be continued (on the same target
or the next that takes a prefix), and the caller's stream goes on with what follows
(a continuation that starts by repeating the delivered text's end has the repeat
dropped at the seam: `seams.SEAM_MIN`).

Each stream keeps its turn's token usage (`attempts_usage`, `usage`): what
each attempt's provider reported, a broken attempt's too when it sent any.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs

from ...fsm import Outcome, TurnFailed
from ...fsm.core.actions import Action, Attempt, Finish
from ...fsm.host.drivers import DriverStep
from ...fsm.host.loop import ahost_loop, host_loop
from ...fsm.kinds import OutcomeKind
from ...fsm.telemetry import otel as _otel
from ...fsm.trace import TraceEvent
from . import pacing
from .calls import Call, caller_mistake
from .deliveries import NotContinuable, delivery_for
from .exceptions import classifier_for
from .http.bounds import (
    AttemptBound,
    abounded,
    attempt_bound,
    bounded,
    is_instrumented,
    issued,
)
from .http.pools import Seen
from .http.sse import dropped_events
from .usage import AttemptUsage, GateResult, Ledger, Usage

if TYPE_CHECKING:
    from .client import AsyncFallgate, Fallgate

E = TypeVar("E")  # what the stream yields: ChatCompletionChunk, a Responses event
L = TypeVar("L")  # a host loop (generator)

__all__ = ["AsyncFallgateStream", "FallgateStream"]

_END: Any = object()  # the end of an SDK stream


class _StreamBase(Generic[E]):
    """State shared by the sync and async stream wrappers."""

    #: The finished turn (value: the text delivered), once the stream has ended well.
    result: GateResult | None

    def __init__(self, gate: Fallgate | AsyncFallgate, call: Call) -> None:
        self._gate = gate
        self._call = call
        self._delivery = delivery_for(call.op.streams, call.kwargs)
        self._ledger = Ledger()
        ledger = self._ledger
        self._step = DriverStep(
            type(self).__name__,
            call.policy,
            {
                "classify": classifier_for(call.policy, lambda: ledger.target),
                "health": gate.health,
                "on_transition": gate.on_transition,
                "clock": gate.clock,
                "first": call.first,
                "affinity": call.affinity,
                "cost": gate._cost(call) if gate.health.room else 0.0,
            },
        )
        self.result = None
        self._dropped = 0  # malformed events the transport dropped from this attempt
        self._cut_after_end = False  # its connection was cut after the stream's end

    def _telemetry(self) -> _otel.Telemetry | None:
        """The turn's OpenTelemetry description (made only while telemetry is on)."""
        if _otel.ACTIVE is None:
            return None
        return self._ledger.telemetry(self._call.op.operation)

    @property
    def text(self) -> str:
        """The text handed to the caller so far."""
        return self._delivery.text

    @property
    def trace(self) -> tuple[TraceEvent, ...]:
        """The turn's transitions so far (complete once the stream has ended)."""
        return tuple(self._step.turn.trace)

    @property
    def state(self) -> str:
        return self._step.turn.state

    @property
    def attempts_usage(self) -> tuple[AttemptUsage, ...]:
        """One `AttemptUsage` per attempt so far: target, model, usage (or None when
        that attempt reported none, e.g. a stream cut before its usage was sent)."""
        return tuple(self._ledger.attempts)

    @property
    def usage(self) -> Usage | None:
        """The turn's total over the attempts that reported usage (None when none did)."""
        return self._ledger.usage

    def _begin(self, a: Attempt) -> dict[str, Any]:
        """A new attempt: reset what the last one held back; its SDK arguments (a
        continuation's carry the delivered text as the assistant's prefix)."""
        self._delivery.begin(a.prefix)
        self._ledger.begin(a)
        return self._call.sdk_kwargs(a, self._gate._timeout, prefix=a.prefix)

    def _bound(self, a: Attempt, handed: float) -> AttemptBound:
        """Attempt `a`'s bounds as a stream (held until it says something: the gate's
        health store tells which later target keeps a reserve)."""
        gate = self._gate
        return attempt_bound(
            self._call.policy, a, stream=True, issued=handed, health=gate.health, clock=gate.clock
        )

    @property
    def seams(self) -> tuple[tuple[int, int], ...]:
        """Where the stream was continued: per continuation that delivered output, the
        characters delivered before it and how many of its first ones repeated the
        delivered text's end (dropped at the seam)."""
        return tuple(self._delivery.seams)

    def _ending(self) -> Iterator[E]:
        """The SDK stream ended: what the attempt still has for the caller (a
        continuation's output held at the seam); raises when the stream was cut short."""
        d = self._delivery
        for out in d.end():
            d.handed(out)
            yield out

    def _outcome(self, error: BaseException | None) -> Outcome:
        """What the attempt that just ended came to (a success says how many malformed
        events were dropped from its stream: the trace shows it)."""
        self._ledger.note(self._delivery.usage)
        dropped, self._dropped = self._dropped, 0
        cut, self._cut_after_end = self._cut_after_end, False
        if error is None:
            text = self._delivery.text
            notes = []
            if dropped:
                s = "" if dropped == 1 else "s"
                notes.append(f"{dropped} malformed stream event{s} dropped")
            if cut:  # whole, but whatever came after its end (a usage chunk) was lost
                notes.append("the connection was cut after the stream's end")
            if notes:
                return Outcome(OutcomeKind.SUCCESS, detail="; ".join(notes), value=text)
            return Outcome.success(text)
        d = self._delivery
        failure = d.failure(error)
        outcome = self._step.outcome_of(failure)
        if isinstance(failure, NotContinuable):  # a refused continuation: never sent
            return attrs.evolve(outcome, uncontinuable=str(failure), detail=str(failure))
        if outcome.kind is OutcomeKind.STREAM_INTERRUPTED and (why := d.uncontinuable()):
            # the stream's own, not the target's: the turn fails at its break, and no
            # continuation is asked for (`TurnState.uncontinuable`)
            return attrs.evolve(outcome, uncontinuable=why)
        return outcome

    def _loop(self, loop: Callable[..., L]) -> tuple[L, Seen]:
        """The turn on `loop` (`host_loop` or `ahost_loop`: this stream makes the
        attempts it hands out), and the client generations the turn uses (they scope
        its rebuilds)."""
        seen = Seen()
        steps = loop(
            self._step.turn,
            clock=self._step.clock,
            rebuild=functools.partial(self._gate._pool.rebuild, seen=seen),
            telemetry=self._telemetry(),
        )
        return steps, seen

    def _deliver(self, event: Any, bound: AttemptBound) -> Iterator[E]:
        """What `event` lets the caller have, one by one as it asks (events held back
        until output arrives come with the first that carries some); once the turn is
        started (its first event came), the wait for each next event is bounded by
        the idle timeout (and, until it commits, by the turn's deadline)."""
        d = self._delivery
        for out in d.take(event):
            d.handed(out)
            yield out
        bound.event(d.handing, d.spoke)  # a continuation is held until it hands something

    def _end(self, action: Action) -> None:
        """Keep a finished turn's result; a failed one raises its `TurnFailed`."""
        if type(action) is Finish:
            self.result = self._ledger.result(self._step.result(action))
            return
        try:
            self._step.end(action)
        except TurnFailed as e:
            self._ledger.attach(e)
            mistake = caller_mistake(e)  # the caller's own TypeError, not the targets'
            if mistake is not None:
                raise mistake from None
            raise


class FallgateStream(_StreamBase[E]):
    """What ``create(stream=True)`` returns on a `Fallgate`: an iterator of the SDK's
    events (`ChatCompletionChunk`; for ``responses.create`` the Responses stream
    events), and a context manager that ends the turn.

    Creating it runs the turn up to the first event with output, so failures
    before any output raise `fsm.TurnFailed` from `create()` itself, as the SDK
    does.
    """

    def __init__(self, gate: Fallgate, call: Call) -> None:
        super().__init__(gate, call)
        self._sync_gate = gate
        self._gen = self._run()
        self._first: list[E] = []
        try:
            self._first.append(next(self._gen))
        except StopIteration:  # pragma: no cover - a finished turn has delivered an event
            pass

    def __iter__(self) -> Iterator[E]:
        return self

    def __next__(self) -> E:
        if self._first:
            return self._first.pop()
        return next(self._gen)

    def close(self) -> None:
        """Stop early: the turn ends `aborted` and the connection is released."""
        self._first.clear()
        self._gen.close()

    def __enter__(self) -> FallgateStream[E]:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _run(self) -> Generator[E, None, None]:
        """The turn on the host loop; this generator makes the attempts, handing
        each event to the caller as it arrives. Closing it closes the loop, which
        ends the turn `aborted`."""
        steps, seen = self._loop(host_loop)
        try:
            action = next(steps)
            while type(action) is Attempt:
                error: BaseException | None = None
                kwargs = self._begin(action)
                try:
                    yield from self._attempt(action, kwargs, seen)
                except Exception as e:
                    if not self._delivery.closed_after_end(e):
                        error = e
                    else:  # the answer was whole: only its close was lost
                        self._cut_after_end = True
                        yield from self._ending()
                action = steps.send(self._outcome(error))
        finally:
            steps.close()
        self._end(action)

    def _attempt(
        self, action: Attempt, kwargs: dict[str, Any], seen: Seen
    ) -> Generator[E, None, None]:
        """One attempt: its events handed over as they come; raises what ended it badly."""
        gate, handed = self._sync_gate, issued()  # the deadline counts the client's build
        if action.prefix is not None:
            self._delivery.check_continuable()
        with gate._pool.lease(action.target, action.credential, seen) as client:
            bound = self._bound(action, handed)
            reading = pacing.reading(gate.health, action.target, action.credential, gate.clock)
            try:  # the stream's headers arrive here: read for pacing
                with _otel.attempt_scope(self._step.turn), bounded(bound):  # SDK spans nest
                    sdk = self._call.op.bind(gate._configured(client))(**kwargs)
            finally:
                pacing.done(reading)
            with sdk:
                try:
                    for event in _each(sdk, bound):
                        yield from self._deliver(event, bound)
                    yield from self._ending()
                finally:
                    self._dropped = dropped_events(sdk.response)


class AsyncFallgateStream(_StreamBase[E]):
    """The async twin: an async iterator of the SDK's events and an async context
    manager. Get it with ``await aclient.chat.completions.create(stream=True)`` (or
    ``responses.create``)."""

    def __init__(self, gate: AsyncFallgate, call: Call) -> None:
        super().__init__(gate, call)
        self._async_gate = gate
        self._agen = self._run()
        self._first: list[E] = []
        self._exhausted = False

    async def _prime(self) -> AsyncFallgateStream[E]:
        try:
            self._first.append(await self._agen.__anext__())
        except StopAsyncIteration:  # pragma: no cover - see FallgateStream
            self._exhausted = True
        return self

    def __aiter__(self) -> AsyncIterator[E]:
        return self

    async def __anext__(self) -> E:
        if self._first:
            return self._first.pop()
        if self._exhausted:
            raise StopAsyncIteration
        return await self._agen.__anext__()

    async def aclose(self) -> None:
        """Stop early: the turn ends `aborted` and the connection is released."""
        self._first.clear()
        await self._agen.aclose()

    close = aclose

    async def __aenter__(self) -> AsyncFallgateStream[E]:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _run(self) -> AsyncGenerator[E, None]:
        """The turn on the asyncio host loop (see `FallgateStream._run`; one async
        generator, the attempts inline: a nested one would sit under every event)."""
        gate = self._async_gate
        steps, seen = self._loop(ahost_loop)
        try:
            action = await anext(steps)
            while type(action) is Attempt:
                error: BaseException | None = None
                kwargs, handed = self._begin(action), issued()
                try:
                    if action.prefix is not None:
                        self._delivery.check_continuable()
                    async with gate._pool.lease(action.target, action.credential, seen) as client:
                        bound = self._bound(action, handed)
                        # per event, asyncio.timeout only where the socket is not bounded
                        backstop = not is_instrumented(client)
                        reading = pacing.reading(
                            gate.health, action.target, action.credential, gate.clock
                        )
                        try:  # the stream's headers arrive here: read for pacing
                            with _otel.attempt_scope(self._step.turn):  # SDK spans nest under it
                                async with abounded(bound, backstop=backstop):
                                    sdk = await self._call.op.bind(gate._configured(client))(
                                        **kwargs
                                    )
                        finally:
                            pacing.done(reading)
                        async with sdk:
                            events = aiter(sdk)
                            try:
                                while True:
                                    # the bound covers the wait for each event, never the caller
                                    async with abounded(bound, backstop=backstop):
                                        event = await anext(events, _END)
                                    if event is _END:
                                        break
                                    for out in self._deliver(event, bound):
                                        yield out
                                for out in self._ending():
                                    yield out
                            finally:
                                self._dropped = dropped_events(sdk.response)
                except Exception as e:
                    if not self._delivery.closed_after_end(e):
                        error = e
                    else:  # the answer was whole: only its close was lost
                        self._cut_after_end = True
                        for out in self._ending():
                            yield out
                action = await steps.asend(self._outcome(error))
        finally:
            await steps.aclose()
        self._end(action)


def _each(sdk: Iterable[Any], bound: AttemptBound) -> Iterator[Any]:
    """A sync SDK stream's events; `bound` covers the wait for each, never the caller."""
    events = iter(sdk)
    while True:
        with bounded(bound):
            event = next(events, _END)
        if event is _END:
            return
        yield event
