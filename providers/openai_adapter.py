"""OpenAI-compatible wrappers: the SDK calls agents make, each one fallgate turn.

    gate = Fallgate(Policy.from_toml("fallgate.toml"))
    reply = gate.chat.completions.create(messages=[{"role": "user", "content": "hi"}])
    # reply is the SDK's own ChatCompletion, from whichever target answered

Covered: ``chat.completions.create`` (and ``stream=True``), ``chat.completions.parse``,
``responses.create`` (and ``stream=True``), ``embeddings.create``, each one's
``with_raw_response`` twin, ``models.list`` / ``retrieve`` (from the chain, no
I/O), ``with_options``, and ``run`` (a turn's `GateResult`: trace and usage).
The namespaces are in `providers.resources`; what an attempt sends is decided
in `providers.calls` (model and timeout per target), `providers.chain` (a
per-call ``model=``) and `providers.timeouts`.

Each attempt goes to one real `openai.OpenAI` / `openai.AsyncOpenAI` client per
(target, credential) with the SDK's retries off. Waits sleep on ``clock=`` (an
`fsm.Clock`; default: the system clock, or the virtual one inside
`fsm.instant_waits()`, looked up at each turn).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from types import TracebackType
from typing import Any, TypeVar

import openai

from ..fsm import HealthStore, Policy, TurnFailed, TurnResult, adrive, drive
from ..fsm import otel as _otel
from ..fsm.actions import Attempt
from ..fsm.clock import Clock
from ..fsm.drivers import check_health
from ..fsm.turn import Hook
from .admission import Admission, AsyncAdmission
from .bounds import abounded, attempt_bound, bounded
from .calls import CHAT_CREATE, Call, Op, prepare
from .chain import Chains
from .classify import classifier_for
from .pools import (
    AsyncClientFactory,
    AsyncClientPool,
    ClientFactory,
    ClientPool,
    Seen,
    async_openai_factory,
    openai_factory,
)
from .resources import (
    AsyncChat,
    AsyncEmbeddings,
    AsyncModels,
    AsyncResponses,
    Chat,
    Embeddings,
    Models,
    Responses,
    unsupported,
)
from .streaming import AsyncFallgateStream, FallgateStream
from .timeouts import Bound, given
from .usage import GateResult, Ledger, usage_of

__all__ = ["AsyncFallgate", "Fallgate"]

G = TypeVar("G", bound="_Base")

#: `with_options` arguments fallgate cannot pass on, and why.
_REFUSED = {
    "api_key": "each target's keys come from the policy",
    "base_url": "each target has its own base_url in the policy",
    "http_client": "give Fallgate a client_factory= instead",
}
#: `with_options` arguments that the SDK sends as a header (option, header).
_ASKED_HEADERS = (("organization", "OpenAI-Organization"), ("project", "OpenAI-Project"))
#: The SDK's own `with_options` arguments (whichever openai is installed).
_SDK_OPTIONS = frozenset(
    name for name in inspect.signature(openai.OpenAI.copy).parameters if name != "self"
)


def _attempt_usage(ledger: Ledger, error: BaseException) -> None:
    """A billed failure (a filtered or cut-off reply) carries its completion's usage."""
    ledger.note(usage_of(getattr(error, "completion", None)))


class _Base:
    def __init__(
        self,
        policy: Policy,
        *,
        health: HealthStore | None,
        on_transition: Hook | None,
        timeout: Any,
        clock: Clock | None,
    ) -> None:
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be an fsm.Policy, got {type(policy).__name__}")
        check_health(health)
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
        #: An upper bound on each attempt's timeout, as given (the turn's own bound applies too).
        self.timeout = timeout
        self._timeout = Bound.parse(timeout, error=ValueError)
        self._chains = Chains(policy)
        self._client_options: dict[str, Any] = {}

    def _configured(self, client: Any) -> Any:
        """The attempt's client with this wrapper's ``with_options`` applied. An
        ``organization`` / ``project`` given here is also sent as its header: the
        factories mask those headers (`providers.pools.client_arguments`) so that the
        SDK's OPENAI_ORG_ID / OPENAI_PROJECT_ID never reach another provider."""
        opts = self._client_options
        if not opts:
            return client
        asked = {h: opts[o] for o, h in _ASKED_HEADERS if isinstance(opts.get(o), str)}
        if asked:
            opts = {**opts, "default_headers": {**(opts.get("default_headers") or {}), **asked}}
        return client.with_options(**opts)

    def _derive(self: G, options: Mapping[str, Any]) -> G:
        """`with_options`: a wrapper sharing policy, health store and client pools."""
        opts = dict(options)
        retries = opts.pop("max_retries", 0)
        if given(retries) and retries != 0:
            raise ValueError(
                f"with_options(max_retries={retries!r}): fallgate keeps the SDK's retries at 0 "
                "so that retries never multiply; set max_attempts in the policy instead"
            )
        timeout = opts.pop("timeout", openai.NOT_GIVEN)
        for name in opts:
            if name in _REFUSED:
                raise ValueError(f"with_options({name}=...) is not supported: {_REFUSED[name]}")
            if name not in _SDK_OPTIONS or name.startswith("_"):
                raise TypeError(
                    f"with_options() got an unexpected keyword argument {name!r} "
                    f"(it takes: {', '.join(sorted(n for n in _SDK_OPTIONS if n[0] != '_'))})"
                )
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        merged = dict(self._client_options)
        for name, value in opts.items():
            old = merged.get(name)
            if name in ("default_headers", "default_query") and isinstance(old, Mapping):
                value = {**old, **(value or {})}
            merged[name] = value
        new._client_options = merged
        if given(timeout):
            new.timeout = timeout
            new._timeout = Bound.parse(timeout, error=ValueError)
        new._namespaces()
        return new

    def _namespaces(self) -> None:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise unsupported(type(self).__name__, name)

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
    stream of the client waits on. ``timeout`` bounds every attempt (a number,
    an ``openai.Timeout``, or None).
    """

    chat: Chat
    responses: Responses
    embeddings: Embeddings
    models: Models

    def __init__(
        self,
        policy: Policy,
        *,
        health: HealthStore | None = None,
        on_transition: Hook | None = None,
        timeout: Any = None,
        client_factory: ClientFactory | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            policy, health=health, on_transition=on_transition, timeout=timeout, clock=clock
        )
        self._pool = ClientPool(client_factory or openai_factory(policy.attempt_timeout))
        self._admission = Admission()
        self._namespaces()

    def _namespaces(self) -> None:
        self.chat = Chat(self)
        self.responses = Responses(self)
        self.embeddings = Embeddings(self)
        self.models = Models(self)

    @property
    def clients(self) -> ClientPool:
        """The per-(target, credential) client cache."""
        return self._pool

    def with_options(self, **options: Any) -> Fallgate:
        """A wrapper sharing this one's policy, health store and client pools, whose
        attempts use ``client.with_options(**options)`` (the SDK's own). ``timeout``
        is one more bound on each attempt; ``max_retries`` other than 0, ``api_key``,
        ``base_url`` and ``http_client`` are refused."""
        return self._derive(options)

    def run(self, **create_kwargs: Any) -> GateResult:
        """One non-streaming ``chat.completions.create`` turn; the `GateResult` holds the
        ChatCompletion, the trace and the usage."""
        return self._run(CHAT_CREATE, create_kwargs)

    def _run(self, op: Op, kwargs: Mapping[str, Any]) -> GateResult:
        call = prepare(op, kwargs, self._chains)
        if call.stream:
            raise TypeError(f"run() does not stream; use {op.name}(stream=True)")
        result, ledger = self._turn(call)
        return ledger.result(result)

    def _invoke(self, op: Op, kwargs: Mapping[str, Any]) -> Any:
        call = prepare(op, kwargs, self._chains)
        if call.stream:
            self._pool.check_open()
            return FallgateStream[Any](self, call)
        return self._turn(call)[0].value

    def _turn(self, call: Call) -> tuple[TurnResult, Ledger]:
        """One turn; its `GateResult` is made from the two only when asked for (`run`)."""
        self._pool.check_open()
        ledger = Ledger()
        seen = Seen()  # the client generations this turn used (scopes its rebuilds)

        def attempt(a: Attempt) -> Any:
            ledger.begin(a)
            try:
                with self._pool.lease(a.target, a.credential, seen) as client:
                    # bounded from here: building a client is not the server's time
                    bound = attempt_bound(call.policy, a)
                    admission = self._admission
                    admission.admit(bound, a.until_deadline)
                    ok = False
                    try:
                        with bounded(bound):
                            reply = call.op.bind(self._configured(client))(
                                **call.sdk_kwargs(a, self._timeout)
                            )
                            parsed = call.op.accept(reply)
                        ok = True
                    finally:
                        admission.release(ok, bound.lag)
            except Exception as e:
                _attempt_usage(ledger, e)
                raise
            ledger.note(usage_of(parsed))
            return reply

        try:
            result = drive(call.policy, attempt, **_drive_options(self, call, ledger, seen))
        except TurnFailed as e:
            ledger.attach(e)
            raise
        return result, ledger

    def rebuild(self, target_name: str) -> None:
        """Close and recreate one target's clients (what transport recovery does)."""
        self._pool.rebuild(_target(self.policy, target_name))

    def close(self) -> None:
        """Close every client (shared with wrappers made by `with_options`)."""
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

    chat: AsyncChat
    responses: AsyncResponses
    embeddings: AsyncEmbeddings
    models: AsyncModels

    def __init__(
        self,
        policy: Policy,
        *,
        health: HealthStore | None = None,
        on_transition: Hook | None = None,
        timeout: Any = None,
        client_factory: AsyncClientFactory | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            policy, health=health, on_transition=on_transition, timeout=timeout, clock=clock
        )
        self._pool = AsyncClientPool(client_factory or async_openai_factory(policy.attempt_timeout))
        self._admission = AsyncAdmission()
        self._namespaces()

    def _namespaces(self) -> None:
        self.chat = AsyncChat(self)
        self.responses = AsyncResponses(self)
        self.embeddings = AsyncEmbeddings(self)
        self.models = AsyncModels(self)

    @property
    def clients(self) -> AsyncClientPool:
        return self._pool

    def with_options(self, **options: Any) -> AsyncFallgate:
        """See `Fallgate.with_options`."""
        return self._derive(options)

    async def arun(self, **create_kwargs: Any) -> GateResult:
        """One non-streaming ``chat.completions.create`` turn; the `GateResult` holds the
        ChatCompletion, the trace and the usage."""
        return await self._run(CHAT_CREATE, create_kwargs)

    async def _run(self, op: Op, kwargs: Mapping[str, Any]) -> GateResult:
        call = prepare(op, kwargs, self._chains)
        if call.stream:
            raise TypeError(f"arun() does not stream; use {op.name}(stream=True)")
        result, ledger = await self._turn(call)
        return ledger.result(result)

    async def _invoke(self, op: Op, kwargs: Mapping[str, Any]) -> Any:
        call = prepare(op, kwargs, self._chains)
        if call.stream:
            self._pool.check_open()
            return await AsyncFallgateStream[Any](self, call)._prime()
        return (await self._turn(call))[0].value

    async def _turn(self, call: Call) -> tuple[TurnResult, Ledger]:
        """See `Fallgate._turn`."""
        self._pool.check_open()
        ledger = Ledger()
        seen = Seen()  # the client generations this turn used (scopes its rebuilds)

        async def attempt(a: Attempt) -> Any:
            ledger.begin(a)
            try:
                lease = self._pool.lease(a.target, a.credential, seen)
                async with lease as client:
                    # bounded from here: building a client is not the server's time;
                    # asyncio.timeout too where the socket is not bounded (`instrument`)
                    bound = attempt_bound(call.policy, a)
                    admission = self._admission
                    if not admission.admit_now():  # engaged: wait for a slot
                        await admission.admit(bound, a.until_deadline)
                    ok = False
                    try:
                        async with abounded(bound, backstop=not lease.bounded):
                            reply = await call.op.bind(self._configured(client))(
                                **call.sdk_kwargs(a, self._timeout)
                            )
                            parsed = call.op.accept(reply)
                        ok = True
                    finally:
                        admission.release(ok, bound.lag)
            except Exception as e:
                _attempt_usage(ledger, e)
                raise
            ledger.note(usage_of(parsed))
            return reply

        try:
            result = await adrive(call.policy, attempt, **_drive_options(self, call, ledger, seen))
        except TurnFailed as e:
            ledger.attach(e)
            raise
        return result, ledger

    async def rebuild(self, target_name: str) -> None:
        await self._pool.rebuild(_target(self.policy, target_name))

    async def aclose(self) -> None:
        """Close every client (shared with wrappers made by `with_options`)."""
        await self._pool.aclose()

    close = aclose

    async def __aenter__(self) -> AsyncFallgate:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _drive_options(gate: Any, call: Call, ledger: Ledger, seen: Any) -> dict[str, Any]:
    """What the sync and the async wrapper hand their driver besides policy and attempt."""
    return {
        "rebuild": functools.partial(gate._pool.rebuild, seen=seen),
        "classify": classifier_for(
            call.policy,
            lambda: ledger.target,
            functools.partial(gate._pool.answered_others, seen=seen),
        ),
        "health": gate.health,
        "on_transition": gate.on_transition,
        "clock": gate.clock,
        "first": call.first,
        "telemetry": _telemetry(call, ledger),
    }


def _telemetry(call: Call, ledger: Ledger) -> _otel.Telemetry | None:
    """The turn's OpenTelemetry description (made only while telemetry is on)."""
    if _otel.ACTIVE is None:
        return None
    return ledger.telemetry(call.op.operation, raw=call.op.raw)


def _target(policy: Policy, name: str) -> Any:
    for t in policy.targets:
        if name in (t.name, t.model):
            return t
    known = ", ".join(f"{t.name} ({t.model})" for t in policy.targets)
    raise KeyError(f"no target named {name!r} in this policy (known: {known})")
