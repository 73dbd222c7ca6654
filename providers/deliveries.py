"""What a stream has handed to its caller, and when it commits: one class per API.

Both follow one rule. Events that carry no output yet (a chat stream's
role-only opener; a Responses stream's ``response.created``,
``response.in_progress``, ``response.output_item.added``, ...) are held back.
The first event with output (chat: content, a refusal, tool calls, or a
``length`` / ``content_filter`` finish, which end a real reply even when it says
nothing; Responses: ``response.output_text.delta``, ``response.refusal.delta`` or
``response.function_call_arguments.delta``, or the stream's end with output) is
handed over with everything held before it, and from then on the stream is
*committed*: an error becomes `StreamInterrupted` carrying the text already
delivered. A stream that ends before its proper end (chat: a ``finish_reason``
other than ``error``; Responses: ``response.completed`` or
``response.incomplete``) counts as interrupted; one that ends before any output
(a bare ``stop``, usage only, ``finish_reason: "error"``) is a malformed reply,
retried or fallen back like any other fault, never an empty success.
"""

from __future__ import annotations

from typing import Any

from openai.types.chat import ChatCompletionChunk

from .classify import FailedReply, MalformedReply, StreamInterrupted
from .usage import Usage, usage_of

__all__ = ["ChatDelivery", "Delivery", "ResponsesDelivery", "delivery_for"]


class Delivery:
    """The bookkeeping both APIs share; subclasses say what an event means."""

    __slots__ = ("count", "finished", "held", "pieces", "usage")

    #: What a stream with no output is called in errors.
    nothing = "the stream ended before any content"

    def __init__(self) -> None:
        self.held: list[Any] = []
        self.pieces: list[str] = []
        self.count = 0
        self.finished = False
        self.usage: Usage | None = None

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
        self.usage = None

    def payload(self, event: Any) -> bool:
        """Check `event` (raise on a bad one), note its ending and usage; does it
        carry output?"""
        raise NotImplementedError

    def text_of(self, event: Any) -> str:
        raise NotImplementedError

    def take(self, event: Any) -> list[Any]:
        """The events to hand over now (possibly none, possibly the held ones too)."""
        if not self.payload(event) and not self.committed:
            self.held.append(event)
            return []
        out = [*self.held, event]
        self.held = []
        return out

    def handed(self, event: Any) -> None:
        self.count += 1
        self.pieces.append(self.text_of(event))

    def end(self) -> None:
        """The SDK's iterator ended without an error: was the stream complete?"""
        if not self.committed:
            self.held = []
            raise MalformedReply(self.nothing)
        if not self.finished:
            raise StreamInterrupted(self.text, self.count)

    def failure(self, e: BaseException) -> BaseException:
        if self.committed and not isinstance(e, StreamInterrupted):
            return StreamInterrupted(self.text, self.count, e)
        return e


class ChatDelivery(Delivery):
    """Chat completion chunks (`ChatCompletionChunk`)."""

    __slots__ = ()

    def payload(self, event: Any) -> bool:
        choices = getattr(event, "choices", None)
        if not isinstance(event, ChatCompletionChunk) or not isinstance(choices, list):
            raise MalformedReply(
                f"stream event is not a chat completion chunk ({type(event).__name__})"
            )
        found = False
        if getattr(event, "usage", None) is not None:
            self.usage = usage_of(event)  # usage alone is no output (it comes last)
        for choice in choices:
            finish = getattr(choice, "finish_reason", None)
            if finish == "error":
                # OpenRouter ends a stream it cannot finish with finish_reason "error" (and
                # the choice's error object): never a success, interrupted once committed.
                error = getattr(choice, "error", None)
                if isinstance(error, dict) and error:
                    raise FailedReply(error)
                raise MalformedReply("the stream ended with finish_reason 'error'")
            if finish:
                self.finished = True
                found = found or finish in EMPTY_BUT_REAL
            delta = getattr(choice, "delta", None)
            if delta is not None and any(
                getattr(delta, name, None)
                for name in ("content", "refusal", "tool_calls", "function_call")
            ):
                found = True
        return found

    def text_of(self, event: Any) -> str:
        parts = []
        for choice in getattr(event, "choices", None) or ():
            delta = getattr(choice, "delta", None)
            content = getattr(delta, "content", None) if delta is not None else None
            if isinstance(content, str):
                parts.append(content)
        return "".join(parts)


#: Finish reasons that end a real chat reply even with nothing said: the caller's token
#: limit, the content filter (classified as such, as without a stream).
EMPTY_BUT_REAL = frozenset({"length", "content_filter"})

#: Responses stream events that carry output: the first one commits the stream.
OUTPUT_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
    }
)
#: The events that end a whole Responses stream.
ENDINGS = frozenset({"response.completed", "response.incomplete"})


class ResponsesDelivery(Delivery):
    """Responses API stream events (``response.*``)."""

    __slots__ = ()
    nothing = "the stream ended before any output"

    def payload(self, event: Any) -> bool:
        kind = getattr(event, "type", None)
        if not isinstance(kind, str):
            raise MalformedReply(
                f"stream event is not a Responses API event ({type(event).__name__})"
            )
        if kind == "response.failed":
            raise FailedReply(getattr(getattr(event, "response", None), "error", None))
        if kind == "error":  # the SDK raises on these; a bare one is still an error
            raise FailedReply(
                {"code": getattr(event, "code", None), "message": getattr(event, "message", None)}
            )
        if kind in ENDINGS:
            if not self.committed and kind == "response.completed":
                if not getattr(getattr(event, "response", None), "output", None):
                    raise MalformedReply("the stream completed without any output")
            self.finished = True
            self.usage = usage_of(event)
            return True
        return kind in OUTPUT_DELTAS

    def text_of(self, event: Any) -> str:
        if getattr(event, "type", None) == "response.output_text.delta":
            delta = getattr(event, "delta", "")
            return delta if isinstance(delta, str) else ""
        return ""


def delivery_for(kind: str | None) -> Delivery:
    """The delivery for an `Op`'s stream kind."""
    return ResponsesDelivery() if kind == "responses" else ChatDelivery()
