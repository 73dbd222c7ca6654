"""What the fault server sends on ``/v1/responses``: the OpenAI Responses API shapes.

A `response` object (a ``message`` output item with ``output_text`` content,
``function_call`` items for tool calls, ``usage``), and `ResponseEvents`, the
numbered SSE events of a streamed one: ``response.created``,
``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta``...,
``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done`` (for calls: ``response.function_call_arguments.delta``
/ ``.done``), ``response.completed``; or an ``error`` event. No I/O here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from .replies import IdentifiedCall, new_id, split, spoken, stream_error

__all__ = ["ResponseEvents", "error_event", "response", "usage"]

Event = dict[str, Any]


def _words(value: Any) -> int:
    """Words of a Responses ``input`` / ``instructions``: strings, items, content parts."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_words(v) for v in value)
    if isinstance(value, Mapping):
        for key in ("content", "text", "output", "arguments"):
            if key in value:
                return _words(value[key])
    return 1 if value else 0


def usage(request: Mapping[str, Any], said: str) -> dict[str, Any]:
    """Token counts (words) of the request's input and instructions, and of `said`."""
    given = _words(request.get("input")) + _words(request.get("instructions"))
    out = len(said.split())
    return {
        "input_tokens": given,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": given + out,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(ident: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _function_call(ident: str, call: IdentifiedCall, arguments: str, status: str) -> dict[str, Any]:
    call_id, c = call
    return {
        "id": ident,
        "type": "function_call",
        "call_id": call_id,
        "name": c.name,
        "arguments": arguments,
        "status": status,
    }


def _envelope(
    ident: str,
    created: int,
    model: str,
    request: Mapping[str, Any],
    status: str,
    output: list[dict[str, Any]],
    used: dict[str, Any] | None,
) -> dict[str, Any]:
    tools = request.get("tools")
    return {
        "id": ident,
        "object": "response",
        "created_at": created,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": request.get("store", True),
        "temperature": request.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": tools if isinstance(tools, list) else [],
        "top_p": request.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": used,
        "user": None,
        "metadata": request.get("metadata") or {},
    }


def response(
    model: str, request: Mapping[str, Any], text: str, calls: Sequence[IdentifiedCall] = ()
) -> dict[str, Any]:
    """A completed ``response``: a message with `text` (unless only calls are
    given), then a ``function_call`` item per call."""
    output = []
    if text or not calls:
        output.append(_message(new_id("msg_fault_"), text, "completed"))
    for call in calls:
        output.append(_function_call(new_id("fc_fault_"), call, call[1].arguments, "completed"))
    used = usage(request, spoken(text, calls))
    ident = new_id("resp_fault_")
    return _envelope(ident, int(time.time()), model, request, "completed", output, used)


def error_event(sequence: int, overrides: Mapping[str, Any] | None) -> Event:
    """A mid-stream ``error`` event. The API reference puts ``code``, ``message``
    and ``param`` at the top level; the live API nests them in ``error`` (which
    is what makes the Python SDK raise). Both are sent, so either reader sees it."""
    err = stream_error(overrides)
    return {
        "type": "error",
        "sequence_number": sequence,
        "code": err.get("code") or err.get("type"),
        "message": err.get("message"),
        "param": err.get("param"),
        "error": err,
    }


class ResponseEvents:
    """The events of one streamed response, numbered from 0 as they are made.
    Each method returns the events to send next, in order."""

    def __init__(self, model: str, request: Mapping[str, Any]) -> None:
        self.model, self.request = model, request
        self.id, self.created = new_id("resp_fault_"), int(time.time())
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # the items done so far
        self.text = ""
        self._message_id = ""

    def _event(self, type_: str, **fields: Any) -> Event:
        event = {"type": type_, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _snapshot(self, status: str, used: dict[str, Any] | None = None) -> dict[str, Any]:
        output = list(self.output) if status == "completed" else []
        return _envelope(self.id, self.created, self.model, self.request, status, output, used)

    def start(self) -> list[Event]:
        return [
            self._event("response.created", response=self._snapshot("in_progress")),
            self._event("response.in_progress", response=self._snapshot("in_progress")),
        ]

    def open_message(self) -> list[Event]:
        self._message_id = new_id("msg_fault_")
        where = {"item_id": self._message_id, "output_index": len(self.output)}
        return [
            self._event(
                "response.output_item.added",
                output_index=len(self.output),
                item=_message(self._message_id, None, "in_progress"),
            ),
            self._event(
                "response.content_part.added", **where, content_index=0, part=_text_part("")
            ),
        ]

    def delta(self, piece: str) -> Event:
        self.text += piece
        return self._event(
            "response.output_text.delta",
            item_id=self._message_id,
            output_index=len(self.output),
            content_index=0,
            delta=piece,
            logprobs=[],
        )

    def close_message(self) -> list[Event]:
        where = {"item_id": self._message_id, "output_index": len(self.output)}
        item = _message(self._message_id, self.text, "completed")
        events = [
            self._event(
                "response.output_text.done", **where, content_index=0, text=self.text, logprobs=[]
            ),
            self._event(
                "response.content_part.done", **where, content_index=0, part=_text_part(self.text)
            ),
            self._event("response.output_item.done", output_index=len(self.output), item=item),
        ]
        self.output.append(item)
        return events

    def function_call(self, call: IdentifiedCall, pieces: int) -> list[Event]:
        """One call: its item added, its arguments in `pieces` deltas, done."""
        ident, index = new_id("fc_fault_"), len(self.output)
        arguments = call[1].arguments
        where = {"item_id": ident, "output_index": index}
        events = [
            self._event(
                "response.output_item.added",
                output_index=index,
                item=_function_call(ident, call, "", "in_progress"),
            )
        ]
        for part in split(arguments, pieces):
            events.append(
                self._event("response.function_call_arguments.delta", **where, delta=part)
            )
        item = _function_call(ident, call, arguments, "completed")
        events += [
            self._event(
                "response.function_call_arguments.done",
                **where,
                name=call[1].name,
                arguments=arguments,
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]
        self.output.append(item)
        return events

    def completed(self, calls: Sequence[IdentifiedCall] = ()) -> Event:
        used = usage(self.request, spoken(self.text, calls))
        return self._event("response.completed", response=self._snapshot("completed", used))

    def error(self, overrides: Mapping[str, Any] | None) -> Event:
        event = error_event(self.sequence, overrides)
        self.sequence += 1
        return event
