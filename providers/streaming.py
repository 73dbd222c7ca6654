"""Streaming turns: the sans-IO `fsm.Turn` driven from inside a (async) generator.

One stream class per I/O style serves every API that streams (chat
completions, the Responses API); `providers.deliveries` says, per API, which
events carry output and how a stream ends. Before the first event with output
reaches the caller, a failing stream is an ordinary outcome: retried, rotated
or fallen back like any other. Leading events without output (a chat role-only
opener, ``response.created``...) are held back until output arrives, so a
stream that dies before saying anything costs the caller nothing. Once an
event has been handed over the turn is *committed*: a later error becomes
`stream_interrupted` carrying the text already delivered, and the caller gets
`fsm.TurnFailed` with `.partial` — never a replay, never duplicate text. (With
``continue_streams`` the policy may ask for another attempt; it is sent with
the delivered text as an assistant prefix.)

Each stream keeps its turn's token usage (`attempts_usage`, `usage`): what
each attempt's provider reported, a broken attempt's too when it sent any.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..fsm import Outcome, Turn, TurnFailed
from ..fsm import otel as _otel
from ..fsm.actions import Action, Attempt, Finish
from ..fsm.drivers import _Step
from ..fsm.host import ahost_loop, host_loop
from ..fsm.trace import TraceEvent
from .bounds import abounded, attempt_bound, bounded, is_instrumented
from .calls import Call
from .classify import classifier_for
from .deliveries import delivery_for
from .pools import Seen
from .usage import AttemptUsage, GateResult, Ledger, Usage

if TYPE_CHECKING:
    from .openai_adapter import AsyncFallgate, Fallgate

E = TypeVar("E")  # what the stream yields: ChatCompletionChunk, a Responses event

__all__ = ["AsyncFallgateStream", "FallgateStream"]

_END: Any = object()  # the end of an SDK stream


class _StreamBase(Generic[E]):
    """State shared by the sync and async stream wrappers."""

    #: The finished turn (value: the text delivered), once the stream has ended well.
    result: GateResult | None

    def __init__(self, gate: Fallgate | AsyncFallgate, call: Call) -> None:
        self._gate = gate
        self._call = call
        self._delivery = delivery_for(call.op.streams)
        self._ledger = Ledger()
        ledger = self._ledger
        self._step = _Step(
            call.policy,
            classifier_for(call.policy, lambda: ledger.target),
            gate.health,
            gate.on_transition,
            gate.clock,
            None,
            Turn,
            call.first,
        )
        self.result = None

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
        """A new attempt: reset what the last one held back; its SDK arguments."""
        d = self._delivery
        prefix = d.text if d.committed else None
        d.begin()
        self._ledger.begin(a)
        return self._call.sdk_kwargs(a, self._gate._timeout, prefix=prefix)

    def _outcome(self, error: BaseException | None) -> Outcome:
        """What the attempt that just ended came to."""
        self._ledger.note(self._delivery.usage)
        if error is None:
            return Outcome.success(self._delivery.text)
        return self._step.outcome_of(self._delivery.failure(error))

    def _end(self, action: Action) -> None:
        """Keep a finished turn's result; a failed one raises its `TurnFailed`."""
        if type(action) is Finish:
            self.result = self._ledger.result(self._step.result(action))
            return
        try:
            self._step.end(action)
        except TurnFailed as e:
            self._ledger.attach(e)
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
        gate, d = self._sync_gate, self._delivery
        turn = self._step.turn
        seen = Seen()  # the client generations this turn used (scopes its rebuilds)
        steps = host_loop(
            turn,
            clock=self._step.clock,
            rebuild=functools.partial(gate._pool.rebuild, seen=seen),
            telemetry=self._telemetry(),
        )
        try:
            action = next(steps)
            while type(action) is Attempt:
                error: BaseException | None = None
                kwargs = self._begin(action)
                try:
                    with gate._pool.lease(action.target, action.credential, seen) as client:
                        bound = attempt_bound(self._call.policy, action)  # from the lease on
                        with _otel.attempt_scope(turn), bounded(bound):  # SDK spans nest under it
                            sdk = self._call.op.bind(gate._configured(client))(**kwargs)
                        with sdk:
                            events = iter(sdk)
                            while True:
                                # the bound covers the wait for each event, never the caller
                                with bounded(bound):
                                    event = next(events, _END)
                                if event is _END:
                                    break
                                for out in d.take(event):
                                    d.handed(out)
                                    yield out
                                if d.committed:
                                    bound.idle(self._call.policy.stream_idle_timeout)
                            d.end()
                except Exception as e:
                    error = e
                action = steps.send(self._outcome(error))
        finally:
            steps.close()
        self._end(action)


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
        """The turn on the asyncio host loop (see `FallgateStream._run`)."""
        gate, d = self._async_gate, self._delivery
        turn = self._step.turn
        seen = Seen()  # the client generations this turn used (scopes its rebuilds)
        steps = ahost_loop(
            turn,
            clock=self._step.clock,
            rebuild=functools.partial(gate._pool.rebuild, seen=seen),
            telemetry=self._telemetry(),
        )
        try:
            action = await anext(steps)
            while type(action) is Attempt:
                error: BaseException | None = None
                kwargs = self._begin(action)
                try:
                    async with gate._pool.lease(action.target, action.credential, seen) as client:
                        bound = attempt_bound(self._call.policy, action)  # from the lease on
                        # per event, asyncio.timeout only where the socket is not bounded
                        backstop = not is_instrumented(client)
                        with _otel.attempt_scope(turn):  # the SDK's HTTP spans nest under it
                            async with abounded(bound, backstop=backstop):
                                sdk = await self._call.op.bind(gate._configured(client))(**kwargs)
                        async with sdk:
                            events = aiter(sdk)
                            while True:
                                # the bound covers the wait for each event, never the caller
                                async with abounded(bound, backstop=backstop):
                                    event = await anext(events, _END)
                                if event is _END:
                                    break
                                for out in d.take(event):
                                    d.handed(out)
                                    yield out
                                if d.committed:
                                    bound.idle(self._call.policy.stream_idle_timeout)
                            d.end()
                except Exception as e:
                    error = e
                action = await steps.asend(self._outcome(error))
        finally:
            await steps.aclose()
        self._end(action)
