"""OpenAI-compatible wrappers: the SDK calls agents make, each one fallgate turn.

    gate = Fallgate(Policy.from_toml("fallgate.toml"))
    reply = gate.chat.completions.create(messages=[{"role": "user", "content": "hi"}])
    # reply is the SDK's own ChatCompletion, from whichever target answered

Covered: ``chat.completions.create`` (and ``stream=True``), ``chat.completions.parse``,
``responses.create`` (and ``stream=True``), ``embeddings.create``, each one's
``with_raw_response`` twin, ``models.list`` / ``retrieve`` (from the chain, no
I/O), ``with_options``, and ``run`` (a turn's `GateResult`: trace and usage).
The namespaces are in `providers.openai.resources`; what an attempt sends is decided
in `providers.openai.calls` (model and timeout per target), `providers.openai.chain` (a
per-call ``model=``) and `providers.openai.http.timeouts`.

Each attempt goes to one real `openai.OpenAI` / `openai.AsyncOpenAI` client per
(target, credential) with the SDK's retries off. Waits sleep on ``clock=`` (an
`fsm.Clock`; default: the system clock, or the virtual one inside
`fsm.instant_waits()`, looked up at each turn).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import weakref
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar, cast

import openai

from ...fsm import HealthStore, Outcome, Policy, TurnFailed, TurnResult
from ...fsm.clock import Clock
from ...fsm.core.actions import Attempt
from ...fsm.core.turn import Hook
from ...fsm.host.drivers import (
    AsyncOptions,
    Options,
    adrive_checked,
    check_health,
    drive_checked,
)
from ...fsm.telemetry import otel as _otel
from . import pacing
from .calls import (
    CHAT_CREATE,
    Call,
    Op,
    caller_mistake,
    prepare,
)
from .chain import Chains
from .exceptions import classifier_for
from .http.admission import Admission, AsyncAdmission
from .http.bounds import abounded, attempt_bound, bounded, issued
from .http.pools import (
    AsyncClientFactory,
    AsyncClientPool,
    ClientFactory,
    ClientPool,
    Seen,
    async_openai_factory,
    openai_factory,
)
from .http.timeouts import Bound, given
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
from .usage import GateResult, Ledger, usage_of

__all__ = ["AsyncFallgate", "Fallgate"]

G = TypeVar("G", bound="_Base[Any, Any]")
F = TypeVar("F")  # the flavour's client factory
P = TypeVar("P", ClientPool, AsyncClientPool)  # its pool

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


#: What to do instead of a constructor argument the SDK's client takes and fallgate does not.
_INSTEAD = {
    "max_retries": "fallgate keeps the SDK's retries at 0 so that retries never multiply; "
    "set max_attempts in the policy (for every target, or per chain entry) instead",
    "api_key": "each target's keys come from the policy (api_key, api_keys or key_env)",
    "base_url": "each target's endpoint comes from the policy (base_url, or its provider)",
    "http_client": "give a client_factory= instead (it builds each target's SDK client)",
    "organization": "use with_options(organization=...)",
    "project": "use with_options(project=...)",
    "default_headers": "use with_options(default_headers=...)",
    "default_query": "use with_options(default_query=...)",
}


def _policy_of(policy: Any) -> Policy:
    """A policy, or the path of a policy file (read with `Policy.from_toml`)."""
    if isinstance(policy, str | os.PathLike):
        return Policy.from_toml(policy)
    if not isinstance(policy, Policy):
        raise TypeError(
            "policy must be an fsm.Policy or the path of a policy file "
            f"(Policy.from_toml / Policy.from_dict make one), got {type(policy).__name__}"
        )
    return policy


def _refuse_options(gate: str, options: Mapping[str, Any]) -> None:
    """The SDK client's constructor arguments, given to a gate: say what to do instead."""
    for name in options:
        if name in _INSTEAD:
            raise TypeError(f"{gate}({name}=...) is not taken: {_INSTEAD[name]}")
        raise TypeError(f"{gate}.__init__() got an unexpected keyword argument {name!r}")


def _raise_caller_mistake(e: TurnFailed) -> None:
    """A turn that failed on the caller's own mistake raises the caller's exception."""
    mistake = caller_mistake(e)
    if mistake is not None:
        raise mistake from None


def _attempt_usage(ledger: Ledger, error: BaseException) -> None:
    """A billed failure (a filtered or cut-off reply) carries its completion's usage."""
    ledger.note(usage_of(getattr(error, "completion", None)))


#: A driver's name on the wrong twin -> (the other client, what this one has).
_TWINS = {
    "run": ("Fallgate(...).run(...)", "`await gate.arun(...)`"),
    "arun": ("AsyncFallgate(...).arun(...)", "`gate.run(...)`"),
}


class _Flavour(NamedTuple):
    """What makes a client sync or asyncio, besides its methods."""

    pool: Callable[[Any], Any]
    admission: Callable[[], Any]
    #: The default client factory, given the policy's attempt timeout.
    factory: Callable[[float], Any]
    #: The classes of ``chat``, ``responses``, ``embeddings``, ``models``.
    namespaces: tuple[Callable[[Any], Any], ...]


class _Base(Generic[F, P]):
    """What both flavours are: the checks, the options, `with_options`, a turn's start.
    A flavour names its pool, admission, default client factory and namespaces."""

    _FLAVOUR: ClassVar[_Flavour]
    _pool: P

    def __init__(
        self,
        policy: Policy,
        *,
        health: HealthStore | None = None,
        on_transition: Hook | None = None,
        timeout: Any = None,
        client_factory: F | None = None,
        clock: Clock | None = None,
        **sdk_options: Any,
    ) -> None:
        _refuse_options(type(self).__name__, sdk_options)
        policy = _policy_of(policy)
        check_health(health)
        if client_factory is not None and not callable(client_factory):
            raise TypeError(
                "client_factory must be a callable (target, api_key) -> an openai client, "
                f"got {type(client_factory).__name__}"
            )
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
        flavour = self._FLAVOUR
        self._pool = flavour.pool(client_factory or flavour.factory(policy.attempt_timeout))
        #: Per model: what a request's tokens are expected to be (pacing's cost).
        self._costs = pacing.Costs()
        self._admission = flavour.admission()
        self._namespaces()

    def _namespaces(self) -> None:
        self.chat, self.responses, self.embeddings, self.models = (
            namespace(self) for namespace in self._FLAVOUR.namespaces
        )

    def _begin(self, call: Call) -> tuple[Ledger, Seen, dict[str, Any]]:
        """What a turn of either flavour starts from: its ledger, the client generations
        it uses (they scope its rebuilds), and what it hands its driver besides policy
        and attempt. A failed attempt's billed usage is noted as it is classified."""
        self._pool.check_open()
        ledger = Ledger()
        seen = Seen()

        def failed(e: BaseException) -> Outcome:
            _attempt_usage(ledger, e)
            # made on a failure only: a turn that succeeds at once never classifies
            classify = classifier_for(
                call.policy,
                lambda: ledger.target,
                functools.partial(self._pool.answered_others, seen=seen),
            )
            return classify(e)

        return (
            ledger,
            seen,
            {
                "rebuild": functools.partial(self._pool.rebuild, seen=seen),
                "classify": failed,
                "health": self.health,
                "on_transition": self.on_transition,
                "clock": self.clock,
                "first": call.first,
                "telemetry": _telemetry(call, ledger),
                "affinity": call.affinity,
                "cost": self._cost(call) if self.health.room else 0.0,
            },
        )

    def _cost(self, call: Call) -> float:
        """The tokens one attempt of `call` is expected to use (pacing; 0 when off). Asked
        only once a reply spoke of rate limits (the store holds headroom): before, a turn
        reserves requests only, and the usage that comes back is not learnt from."""
        if not call.policy.pacing:
            return 0.0
        return self._costs.estimate(call.policy.targets[call.first].model, call.kwargs)[0]

    def _learn(self, call: Call, a: Attempt, usage: Any) -> None:
        """Correct the cost estimate of `a`'s model from the usage its reply reported."""
        if usage is not None and call.policy.pacing:
            chars = self._costs.estimate(a.target.model, call.kwargs)[1]
            self._costs.learn(a.target.model, chars, usage)

    def _send(self, call: Call, client: Any, a: Attempt) -> Any:
        """The SDK request of one attempt (for the asyncio flavour, to be awaited)."""
        return call.op.bind(self._configured(client))(**call.sdk_kwargs(a, self._timeout))

    def _configured(self, client: Any) -> Any:
        """The attempt's client with this wrapper's ``with_options`` applied. An
        ``organization`` / ``project`` given here is also sent as its header: the
        factories mask those headers (`providers.openai.http.pools.client_arguments`) so that the
        SDK's OPENAI_ORG_ID / OPENAI_PROJECT_ID never reach another provider."""
        opts = self._client_options
        if not opts:
            return client
        asked = {h: opts[o] for o, h in _ASKED_HEADERS if isinstance(opts.get(o), str)}
        if asked:
            opts = {**opts, "default_headers": {**(opts.get("default_headers") or {}), **asked}}
        return client.with_options(**opts)

    @property
    def clients(self) -> P:
        """The per-(target, credential) client cache."""
        return self._pool

    def with_options(self: G, **options: Any) -> G:
        """A wrapper sharing this one's policy, health store and client pools, whose
        attempts use ``client.with_options(**options)`` (the SDK's own). ``timeout``
        is one more bound on each attempt; ``max_retries`` other than 0, ``api_key``,
        ``base_url`` and ``http_client`` are refused."""
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

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _TWINS:
            mine, theirs = _TWINS[name]
            raise AttributeError(
                f"{type(self).__name__} has no {name}(): use {theirs} "
                f"(or {mine} for the {'async' if name == 'arun' else 'sync'} client)"
            )
        raise unsupported(type(self).__name__, name)

    def __repr__(self) -> str:
        chain = " -> ".join(f"{t.name}:{t.model}" for t in self.policy.targets)
        return f"{type(self).__name__}({chain})"


class Fallgate(_Base[ClientFactory, ClientPool]):
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

    _FLAVOUR = _Flavour(
        ClientPool, Admission, openai_factory, (Chat, Responses, Embeddings, Models)
    )
    _admission: Admission
    chat: Chat
    responses: Responses
    embeddings: Embeddings
    models: Models

    def run(self, **create_kwargs: Any) -> GateResult:
        """One non-streaming ``chat.completions.create`` turn; the `GateResult` holds the
        ChatCompletion, the trace and the usage."""
        return self._run(CHAT_CREATE, create_kwargs)

    def _run(self, op: Op, kwargs: Mapping[str, Any]) -> GateResult:
        call = prepare(op, kwargs, self._chains)
        if call.stream:
            raise TypeError(f"run() does not stream; use {op.name}(stream=True)")
        result, ledger = self._turn(call, usage=True)
        return ledger.result(result)

    def _invoke(self, op: Op, kwargs: Mapping[str, Any]) -> Any:
        call = prepare(op, kwargs, self._chains)
        if call.stream:
            self._pool.check_open()
            return FallgateStream[Any](self, call)
        return self._turn(call, usage=False)[0].value

    def _turn(self, call: Call, *, usage: bool) -> tuple[TurnResult, Ledger]:
        """One turn; its `GateResult` is made from the two only when asked for (`run`):
        the replies' `usage` is noted in the ledger then, or for telemetry."""
        ledger, seen, options = self._begin(call)
        # a reply's usage is read by run()'s GateResult and telemetry only (pacing reads
        # its own): create() alone skips it (~2 us a turn, bench.throughput)
        noted = usage or options["telemetry"] is not None

        def attempt(a: Attempt) -> Any:
            handed = issued()  # the deadline counts the client's build too
            ledger.begin(a)
            reading = pacing.READING.set(
                (self.health, a.target, a.credential, self.clock, pacing.sent_at(self.clock))
            )
            try:
                with self._pool.lease(a.target, a.credential, seen) as client:
                    # bounded from here: building a client is not the server's time
                    bound = attempt_bound(call.policy, a, issued=handed)
                    with self._admission.admitted(bound, a.until_deadline), bounded(bound):
                        reply = self._send(call, client, a)
                        parsed = call.op.accept(reply, call.kwargs)
                        if noted:
                            ledger.note(usage_of(parsed))
            finally:
                pacing.READING.reset(reading)
            if self.health.room:
                self._learn(call, a, usage_of(parsed))
            return reply

        try:
            return drive_checked(call.policy, attempt, cast(Options, options)), ledger
        except TurnFailed as e:
            ledger.attach(e)
            _raise_caller_mistake(e)
            raise

    def rebuild(self, target_name: str) -> None:
        """Close and recreate one target's clients (what transport recovery does)."""
        self._pool.rebuild(_target(self.policy, target_name))

    def close(self) -> None:
        """Close every client (shared with wrappers made by `with_options`). Turns in
        flight end `aborted` at once (their requests are cut), charged to no target;
        nothing is sent after."""
        self._pool.close()

    def __enter__(self) -> Fallgate:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncFallgate(_Base[AsyncClientFactory, AsyncClientPool]):
    """The asyncio twin of `Fallgate` (`openai.AsyncOpenAI` clients); ``await aclose()``
    or ``async with`` closes them. Cancelling a turn ends it `aborted`."""

    _FLAVOUR = _Flavour(
        AsyncClientPool,
        AsyncAdmission,
        async_openai_factory,
        (AsyncChat, AsyncResponses, AsyncEmbeddings, AsyncModels),
    )
    _admission: AsyncAdmission
    chat: AsyncChat
    responses: AsyncResponses
    embeddings: AsyncEmbeddings
    models: AsyncModels

    #: The event loop of this client's first call (None until then).
    _loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def _check_loop(self) -> None:
        """One AsyncFallgate, one event loop: its clients' connections belong to the loop
        of its first call, and fail in any other (or once that loop is closed)."""
        loop = asyncio.get_running_loop()
        first = self._loop() if self._loop is not None else None
        if first is None and self._loop is None:
            self._loop = weakref.ref(loop)
            return
        if first is not loop:
            raise RuntimeError(
                "this AsyncFallgate was first used on another event loop (its connections "
                "belong to that loop); make one AsyncFallgate per event loop, e.g. inside "
                "the coroutine that asyncio.run() runs"
            )

    async def arun(self, **create_kwargs: Any) -> GateResult:
        """One non-streaming ``chat.completions.create`` turn; the `GateResult` holds the
        ChatCompletion, the trace and the usage."""
        return await self._run(CHAT_CREATE, create_kwargs)

    async def _run(self, op: Op, kwargs: Mapping[str, Any]) -> GateResult:
        self._check_loop()
        call = prepare(op, kwargs, self._chains)
        if call.stream:
            raise TypeError(f"arun() does not stream; use {op.name}(stream=True)")
        result, ledger = await self._turn(call, usage=True)
        return ledger.result(result)

    async def _invoke(self, op: Op, kwargs: Mapping[str, Any]) -> Any:
        self._check_loop()
        call = prepare(op, kwargs, self._chains)
        if call.stream:
            self._pool.check_open()
            return await AsyncFallgateStream[Any](self, call)._prime()
        return (await self._turn(call, usage=False))[0].value

    async def _turn(self, call: Call, *, usage: bool) -> tuple[TurnResult, Ledger]:
        """See `Fallgate._turn`."""
        ledger, seen, options = self._begin(call)
        # a reply's usage is read by run()'s GateResult and telemetry only (pacing reads
        # its own): create() alone skips it (~2 us a turn, bench.throughput)
        noted = usage or options["telemetry"] is not None

        async def attempt(a: Attempt) -> Any:
            handed = issued()  # the deadline counts the client's build too
            ledger.begin(a)
            lease = self._pool.lease(a.target, a.credential, seen)
            async with lease as client:
                # bounded from here: building a client is not the server's time;
                # asyncio.timeout too where the socket is not bounded (`instrument`)
                bound = attempt_bound(call.policy, a, issued=handed)
                admission = self._admission
                if not admission.admit_now():  # engaged: wait for a slot
                    await admission.admit(bound, a.until_deadline)
                ok = False  # an explicit slot, not `admitted`: the hot path's calls are counted
                reading = pacing.READING.set(
                    (self.health, a.target, a.credential, self.clock, pacing.sent_at(self.clock))
                )
                try:
                    async with abounded(bound, backstop=not lease.bounded):
                        reply = await self._send(call, client, a)
                        parsed = call.op.accept(reply, call.kwargs)
                        if noted:
                            ledger.note(usage_of(parsed))
                    ok = True
                finally:
                    pacing.READING.reset(reading)
                    admission.release(ok, bound.lag)
            if self.health.room:
                self._learn(call, a, usage_of(parsed))
            return reply

        try:
            return await adrive_checked(call.policy, attempt, cast(AsyncOptions, options)), ledger
        except TurnFailed as e:
            ledger.attach(e)
            _raise_caller_mistake(e)
            raise

    async def rebuild(self, target_name: str) -> None:
        await self._pool.rebuild(_target(self.policy, target_name))

    async def aclose(self) -> None:
        """Close every client (shared with wrappers made by `with_options`). Turns in
        flight end `aborted`, charged to no target; nothing is sent after."""
        await self._pool.aclose()

    close = aclose

    async def __aenter__(self) -> AsyncFallgate:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


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
