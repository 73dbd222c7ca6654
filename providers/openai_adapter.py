"""OpenAI-compatible wrappers: ``client.chat.completions.create(...)`` through the engine.

    gate = Fallgate(Policy.from_toml("fallgate.toml"))
    reply = gate.chat.completions.create(messages=[{"role": "user", "content": "hi"}])
    # reply is the SDK's own ChatCompletion, from whichever target answered

Each attempt goes to one real `openai.OpenAI` / `openai.AsyncOpenAI` client per
(target, credential) with the SDK's retries off; the request's ``model`` is
replaced by the target's model and its timeout by what the turn allows.
Waits sleep on ``clock=`` (an `fsm.Clock`; default: the system clock, or the
virtual one inside `fsm.instant_waits()`, looked up at each turn), so
``Fallgate(policy, clock=fsm.VirtualClock())`` runs on virtual time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Literal, overload

import attrs
from openai.types.chat import ChatCompletion

from fsm import Attempt, Clock, HealthStore, Policy, TurnResult, adrive, drive
from fsm.turn import Hook

from .classify import MalformedReply, classify_openai, content_filter_error
from .pools import (
    AsyncClientFactory,
    AsyncClientPool,
    ClientFactory,
    ClientPool,
    async_openai_factory,
    openai_factory,
)
from .streaming import AsyncFallgateStream, FallgateStream

__all__ = ["AsyncFallgate", "Fallgate"]


@attrs.frozen(slots=True)
class _Request:
    """One caller request, minus what the engine decides (model, timeout)."""

    kwargs: Mapping[str, Any]
    stream: bool = False
    timeout: float | None = None

    @classmethod
    def parse(cls, kwargs: Mapping[str, Any]) -> _Request:
        kw = dict(kwargs)
        if "messages" not in kw:
            raise TypeError("create() missing required keyword argument: 'messages'")
        messages = kw["messages"]
        if isinstance(messages, str | bytes) or not isinstance(messages, Iterable):
            raise TypeError(
                f"messages must be a list of message dicts, got {type(messages).__name__}"
            )
        kw["messages"] = list(messages)
        kw.pop("model", None)  # every target brings its own model
        stream = kw.pop("stream", False)
        if stream is None:
            stream = False
        if not isinstance(stream, bool):
            raise TypeError(f"stream must be True or False, got {stream!r}")
        timeout = kw.pop("timeout", None)
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise TypeError(f"timeout must be a positive number of seconds, got {timeout!r}")
        return cls(kw, stream, None if timeout is None else float(timeout))

    def call_kwargs(
        self, a: Attempt, cap: float | None, *, stream: bool = False, prefix: str | None = None
    ) -> dict[str, Any]:
        timeout = a.timeout
        for limit in (cap, self.timeout):
            if limit is not None:
                timeout = min(timeout, limit)
        kw = dict(self.kwargs, model=a.target.model, timeout=timeout)
        if stream:
            kw["stream"] = True
        if prefix:
            kw["messages"] = [*kw["messages"], {"role": "assistant", "content": prefix}]
        return kw


def _check_completion(reply: Any) -> ChatCompletion:
    """A 2xx reply must be a chat completion with choices; content-filtered ones are
    raised as the SDK's `ContentFilterFinishReasonError` (classified `content_filtered`)."""
    if not isinstance(reply, ChatCompletion):
        shown = " ".join(str(reply)[:80].split()) if isinstance(reply, str) else ""
        what = f"expected a chat completion, got {type(reply).__name__}"
        raise MalformedReply(f"{what} {shown!r}" if shown else what)
    choices = getattr(reply, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise MalformedReply("a chat completion without choices")
    if all(getattr(c, "finish_reason", None) == "content_filter" for c in choices):
        raise content_filter_error(reply)
    return reply


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


class _Base:
    def __init__(
        self,
        policy: Policy,
        *,
        health: HealthStore | None,
        on_transition: Hook | None,
        timeout: float | None,
        clock: Clock | None,
    ) -> None:
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be an fsm.Policy, got {type(policy).__name__}")
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(
                f"clock must be an fsm.Clock (now, sleep, asleep), got {type(clock).__name__}"
            )
        self.policy = policy
        #: Cooldowns that outlive a turn; shared by every turn of this client.
        self.health = health if health is not None else HealthStore()
        #: What each turn's waits sleep on (None: `fsm.clock.default_clock()` per turn).
        self.clock = clock
        self.on_transition = on_transition
        #: An upper bound on each attempt's timeout (the turn's own bound also applies).
        self.timeout = _check_timeout(timeout)

    def __repr__(self) -> str:
        chain = " -> ".join(f"{t.name}:{t.model}" for t in self.policy.targets)
        return f"{type(self).__name__}({chain})"


class Fallgate(_Base):
    """A sync, openai-compatible client whose every call is one fallgate turn.

    ``client_factory(target, api_key)`` builds the SDK client for one
    (target, credential); the default is `openai.OpenAI` with the target's
    base_url and ``max_retries=0`` (a factory's client with retries on is
    switched to 0). Close it (or use ``with``) to close every client.
    ``health`` defaults to a store of this client's own; ``clock`` (an
    `fsm.Clock`, e.g. `fsm.VirtualClock()` in tests) is what every turn and
    stream of the client waits on.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        health: HealthStore | None = None,
        on_transition: Hook | None = None,
        timeout: float | None = None,
        client_factory: ClientFactory | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            policy, health=health, on_transition=on_transition, timeout=timeout, clock=clock
        )
        self._pool = ClientPool(client_factory or openai_factory(policy.attempt_timeout))
        self.chat = _Chat(self)

    @property
    def clients(self) -> ClientPool:
        """The per-(target, credential) client cache."""
        return self._pool

    def run(self, **create_kwargs: Any) -> TurnResult:
        """One non-streaming turn; the `TurnResult` holds the ChatCompletion and the trace."""
        req = _Request.parse(create_kwargs)
        if req.stream:
            raise TypeError("run() does not stream; use chat.completions.create(stream=True)")
        self._pool.check_open()
        return drive(
            self.policy,
            lambda a: self._attempt(a, req),
            rebuild=self._pool.rebuild,
            classify=classify_openai,
            health=self.health,
            on_transition=self.on_transition,
            clock=self.clock,
        )

    def _attempt(self, a: Attempt, req: _Request) -> ChatCompletion:
        with self._pool.lease(a.target, a.credential) as client:
            reply = client.chat.completions.create(**req.call_kwargs(a, self.timeout))
        return _check_completion(reply)

    def rebuild(self, target_name: str) -> None:
        """Close and recreate one target's clients (what transport recovery does)."""
        self._pool.rebuild(_target(self.policy, target_name))

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Fallgate:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncFallgate(_Base):
    """The asyncio twin of `Fallgate` (`openai.AsyncOpenAI` clients); ``await aclose()``
    or ``async with`` closes them. Cancelling a turn ends it `aborted`."""

    def __init__(
        self,
        policy: Policy,
        *,
        health: HealthStore | None = None,
        on_transition: Hook | None = None,
        timeout: float | None = None,
        client_factory: AsyncClientFactory | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            policy, health=health, on_transition=on_transition, timeout=timeout, clock=clock
        )
        self._pool = AsyncClientPool(client_factory or async_openai_factory(policy.attempt_timeout))
        self.chat = _AsyncChat(self)

    @property
    def clients(self) -> AsyncClientPool:
        return self._pool

    async def arun(self, **create_kwargs: Any) -> TurnResult:
        """One non-streaming turn; the `TurnResult` holds the ChatCompletion and the trace."""
        req = _Request.parse(create_kwargs)
        if req.stream:
            raise TypeError("arun() does not stream; use chat.completions.create(stream=True)")
        self._pool.check_open()

        async def attempt(a: Attempt) -> ChatCompletion:
            async with self._pool.lease(a.target, a.credential) as client:
                reply = await client.chat.completions.create(**req.call_kwargs(a, self.timeout))
            return _check_completion(reply)

        return await adrive(
            self.policy,
            attempt,
            rebuild=self._pool.rebuild,
            classify=classify_openai,
            health=self.health,
            on_transition=self.on_transition,
            clock=self.clock,
        )

    async def rebuild(self, target_name: str) -> None:
        await self._pool.rebuild(_target(self.policy, target_name))

    async def aclose(self) -> None:
        await self._pool.aclose()

    close = aclose

    async def __aenter__(self) -> AsyncFallgate:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _target(policy: Policy, name: str) -> Any:
    for t in policy.targets:
        if name in (t.name, t.model):
            return t
    known = ", ".join(f"{t.name} ({t.model})" for t in policy.targets)
    raise KeyError(f"no target named {name!r} in this policy (known: {known})")


# -- the openai-shaped namespaces ---------------------------------------------------------------


class _Completions:
    def __init__(self, gate: Fallgate) -> None:
        self._gate = gate

    @overload
    def create(self, *, stream: Literal[True], **kwargs: Any) -> FallgateStream: ...
    @overload
    def create(self, *, stream: Literal[False] = ..., **kwargs: Any) -> ChatCompletion: ...
    def create(self, **kwargs: Any) -> ChatCompletion | FallgateStream:
        """Like the SDK's: returns a ChatCompletion, or for ``stream=True`` an iterator of
        ChatCompletionChunk. Raises `fsm.TurnFailed` when no target could answer."""
        req = _Request.parse(kwargs)
        if req.stream:
            self._gate._pool.check_open()
            return FallgateStream(self._gate, req)
        value: ChatCompletion = self._gate.run(**kwargs).value
        return value


class _Chat:
    def __init__(self, gate: Fallgate) -> None:
        self.completions = _Completions(gate)


class _AsyncCompletions:
    def __init__(self, gate: AsyncFallgate) -> None:
        self._gate = gate

    @overload
    async def create(self, *, stream: Literal[True], **kwargs: Any) -> AsyncFallgateStream: ...
    @overload
    async def create(self, *, stream: Literal[False] = ..., **kwargs: Any) -> ChatCompletion: ...
    async def create(self, **kwargs: Any) -> ChatCompletion | AsyncFallgateStream:
        req = _Request.parse(kwargs)
        if req.stream:
            self._gate._pool.check_open()
            return await AsyncFallgateStream(self._gate, req)._prime()
        value: ChatCompletion = (await self._gate.arun(**kwargs)).value
        return value


class _AsyncChat:
    def __init__(self, gate: AsyncFallgate) -> None:
        self.completions = _AsyncCompletions(gate)
