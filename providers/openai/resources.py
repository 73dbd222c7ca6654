"""The openai-shaped namespaces of `Fallgate` / `AsyncFallgate`.

Each method is one fallgate turn (``run`` returns the turn's `GateResult`,
the others what the SDK returns), made by the gate's ``_invoke`` / ``_run``
with an `Op` from `providers.openai.calls`. Anything else raises an `AttributeError`
that says what is wrapped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast, overload

from openai.pagination import AsyncPage, SyncPage
from openai.types import CreateEmbeddingResponse, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ParsedChatCompletion
from openai.types.responses import Response, ResponseStreamEvent

from .calls import CHAT_CREATE, CHAT_PARSE, EMBEDDINGS_CREATE, RESPONSES_CREATE
from .chain import model_objects
from .managers import async_chat_stream, async_responses_stream, chat_stream, responses_stream
from .streaming import AsyncFallgateStream, FallgateStream
from .usage import GateResult

if TYPE_CHECKING:
    from openai._legacy_response import LegacyAPIResponse
    from openai.lib.streaming.chat import (
        AsyncChatCompletionStreamManager,
        ChatCompletionStreamManager,
    )
    from openai.lib.streaming.responses import AsyncResponseStreamManager, ResponseStreamManager

    from .client import AsyncFallgate, Fallgate

__all__ = ["SURFACE", "AsyncChat", "Chat", "unsupported"]

#: Everything the wrappers cover, for error messages and docs.
SURFACE = (
    "chat.completions.create/parse/stream, responses.create/stream, embeddings.create "
    "(create, parse also under .with_raw_response), models.list/retrieve, with_options, run"
)

_RAW_CREATE = CHAT_CREATE.with_raw_response()
_RAW_PARSE = CHAT_PARSE.with_raw_response()
_RAW_RESPONSES = RESPONSES_CREATE.with_raw_response()
_RAW_EMBEDDINGS = EMBEDDINGS_CREATE.with_raw_response()


def unsupported(gate: str, name: str, path: str = "", here: str = "") -> AttributeError:
    """The error for an attribute the wrappers do not cover: what is covered, and why
    not to expect more (anything else would not go through the fallback chain)."""
    if path:
        what = f"{gate}.{path} wraps {here}; {name!r} is not supported ({gate} wraps {SURFACE})"
    else:
        what = f"{gate} wraps {SURFACE}; {name!r} is not supported"
    return AttributeError(
        f"{what}. Call anything else on an openai client of your own: it would not go "
        "through the fallback chain"
    )


class _Namespace:
    """Unknown attributes raise an `AttributeError` naming what is wrapped."""

    _path: ClassVar[str]
    _here: ClassVar[str]
    _gate: Fallgate | AsyncFallgate

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise unsupported(type(self._gate).__name__, name, self._path, self._here)


class _Sync(_Namespace):
    _gate: Fallgate

    def __init__(self, gate: Fallgate) -> None:
        self._gate = gate


class _Async(_Namespace):
    _gate: AsyncFallgate

    def __init__(self, gate: AsyncFallgate) -> None:
        self._gate = gate


# -- sync ------------------------------------------------------------------------------------


class CompletionsWithRawResponse(_Sync):
    _path, _here = "chat.completions.with_raw_response", "create, parse"

    def create(self, **kwargs: Any) -> LegacyAPIResponse[ChatCompletion]:
        """The SDK's raw response of the target that answered (headers, ``.parse()``)."""
        return cast("LegacyAPIResponse[ChatCompletion]", self._gate._invoke(_RAW_CREATE, kwargs))

    def parse(self, **kwargs: Any) -> LegacyAPIResponse[ParsedChatCompletion[Any]]:
        return cast(
            "LegacyAPIResponse[ParsedChatCompletion[Any]]", self._gate._invoke(_RAW_PARSE, kwargs)
        )


class Completions(_Sync):
    _path, _here = "chat.completions", "create, parse, stream, run, with_raw_response"

    def __init__(self, gate: Fallgate) -> None:
        super().__init__(gate)
        self.with_raw_response = CompletionsWithRawResponse(gate)

    @overload
    def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> FallgateStream[ChatCompletionChunk]: ...
    @overload
    def create(self, *, stream: Literal[False] = ..., **kwargs: Any) -> ChatCompletion: ...
    def create(self, **kwargs: Any) -> ChatCompletion | FallgateStream[ChatCompletionChunk]:
        """Like the SDK's: a ChatCompletion, or for ``stream=True`` an iterator of
        ChatCompletionChunk. Raises `fsm.TurnFailed` when no target could answer."""
        return cast(
            "ChatCompletion | FallgateStream[ChatCompletionChunk]",
            self._gate._invoke(CHAT_CREATE, kwargs),
        )

    def parse(self, **kwargs: Any) -> ParsedChatCompletion[Any]:
        """The SDK's structured-output ``parse`` (``response_format=`` a pydantic model)."""
        return cast("ParsedChatCompletion[Any]", self._gate._invoke(CHAT_PARSE, kwargs))

    def stream(self, **kwargs: Any) -> ChatCompletionStreamManager[Any]:
        """The SDK's ``stream`` helper (``with ... as stream``: content/tool-call events,
        ``get_final_completion()``) over a fallgate stream (`providers.openai.managers`)."""
        return chat_stream(self._gate, kwargs)

    def run(self, **kwargs: Any) -> GateResult:
        """``create`` as a turn result: the ChatCompletion, the trace, the usage."""
        return self._gate._run(CHAT_CREATE, kwargs)


class Chat(_Sync):
    _path, _here = "chat", "completions"

    def __init__(self, gate: Fallgate) -> None:
        super().__init__(gate)
        self.completions = Completions(gate)


class ResponsesWithRawResponse(_Sync):
    _path, _here = "responses.with_raw_response", "create"

    def create(self, **kwargs: Any) -> LegacyAPIResponse[Response]:
        return cast("LegacyAPIResponse[Response]", self._gate._invoke(_RAW_RESPONSES, kwargs))


class Responses(_Sync):
    _path, _here = "responses", "create, stream, run, with_raw_response"

    def __init__(self, gate: Fallgate) -> None:
        super().__init__(gate)
        self.with_raw_response = ResponsesWithRawResponse(gate)

    @overload
    def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> FallgateStream[ResponseStreamEvent]: ...
    @overload
    def create(self, *, stream: Literal[False] = ..., **kwargs: Any) -> Response: ...
    def create(self, **kwargs: Any) -> Response | FallgateStream[ResponseStreamEvent]:
        """Like the SDK's: a Response, or for ``stream=True`` an iterator of its events,
        committed at the first output delta."""
        return cast(
            "Response | FallgateStream[ResponseStreamEvent]",
            self._gate._invoke(RESPONSES_CREATE, kwargs),
        )

    def stream(self, **kwargs: Any) -> ResponseStreamManager[Any]:
        """The SDK's ``responses.stream`` helper (``get_final_response()``, ``text_format=``)
        over a fallgate stream."""
        return responses_stream(self._gate, kwargs)

    def run(self, **kwargs: Any) -> GateResult:
        return self._gate._run(RESPONSES_CREATE, kwargs)


class EmbeddingsWithRawResponse(_Sync):
    _path, _here = "embeddings.with_raw_response", "create"

    def create(self, **kwargs: Any) -> LegacyAPIResponse[CreateEmbeddingResponse]:
        return cast(
            "LegacyAPIResponse[CreateEmbeddingResponse]",
            self._gate._invoke(_RAW_EMBEDDINGS, kwargs),
        )


class Embeddings(_Sync):
    _path, _here = "embeddings", "create, run, with_raw_response"

    def __init__(self, gate: Fallgate) -> None:
        super().__init__(gate)
        self.with_raw_response = EmbeddingsWithRawResponse(gate)

    def create(self, **kwargs: Any) -> CreateEmbeddingResponse:
        return cast("CreateEmbeddingResponse", self._gate._invoke(EMBEDDINGS_CREATE, kwargs))

    def run(self, **kwargs: Any) -> GateResult:
        return self._gate._run(EMBEDDINGS_CREATE, kwargs)


class Models(_Sync):
    """The chain's models, without network I/O: the chain is what the gate can reach."""

    _path, _here = "models", "list, retrieve"

    def list(self) -> SyncPage[Model]:
        """Every entry of the chain, in order, as the SDK's `Model` (``owned_by``: provider)."""
        self._gate._pool.check_open()  # a closed client answers nothing (`ClientClosed`)
        return SyncPage[Model].construct(data=model_objects(self._gate.policy), object="list")

    def retrieve(self, model: str) -> Model:
        """One entry (by model, provider/model or target name); else `ValueError`."""
        self._gate._pool.check_open()
        return self._gate._chains.model(model)


# -- async -----------------------------------------------------------------------------------


class AsyncCompletionsWithRawResponse(_Async):
    _path, _here = "chat.completions.with_raw_response", "create, parse"

    async def create(self, **kwargs: Any) -> LegacyAPIResponse[ChatCompletion]:
        return cast(
            "LegacyAPIResponse[ChatCompletion]", await self._gate._invoke(_RAW_CREATE, kwargs)
        )

    async def parse(self, **kwargs: Any) -> LegacyAPIResponse[ParsedChatCompletion[Any]]:
        return cast(
            "LegacyAPIResponse[ParsedChatCompletion[Any]]",
            await self._gate._invoke(_RAW_PARSE, kwargs),
        )


class AsyncCompletions(_Async):
    _path, _here = "chat.completions", "create, parse, stream, run, with_raw_response"

    def __init__(self, gate: AsyncFallgate) -> None:
        super().__init__(gate)
        self.with_raw_response = AsyncCompletionsWithRawResponse(gate)

    @overload
    async def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> AsyncFallgateStream[ChatCompletionChunk]: ...
    @overload
    async def create(self, *, stream: Literal[False] = ..., **kwargs: Any) -> ChatCompletion: ...
    async def create(
        self, **kwargs: Any
    ) -> ChatCompletion | AsyncFallgateStream[ChatCompletionChunk]:
        return cast(
            "ChatCompletion | AsyncFallgateStream[ChatCompletionChunk]",
            await self._gate._invoke(CHAT_CREATE, kwargs),
        )

    async def parse(self, **kwargs: Any) -> ParsedChatCompletion[Any]:
        return cast("ParsedChatCompletion[Any]", await self._gate._invoke(CHAT_PARSE, kwargs))

    def stream(self, **kwargs: Any) -> AsyncChatCompletionStreamManager[Any]:
        """``async with gate.chat.completions.stream(...) as stream``: see `Completions.stream`."""
        return async_chat_stream(self._gate, kwargs)

    async def run(self, **kwargs: Any) -> GateResult:
        return await self._gate._run(CHAT_CREATE, kwargs)


class AsyncChat(_Async):
    _path, _here = "chat", "completions"

    def __init__(self, gate: AsyncFallgate) -> None:
        super().__init__(gate)
        self.completions = AsyncCompletions(gate)


class AsyncResponsesWithRawResponse(_Async):
    _path, _here = "responses.with_raw_response", "create"

    async def create(self, **kwargs: Any) -> LegacyAPIResponse[Response]:
        return cast("LegacyAPIResponse[Response]", await self._gate._invoke(_RAW_RESPONSES, kwargs))


class AsyncResponses(_Async):
    _path, _here = "responses", "create, stream, run, with_raw_response"

    def __init__(self, gate: AsyncFallgate) -> None:
        super().__init__(gate)
        self.with_raw_response = AsyncResponsesWithRawResponse(gate)

    @overload
    async def create(
        self, *, stream: Literal[True], **kwargs: Any
    ) -> AsyncFallgateStream[ResponseStreamEvent]: ...
    @overload
    async def create(self, *, stream: Literal[False] = ..., **kwargs: Any) -> Response: ...
    async def create(self, **kwargs: Any) -> Response | AsyncFallgateStream[ResponseStreamEvent]:
        return cast(
            "Response | AsyncFallgateStream[ResponseStreamEvent]",
            await self._gate._invoke(RESPONSES_CREATE, kwargs),
        )

    def stream(self, **kwargs: Any) -> AsyncResponseStreamManager[Any]:
        """``async with gate.responses.stream(...) as stream``: see `Responses.stream`."""
        return async_responses_stream(self._gate, kwargs)

    async def run(self, **kwargs: Any) -> GateResult:
        return await self._gate._run(RESPONSES_CREATE, kwargs)


class AsyncEmbeddingsWithRawResponse(_Async):
    _path, _here = "embeddings.with_raw_response", "create"

    async def create(self, **kwargs: Any) -> LegacyAPIResponse[CreateEmbeddingResponse]:
        return cast(
            "LegacyAPIResponse[CreateEmbeddingResponse]",
            await self._gate._invoke(_RAW_EMBEDDINGS, kwargs),
        )


class AsyncEmbeddings(_Async):
    _path, _here = "embeddings", "create, run, with_raw_response"

    def __init__(self, gate: AsyncFallgate) -> None:
        super().__init__(gate)
        self.with_raw_response = AsyncEmbeddingsWithRawResponse(gate)

    async def create(self, **kwargs: Any) -> CreateEmbeddingResponse:
        return cast("CreateEmbeddingResponse", await self._gate._invoke(EMBEDDINGS_CREATE, kwargs))

    async def run(self, **kwargs: Any) -> GateResult:
        return await self._gate._run(EMBEDDINGS_CREATE, kwargs)


class AsyncModelList:
    """What ``AsyncFallgate.models.list()`` returns: like the SDK's, it can be
    awaited (the page) or iterated with ``async for`` (the models)."""

    def __init__(self, models: list[Model]) -> None:
        self._page = AsyncPage[Model].construct(data=models, object="list")

    def __await__(self) -> Generator[Any, None, AsyncPage[Model]]:
        async def page() -> AsyncPage[Model]:
            return self._page

        return page().__await__()

    def __aiter__(self) -> AsyncIterator[Model]:
        return self._page.__aiter__()


class AsyncModels(_Async):
    _path, _here = "models", "list, retrieve"

    def list(self) -> AsyncModelList:
        self._gate._pool.check_open()  # a closed client answers nothing (`ClientClosed`)
        return AsyncModelList(model_objects(self._gate.policy))

    async def retrieve(self, model: str) -> Model:
        self._gate._pool.check_open()
        return self._gate._chains.model(model)
