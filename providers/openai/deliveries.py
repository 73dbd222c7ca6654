"""What a stream has handed to its caller, and when it commits: one class per API.

Both follow one rule. Events that carry no output yet (a chat stream's
role-only opener; a Responses stream's ``response.created``,
``response.in_progress``, ``response.output_item.added``, ...) are held back.
The first event with output (chat: content, audio, a refusal, tool calls, or a
``length`` finish, which ends a real reply even when it says nothing, while a
``content_filter`` one before any output is the content filter's, as without a stream;
the rule is `calls.StreamRule`, shared with the embedded client's peek; Responses:
``response.output_text.delta``, ``response.refusal.delta`` or
``response.function_call_arguments.delta``, or the stream's end with output) is
handed over with everything held before it, and from then on the stream is
*committed*: an error becomes `StreamInterrupted` carrying the text already
delivered. A stream that ends before its proper end (chat: a ``finish_reason``
other than ``error``; Responses: ``response.completed`` or
``response.incomplete``) counts as interrupted; one that ends before any output
(a bare ``stop``, usage only, ``finish_reason: "error"``) is a malformed reply,
retried or fallen back like any other fault, never an empty success. One whose
connection is cut after its proper end came (`Delivery.closed_after_end`: only a
usage chunk or ``[DONE]`` lost) is whole.

A continuation is one stream to the caller (`Delivery.fit`): its events take the
identity of the stream they continue (chat: the completion's id, no second role
opener; Responses: the response's and the message item's ids and indexes, the
sequence numbers going on, no second ``response.created`` or item opener), and the
events that close the answer (``response.output_text.done``, ``content_part.done``,
``output_item.done``, ``response.completed``) carry the whole text delivered.
"""

from __future__ import annotations

from typing import Any

import openai
from openai.types.chat import ChatCompletionChunk

from .calls import ENDINGS as ENDINGS  # (where readers of a stream found it before)
from .calls import OUTPUT_DELTAS, STREAMS
from .exceptions import MalformedReply, StreamInterrupted
from .http.phases import AttemptTimeout
from .http.transport import timeout_errors, transport_errors
from .seams import SEAM_WINDOW, drop_logprobs, may_repeat, part_text, parts_past, past, repeat
from .usage import Usage, usage_of

__all__ = ["ChatDelivery", "Delivery", "NotContinuable", "ResponsesDelivery", "delivery_for"]


class NotContinuable(Exception):
    """The engine asked to continue a stream that a text prefix cannot continue: the
    attempt is not sent (it fails as this, a bad request, and the turn moves on)."""


class Delivery:
    """The bookkeeping both APIs share; subclasses say what an event means."""

    __slots__ = (
        "choices",
        "count",
        "ended",
        "finished",
        "first",
        "held",
        "other",
        "pending",
        "pieces",
        "seam",
        "seams",
        "since",
        "spoke",
        "text_closed",
        "usage",
    )

    #: What a stream with no output is called in errors.
    nothing = "the stream ended before any content"

    def __init__(self, choices: int = 1) -> None:
        #: the choices the request asked for (``n``): a stream has ended only once each
        #: finished, and one of several is never continued (one text prefix cannot carry
        #: them), whichever choices spoke yet
        self.choices = choices
        self.held: list[Any] = []
        self.pieces: list[str] = []
        self.count = 0
        self.finished = False
        #: an attempt reached the stream's proper end before it broke: the answer is
        #: closed, nothing may follow it (a break after it is not continued)
        self.ended = False
        self.usage: Usage | None = None
        #: events handed before the current attempt (a continuation's start)
        self.since = 0
        #: while a continuation's first output is weighed against the delivered text's end:
        #: that end, and the output events held meanwhile
        self.seam: str | None = None
        self.pending: list[Any] = []
        #: per continuation: (characters delivered before it, characters it repeated)
        self.seams: list[tuple[int, int]] = []
        #: output other than text was handed (tool calls, a refusal, audio, content
        #: parts): a prefix of text cannot say where such a stream broke, so it is not
        #: continued
        self.other = False
        #: what identifies the stream the caller sees (ids, indexes, the last sequence
        #: number), noted from the events handed; a continuation's are rewritten to it
        self.first: dict[str, Any] = {}
        #: this attempt's stream said something (output, or reasoning held back): it is
        #: working, not silent (its bound lifts the hold: `AttemptBound.event`)
        self.spoke = False
        #: this attempt closed its text (a Responses message item done): nothing follows it
        self.text_closed = False

    @property
    def committed(self) -> bool:
        return self.count > 0

    @property
    def handing(self) -> bool:
        """Has this attempt handed the caller anything (a continuation, before it does,
        is bounded like a stream that has said nothing: `AttemptBound.event`)?"""
        return self.count > self.since

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def begin(self, prefix: str | None = None) -> None:
        """A new attempt starts: whatever an earlier one held back is dropped. `prefix`:
        it continues the stream, whose delivered text that is."""
        self.held = []
        self.pending = []
        self.finished = False
        self.usage = None
        self.since = self.count
        self.seam = prefix[-SEAM_WINDOW:] if prefix else None
        self.spoke = False
        self.text_closed = False

    def payload(self, event: Any) -> bool:
        """Check `event` (raise on a bad one), note its ending and usage; does it
        carry output?"""
        raise NotImplementedError

    def text_of(self, event: Any) -> str:
        raise NotImplementedError

    def with_text(self, event: Any, text: str) -> Any:
        """`event` with its text output replaced by `text` (a copy)."""
        raise NotImplementedError

    def keeps(self, event: Any) -> bool:
        """Does `event`, its text trimmed away at a seam, still say something?"""
        return self.payload(event)

    def says(self, event: Any) -> bool:
        """Does `event` say anything (output, reasoning), committing or not?"""
        return False

    def take(self, event: Any) -> list[Any]:
        """The events to hand over now (possibly none, possibly the held ones too)."""
        output = self.payload(event)
        self.spoke = self.spoke or output or self.says(event)
        if not output and self.count == self.since and not self.pending:
            self.held.append(event)  # nothing of this attempt's output handed yet
            return []
        out = [*self.held, event]
        self.held = []
        if self.seam is None:
            return self._fitted(out)
        self.pending += out
        return self._fitted(self._weigh(final=False))

    def _fitted(self, events: list[Any]) -> list[Any]:
        if not self.since:
            return events  # the stream's first attempt: nothing to fit to
        out: list[Any] = []
        ahead = ""  # the text of this batch's events before the one being fitted
        for e in events:
            f = self.fit(e, self.text + ahead)
            if f is not None:
                out.append(f)
                ahead += self.text_of(f)
        return out

    def fit(self, event: Any, whole: str) -> Any | None:
        """A continuation's `event` as the stream it continues would have sent it (None:
        it has no place there, as a second opener); `whole`: the text delivered by then."""
        return event

    def _weigh(self, final: bool) -> list[Any]:
        """A continuation's first output against the delivered text's end: hold it while
        it may still be a repeat of that end; then drop the longest repeat and hand the
        rest over (`final`: the attempt ended, decide with what came)."""
        seam = self.seam
        assert seam is not None
        said = "".join(self.text_of(e) for e in self.pending)
        if not final and may_repeat(seam, said):
            return []
        cut = repeat(seam, said)
        self.seams.append((len(self.text), cut))
        self.seam = None
        out, self.pending = self.pending, []
        if not cut:
            return out
        kept = []
        for e in out:
            t = self.text_of(e)
            if not t or not cut:
                pass  # no text to trim (an opener before the first delta), or trimmed
            elif cut >= len(t):
                cut -= len(t)
                e = self.with_text(e, "")
                if not self.keeps(e):
                    continue  # only the repeated text: nothing left to hand over
            else:
                e, cut = self.with_text(e, t[cut:]), 0
            kept.append(e)
        return kept

    def handed(self, event: Any) -> None:
        self.count += 1
        self.pieces.append(self.text_of(event))
        self.other = self.other or self.beyond_text(event)
        self.note(event)

    def note(self, event: Any) -> None:
        """Note what identifies the stream from an event handed to the caller."""

    def beyond_text(self, event: Any) -> bool:
        """Does `event` carry output other than text (tool calls, a refusal, audio,
        content parts)?"""
        return False

    def uncontinuable(self) -> str | None:
        """Why a text prefix cannot continue this stream (it handed output the prefix
        cannot carry, so the continuation would send it again, or it had reached its
        end); None when it can."""
        if self.ended:
            return "the stream reached its end before it broke: nothing follows"
        if self.choices > 1:
            return (
                "the request asked for several choices (n > 1): a text prefix cannot continue them"
            )
        if self.other:
            return (
                "the stream delivered more than text (tool calls, a refusal, content parts): a "
                "text prefix cannot continue it"
            )
        return None

    def check_continuable(self) -> None:
        """Raise `NotContinuable` when a continuation of this stream cannot be sent
        (`uncontinuable`): the break said so, so the engine never asks for one."""
        why = self.uncontinuable()
        if why is not None:
            raise NotContinuable(why)

    def end(self) -> list[Any]:
        """The SDK's iterator ended without an error: was the stream complete? What is
        left to hand over (a continuation's output held at the seam, or the ending of
        one that had nothing more to say)."""
        if not self.committed:
            self.held = []
            raise MalformedReply(self.nothing)
        if not self.finished:
            raise StreamInterrupted(self.text, self.count)
        out = self._weigh(final=True) if self.seam is not None and self.pending else []
        if not out and self.count == self.since:
            out = self.held
        self.held = []
        return self._fitted(out)

    def closed_after_end(self, e: BaseException) -> bool:
        """Did only the stream's close fail (`e`, a cut or a timer of the transport) after
        its proper end came (chat: a finish_reason; Responses: ``response.completed``)?
        Then the answer is whole: at most a usage chunk or ``[DONE]`` was lost."""
        return self.finished and self.committed and isinstance(e, cut_errors())

    def failure(self, e: BaseException) -> BaseException:
        """What the attempt that just broke comes to. Once this attempt handed output
        the stream is interrupted (carrying everything delivered); a continuation that
        handed nothing fails as itself (its own 400, cut, timeout: classified as such,
        and the machine reports the first break)."""
        if self.finished or self.text_closed:
            self.ended = True
        if isinstance(e, StreamInterrupted) or self.count == self.since:
            return e
        return StreamInterrupted(self.text, self.count, e)


def cut_errors() -> tuple[type[BaseException], ...]:
    """A stream's connection failing, or a timer of its transport: the SDK's connection
    error (its timeout among them), the HTTP libraries' transport errors and timeouts,
    an attempt bound; never an error the stream itself sent."""
    return (openai.APIConnectionError, AttemptTimeout, *transport_errors(), *timeout_errors())


class ChatDelivery(Delivery):
    """Chat completion chunks (`ChatCompletionChunk`). With several choices (``n``) the
    stream has ended only once every choice it spoke of gave its finish_reason."""

    __slots__ = ("_open",)

    def __init__(self, choices: int = 1) -> None:
        super().__init__(choices)
        self._open: set[int] = set()  # the choices of this attempt not finished yet

    def begin(self, prefix: str | None = None) -> None:
        super().begin(prefix)
        self._open = set()

    def payload(self, event: Any) -> bool:
        choices = getattr(event, "choices", None)
        if not isinstance(event, ChatCompletionChunk) or not isinstance(choices, list):
            raise MalformedReply(
                f"stream event is not a chat completion chunk ({type(event).__name__})"
            )
        if getattr(event, "usage", None) is not None:
            self.usage = usage_of(event)  # usage alone is no output (it comes last)
        # the one rule of every stream reader (`calls.StreamRule`): `_open` is its record
        # of this attempt's choices (an index open, its ``~`` finished)
        found = STREAMS.chat(event, self._open, said=self.committed)
        self.finished = STREAMS.ended(self._open, self.choices)
        return found

    def says(self, event: Any) -> bool:
        return STREAMS.reasoning(event)

    def text_of(self, event: Any) -> str:
        parts = []
        for choice in getattr(event, "choices", None) or ():
            delta = getattr(choice, "delta", None)
            content = getattr(delta, "content", None) if delta is not None else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):  # content parts: their text is what was said
                parts += (part_text(part) for part in content)
        return "".join(parts)

    def keeps(self, event: Any) -> bool:
        return self.payload(event) or any(c.finish_reason for c in event.choices)

    def beyond_text(self, event: Any) -> bool:
        for choice in getattr(event, "choices", None) or ():
            if getattr(choice, "index", 0):
                return True  # several choices: one text prefix cannot continue them
            delta = getattr(choice, "delta", None)
            if delta is not None and any(
                getattr(delta, name, None)
                for name in ("refusal", "tool_calls", "function_call", "audio")
            ):
                return True
            if delta is not None and isinstance(getattr(delta, "content", None), list):
                return True  # content parts (a thinking part, say): no text prefix holds them
        return False

    def with_text(self, event: Any, text: str) -> Any:
        """The chunk with its content cut to `text` (its end: a seam trims the front), and
        the logprobs of the tokens cut away dropped with them."""
        copy = event.model_copy(deep=True)
        for choice in copy.choices:
            content = choice.delta.content if choice.delta is not None else None
            if isinstance(content, str):
                cut = len(content) - len(text)
                choice.delta.content, text = text, ""
                drop_logprobs(choice, cut)
            elif isinstance(content, list):  # content parts: their text trimmed from the front
                cut = sum(len(part_text(p)) for p in content) - len(text)
                choice.delta.content, text = parts_past(content, cut), ""
                drop_logprobs(choice, cut)
        return copy

    def note(self, event: Any) -> None:
        self.first.setdefault("id", getattr(event, "id", None))

    def fit(self, event: Any, whole: str) -> Any | None:
        """The continuation's chunks carry the first completion's id, and no second
        ``role`` (the assistant's message goes on)."""
        copy = event.model_copy(deep=True)
        if self.first.get("id") is not None:
            copy.id = self.first["id"]
        for choice in copy.choices:
            if choice.delta is not None:
                choice.delta.role = None
        return copy


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
        if kind == "response.output_item.done" and self.committed:
            item = getattr(event, "item", None)
            self.text_closed = self.text_closed or getattr(item, "type", None) == "message"
        # the one rule of every stream reader (`calls.StreamRule`)
        output, ends = STREAMS.responses(event, kind, said=self.committed)
        if ends:
            self.finished = True
            self.usage = usage_of(event)
        return output

    def says(self, event: Any) -> bool:
        return STREAMS.reasoning(event)

    def text_of(self, event: Any) -> str:
        if getattr(event, "type", None) == "response.output_text.delta":
            delta = getattr(event, "delta", "")
            return delta if isinstance(delta, str) else ""
        return ""

    def beyond_text(self, event: Any) -> bool:
        kind = getattr(event, "type", None)
        return kind in OUTPUT_DELTAS and kind != "response.output_text.delta"

    def with_text(self, event: Any, text: str) -> Any:
        """The delta cut to `text` (its end), the logprobs of what was cut dropped too."""
        if getattr(event, "type", None) == "response.output_text.delta":
            update: dict[str, Any] = {"delta": text}
            tokens = getattr(event, "logprobs", None)
            cut = len(event.delta) - len(text)
            if cut > 0 and isinstance(tokens, list):
                update["logprobs"] = past(tokens, cut)
            return event.model_copy(update=update)
        return event

    def note(self, event: Any) -> None:
        if event.type in _TEXT_CLOSERS and _message_part(event):
            self.text_closed = True  # the text was closed: nothing may follow it
        first = self.first
        seq = getattr(event, "sequence_number", None)
        if isinstance(seq, int):
            first["seq"] = seq
        if self.since:
            return  # a continuation's own ids were rewritten to these
        response = getattr(event, "response", None)
        if response is not None and getattr(response, "id", None):
            first.setdefault("response", response.id)
        item: Any = getattr(event, "item", None)
        if event.type == "response.output_item.added" and getattr(item, "type", None) == "message":
            first.setdefault("item", (item.id, event.output_index))
        elif event.type == "response.output_item.done" and item is not None:
            first.setdefault("done", {})[event.output_index] = item  # reasoning before the text
        if isinstance(getattr(event, "output_index", None), int):
            first["last"] = max(first.get("last", -1), event.output_index)

    def fit(self, event: Any, whole: str) -> Any | None:
        """A continuation's events under the continued stream's response, message item
        and sequence: its openers dropped (noting its own message item), its reasoning
        dropped (a text prefix continues the message only), the message's closing events
        with the whole text delivered. An item the answer goes on with after the message
        (a function call) is handed as the stream's next item; one instead of the message
        is no continuation of the text (`MalformedReply`: the next target continues)."""
        kind = event.type
        first = self.first
        item: Any = getattr(event, "item", None)
        extra: dict[int, int] = first.setdefault("extra", {})
        if kind == "response.output_item.added":
            what = getattr(item, "type", None)
            if what == "message":
                first["own"] = (item.id, event.output_index)
                return None
            if what == "reasoning" or "reasoning" in str(what):
                return None
            if first.get("own") is None:
                raise MalformedReply(
                    f"the continuation answered with a {what} item, not the rest of the text"
                )
            first["last"] = extra[event.output_index] = first.get("last", -1) + 1
            first.setdefault("extra_ids", {})[getattr(item, "id", None)] = extra[event.output_index]
        elif kind in _OPENERS:
            return None
        own, orig = first.get("own"), first.get("item")
        update: dict[str, Any] = {}
        index = getattr(event, "output_index", None)
        if index is not None and index in extra:
            update["output_index"] = extra[index]
        elif index is not None:
            if own is None or index != own[1]:
                return None  # another item of the continuation (its reasoning, say)
            if orig is not None:
                update["output_index"] = orig[1]
                if getattr(event, "item_id", None) is not None:
                    update["item_id"] = orig[0]
        if "seq" in first and isinstance(getattr(event, "sequence_number", None), int):
            first["seq"] = update["sequence_number"] = first["seq"] + 1
        if kind == "response.output_text.done":
            update["text"] = whole
        copy = event.model_copy(update=update, deep=True) if update else event.model_copy(deep=True)
        part: Any = getattr(copy, "part", None)
        if kind == "response.content_part.done" and getattr(part, "type", None) == "output_text":
            part.text = whole
        if kind == "response.output_item.done":
            _whole_message(copy.item, orig, whole)
        response = getattr(copy, "response", None)
        if response is not None:
            if first.get("response"):
                response.id = first["response"]
            output = getattr(response, "output", None)
            if output:  # the continued stream's items, then its message, whole
                kept = [o for o in output if own is None or getattr(o, "id", None) == own[0]]
                for out in kept:
                    _whole_message(out, orig, whole)
                items = {k: v for k, v in first.get("done", {}).items() if v.type != "message"}
                ids = first.get("extra_ids", {})
                after = [(ids[o.id], o) for o in output if getattr(o, "id", None) in ids]
                if orig is not None and kept:
                    items[orig[1]] = kept[0]
                    items.update(after)
                    response.output = [items[k] for k in sorted(items)]
                else:
                    ahead = [items[k] for k in sorted(items)]
                    response.output = [*ahead, *kept, *(o for _, o in sorted(after))]
        return copy


#: Events that close a Responses stream's text: nothing may follow them.
_TEXT_CLOSERS = frozenset({"response.output_text.done", "response.content_part.done"})


def _message_part(event: Any) -> bool:
    """Is a closing event about the message's text (not a reasoning item's
    ``reasoning_text`` part, which gpt-oss-style models stream before the message)?"""
    part = getattr(event, "part", None)
    return part is None or getattr(part, "type", None) in ("output_text", "refusal")


#: A continuation's events that open what the continued stream opened already.
_OPENERS = frozenset(
    {
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    }
)


def _whole_message(item: Any, orig: tuple[str, int] | None, text: str) -> None:
    """A continuation's message item as the continued one: its id, the whole text."""
    if getattr(item, "type", None) != "message":
        return
    if orig is not None:
        item.id = orig[0]
    for part in getattr(item, "content", None) or ():
        if getattr(part, "type", None) == "output_text":
            part.text = text
            break


def delivery_for(kind: str | None, kwargs: Any = None) -> Delivery:
    """The delivery for an `Op`'s stream kind; `kwargs`, the caller's request (``n``)."""
    if kind == "responses":
        return ResponsesDelivery()
    n = kwargs.get("n") if hasattr(kwargs, "get") else None
    return ChatDelivery(n if isinstance(n, int) and n > 1 else 1)
