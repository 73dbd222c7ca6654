"""``chat.completions.stream`` and ``responses.stream`` on the wrappers: the SDK's own
stream helpers over a fallgate stream.

    with gate.chat.completions.stream(messages=[...]) as stream:
        for event in stream:                 # content.delta, tool_calls..., chunk
            ...
        final = stream.get_final_completion()

The SDK's managers (`ChatCompletionStreamManager`, `ResponseStreamManager` and their
async twins) accumulate the events and parse structured output (``response_format=``
/ ``text_format=`` a pydantic model) from any stream of chunks. Here that stream is a
turn's (`providers.openai.streaming`): the events come from whichever target answered,
commit at the first one with output, and a failure after that raises `fsm.TurnFailed`
with the partial text, as ``create(stream=True)`` does.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from copy import copy
from typing import TYPE_CHECKING, Any

import openai
from openai.lib import _parsing
from openai.lib._parsing._responses import type_to_text_format_param
from openai.lib.streaming.chat import AsyncChatCompletionStreamManager, ChatCompletionStreamManager
from openai.lib.streaming.responses import AsyncResponseStreamManager, ResponseStreamManager

from .calls import CHAT_CREATE, RESPONSES_CREATE
from .http.timeouts import given

if TYPE_CHECKING:
    from .client import AsyncFallgate, Fallgate

__all__ = ["async_chat_stream", "async_responses_stream", "chat_stream", "responses_stream"]


class _Raw:
    """A fallgate stream as the SDK's helpers see a raw stream: iterable, with a
    ``response`` whose ``close`` / ``aclose`` ends it (and with it the turn)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.response = self

    def __iter__(self) -> Any:
        return iter(self._stream)

    def __aiter__(self) -> Any:
        return self._stream.__aiter__()

    def close(self) -> None:
        self._stream.close()

    async def aclose(self) -> None:
        await self._stream.aclose()


def _chat_tools(tools: Any) -> Any:
    """The tools as the SDK's ``stream`` sends them (3.x materialises pydantic tools)."""
    if not given(tools):
        return openai.omit
    materialize = getattr(_parsing, "materialize_input_tools", None)
    if materialize is not None:
        return materialize(tools)
    _parsing.validate_input_tools(tools)
    return tools


def _chat_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    kw = dict(kwargs)
    if "stream" in kw:
        raise TypeError("chat.completions.stream() always streams: leave out stream=")
    response_format = kw.pop("response_format", openai.omit)
    tools = _chat_tools(kw.pop("tools", openai.omit))
    if given(tools):
        kw["tools"] = tools
    if given(response_format):
        kw["response_format"] = _parsing.type_to_response_format_param(response_format)
    kw["stream"] = True
    return kw, response_format, tools


def _make_tools(tools: Any) -> Any:
    """Responses tools as the SDK's ``stream`` sends them (pydantic function tools made
    into their JSON schema), by the SDK's own helper where it has one."""
    for where in ("openai.lib._response_resources", "openai.resources.responses.responses"):
        try:
            make = getattr(importlib.import_module(where), "_make_tools", None)
        except ImportError:
            continue
        if make is not None:
            return make(tools)
    return tools


def _responses_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    kw = dict(kwargs)
    if "stream" in kw:
        raise TypeError("responses.stream() always streams: leave out stream=")
    text_format = kw.pop("text_format", openai.omit)
    if given(text_format):
        text = copy(kw.get("text") or {})
        if "format" in text:
            raise TypeError("Cannot mix and match text.format with text_format")
        text["format"] = type_to_text_format_param(text_format)
        kw["text"] = text
    tools = kw.get("tools", openai.omit)
    if given(tools):
        tools = kw["tools"] = _make_tools(tools)
    kw["stream"] = True
    return kw, text_format, tools


def chat_stream(gate: Fallgate, kwargs: dict[str, Any]) -> ChatCompletionStreamManager[Any]:
    kw, response_format, tools = _chat_kwargs(kwargs)
    request: Callable[[], Any] = lambda: _Raw(gate._invoke(CHAT_CREATE, kw))  # noqa: E731
    return ChatCompletionStreamManager(request, response_format=response_format, input_tools=tools)


def async_chat_stream(
    gate: AsyncFallgate, kwargs: dict[str, Any]
) -> AsyncChatCompletionStreamManager[Any]:
    kw, response_format, tools = _chat_kwargs(kwargs)

    async def request() -> Any:
        return _Raw(await gate._invoke(CHAT_CREATE, kw))

    pending: Awaitable[Any] = request()
    return AsyncChatCompletionStreamManager(
        pending, response_format=response_format, input_tools=tools
    )


def responses_stream(gate: Fallgate, kwargs: dict[str, Any]) -> ResponseStreamManager[Any]:
    kw, text_format, tools = _responses_kwargs(kwargs)
    request: Callable[[], Any] = lambda: _Raw(gate._invoke(RESPONSES_CREATE, kw))  # noqa: E731
    return ResponseStreamManager(
        request, text_format=text_format, input_tools=tools, starting_after=None
    )


def async_responses_stream(
    gate: AsyncFallgate, kwargs: dict[str, Any]
) -> AsyncResponseStreamManager[Any]:
    kw, text_format, tools = _responses_kwargs(kwargs)

    async def request() -> Any:
        return _Raw(await gate._invoke(RESPONSES_CREATE, kw))

    pending: Awaitable[Any] = request()
    return AsyncResponseStreamManager(
        pending, text_format=text_format, input_tools=tools, starting_after=None
    )
