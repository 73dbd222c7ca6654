"""Streaming turns: the sans-IO `fsm.Turn` driven from inside a (async) generator.

Before the first chunk with content reaches the caller, a failing stream is an
ordinary outcome: retried, rotated or fallen back like any other. Leading
chunks without content (the role-only opener) are held back until content
arrives, so a stream that dies before saying anything costs the caller
nothing. Once a chunk has been handed over the turn is *committed*: a later
error becomes `stream_interrupted` carrying the text already delivered, and
the caller gets `fsm.TurnFailed` with `.partial` — never a replay, never
duplicate text. (With ``continue_streams`` the policy may ask for another
attempt; it is sent with the delivered text as an assistant prefix.)
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from openai.types.chat import ChatCompletionChunk

from fsm import Action, Attempt, Finish, Outcome, Turn, TurnResult
from fsm.drivers import _Step
from fsm.host import ahost_loop, host_loop
from fsm.trace import TraceEvent

from .classify import MalformedReply, StreamInterrupted, classify_openai

if TYPE_CHECKING:
    from .openai_adapter import AsyncFallgate, Fallgate, _Request

__all__ = ["AsyncFallgateStream", "FallgateStream"]


def _has_payload(chunk: Any) -> bool:
    """Does this chunk carry anything the caller cares about (text, tools, an ending)?"""
    if getattr(chunk, "usage", None) is not None:
        return True
    for choice in getattr(chunk, "choices", None) or ():
        if getattr(choice, "finish_reason", None):
            return True
        delta = getattr(choice, "delta", None)
        if delta is None:
            continue
        for name in ("content", "refusal", "tool_calls", "function_call"):
            if getattr(delta, name, None):
                return True
    return False


def _text_of(chunk: Any) -> str:
    parts = []
    for choice in getattr(chunk, "choices", None) or ():
        delta = getattr(choice, "delta", None)
        content = getattr(delta, "content", None) if delta is not None else None
        if isinstance(content, str):
            parts.append(content)
    return "".join(parts)


class _Delivery:
    """What has reached the caller so far, and what is being held back."""

    __slots__ = ("count", "finished", "held", "pieces")

    def __init__(self) -> None:
        self.held: list[Any] = []
        self.pieces: list[str] = []
        self.count = 0
        self.finished = False

    @property
    def committed(self) -> bool:
        return self.count > 0

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def begin(self) -> None:
        """A new attempt starts: whatever an earlier one held back is dropped."""
        self.held = []
        self.finished = False

    def take(self, chunk: Any) -> list[Any]:
        """The chunks to hand over now (possibly none, possibly the held ones too)."""
        if not isinstance(chunk, ChatCompletionChunk) or not isinstance(
            getattr(chunk, "choices", None), list
        ):
            raise MalformedReply(
                f"stream event is not a chat completion chunk ({type(chunk).__name__})"
            )
        if any(getattr(c, "finish_reason", None) for c in chunk.choices):
            self.finished = True
        if not self.committed and not _has_payload(chunk):
            self.held.append(chunk)
            return []
        out = [*self.held, chunk]
        self.held = []
        return out

    def handed(self, chunk: Any) -> None:
        self.count += 1
        self.pieces.append(_text_of(chunk))

    def end(self) -> None:
        """The SDK's iterator ended without an error: was the stream complete?"""
        if not self.committed:
            self.held = []
            raise MalformedReply("the stream ended before any content")
        if not self.finished:
            raise StreamInterrupted(self.text, self.count)

    def failure(self, e: BaseException) -> BaseException:
        if self.committed and not isinstance(e, StreamInterrupted):
            return StreamInterrupted(self.text, self.count, e)
        return e


class _StreamBase:
    """State shared by the sync and async stream wrappers."""

    result: TurnResult | None

    def __init__(self, gate: Fallgate | AsyncFallgate, request: _Request) -> None:
        self._gate = gate
        self._request = request
        self._delivery = _Delivery()
        self._step = _Step(
            gate.policy, classify_openai, gate.health, gate.on_transition, gate.clock, None, Turn
        )
        self.result = None

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

    def _kwargs(self, a: Attempt) -> dict[str, Any]:
        d = self._delivery
        return self._request.call_kwargs(
            a, self._gate.timeout, stream=True, prefix=d.text if d.committed else None
        )

    def _outcome(self, error: BaseException | None) -> Outcome:
        """What the attempt that just ended came to."""
        if error is None:
            return Outcome.success(self._delivery.text)
        return self._step.outcome_of(self._delivery.failure(error))

    def _end(self, action: Action) -> None:
        """Keep a finished turn's result; a failed one raises its `TurnFailed`."""
        if type(action) is Finish:
            self.result = self._step.result(action)
        else:
            self._step.end(action)


class FallgateStream(_StreamBase):
    """What `Fallgate.chat.completions.create(stream=True)` returns: an iterator of
    the SDK's `ChatCompletionChunk`, and a context manager that ends the turn.

    Creating it runs the turn up to the first chunk, so failures before any
    output raise `fsm.TurnFailed` from `create()` itself, as the SDK does.
    """

    def __init__(self, gate: Fallgate, request: _Request) -> None:
        super().__init__(gate, request)
        self._sync_gate = gate
        self._gen = self._run()
        self._first: ChatCompletionChunk | None = None
        try:
            self._first = next(self._gen)
        except StopIteration:  # pragma: no cover - a finished turn has delivered a chunk
            pass

    def __iter__(self) -> Iterator[ChatCompletionChunk]:
        return self

    def __next__(self) -> ChatCompletionChunk:
        if self._first is not None:
            chunk, self._first = self._first, None
            return chunk
        return next(self._gen)

    def close(self) -> None:
        """Stop early: the turn ends `aborted` and the connection is released."""
        self._first = None
        self._gen.close()

    def __enter__(self) -> FallgateStream:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _run(self) -> Generator[ChatCompletionChunk, None, None]:
        """The turn on the host loop; this generator makes the attempts, handing
        each chunk to the caller as it arrives. Closing it closes the loop, which
        ends the turn `aborted`."""
        gate, d = self._sync_gate, self._delivery
        steps = host_loop(self._step.turn, clock=self._step.clock, rebuild=gate._pool.rebuild)
        try:
            action = next(steps)
            while type(action) is Attempt:
                error: BaseException | None = None
                try:
                    with gate._pool.lease(action.target, action.credential) as client:
                        sdk = client.chat.completions.create(**self._kwargs(action))
                        with sdk:
                            d.begin()
                            for chunk in sdk:
                                for out in d.take(chunk):
                                    d.handed(out)
                                    yield out
                            d.end()
                except Exception as e:
                    error = e
                action = steps.send(self._outcome(error))
        finally:
            steps.close()
        self._end(action)


class AsyncFallgateStream(_StreamBase):
    """The async twin: an async iterator of `ChatCompletionChunk` and an async
    context manager. Get it with ``await aclient.chat.completions.create(stream=True)``."""

    def __init__(self, gate: AsyncFallgate, request: _Request) -> None:
        super().__init__(gate, request)
        self._async_gate = gate
        self._agen = self._run()
        self._first: ChatCompletionChunk | None = None
        self._exhausted = False

    async def _prime(self) -> AsyncFallgateStream:
        try:
            self._first = await self._agen.__anext__()
        except StopAsyncIteration:  # pragma: no cover - see FallgateStream
            self._exhausted = True
        return self

    def __aiter__(self) -> AsyncIterator[ChatCompletionChunk]:
        return self

    async def __anext__(self) -> ChatCompletionChunk:
        if self._first is not None:
            chunk, self._first = self._first, None
            return chunk
        if self._exhausted:
            raise StopAsyncIteration
        return await self._agen.__anext__()

    async def aclose(self) -> None:
        """Stop early: the turn ends `aborted` and the connection is released."""
        self._first = None
        await self._agen.aclose()

    close = aclose

    async def __aenter__(self) -> AsyncFallgateStream:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _run(self) -> AsyncGenerator[ChatCompletionChunk, None]:
        """The turn on the asyncio host loop (see `FallgateStream._run`)."""
        gate, d = self._async_gate, self._delivery
        steps = ahost_loop(self._step.turn, clock=self._step.clock, rebuild=gate._pool.rebuild)
        try:
            action = await anext(steps)
            while type(action) is Attempt:
                error: BaseException | None = None
                try:
                    async with gate._pool.lease(action.target, action.credential) as client:
                        sdk = await client.chat.completions.create(**self._kwargs(action))
                        async with sdk:
                            d.begin()
                            async for chunk in sdk:
                                for out in d.take(chunk):
                                    d.handed(out)
                                    yield out
                            d.end()
                except Exception as e:
                    error = e
                action = await steps.asend(self._outcome(error))
        finally:
            await steps.aclose()
        self._end(action)
