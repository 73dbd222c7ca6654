"""The attachment: an `AIAgent`'s chat calls as fallgate turns, its own retries off.

`attach` patches the agent instance (see `fallgate.providers.integrations.hermes` for
what and why); `HermesChatClient` is the chat client hermes is handed, one fallgate
turn per ``chat.completions.create``. The chain comes from `.config`.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any

import openai

from ....fsm import HealthStore, Policy, TurnFailed
from ....fsm.clock import Clock, SystemClock, default_clock
from ....fsm.core.turn import Hook
from ....fsm.host.drivers import check_health
from ...openai.client import Fallgate
from ...openai.streaming import FallgateStream
from .config import policy_data, primary_extras

__all__ = ["HermesAttachment", "HermesChatClient", "HermesTurnFailed", "attach", "detach"]

log = logging.getLogger("fallgate.hermes")

#: The agent methods `attach` replaces on the instance (each is a class method in hermes).
_PATCHED = (
    "_create_openai_client",
    "_try_activate_fallback",
    "_try_recover_primary_transport",
    "_recover_with_credential_pool",
    "_abort_request_openai_client",
)


#: The agent attributes `attach` sets (and `detach` restores).
_SAVED = ("_api_max_retries", "_fallback_chain", "_fallback_index", "_fallback_model")


class HermesTurnFailed(TurnFailed):
    """A model call of an attached agent that no target of the chain answered.

    The text is fallgate's (``fallgate turn failed: ...`` and, per target, why);
    ``__cause__`` is the last provider error (the SDK's exception), which is
    what hermes' error classifier reads for the status and body.
    """

    def __init__(self, failed: TurnFailed) -> None:
        super().__init__(
            failed.summary,
            state=failed.state,
            reasons=failed.reasons,
            last_outcome=failed.last_outcome,
            partial=failed.partial,
            trace=failed.trace,
        )
        for name in ("attempts_usage", "usage"):
            if hasattr(failed, name):
                setattr(self, name, getattr(failed, name))

    def _text(self) -> str:
        return "fallgate " + super()._text()


class _Aborted(KeyboardInterrupt):
    """Raised inside a turn that hermes cancelled: the host loop ends it `aborted`.

    A KeyboardInterrupt so that fallgate's host loop treats it as a cancellation;
    it never leaves `HermesChatClient` (it becomes a `HermesTurnFailed`)."""


def _aborted_failure() -> HermesTurnFailed:
    return HermesTurnFailed(
        TurnFailed("cancelled by hermes (interrupt or stale-call abort)", state="aborted")
    )


class _RequestClock:
    """The turn's clock for one request: a wait ends early, and the turn is
    cancelled, when hermes aborts the request."""

    def __init__(self, base: Clock, cancel: threading.Event) -> None:
        self._base = base
        self._cancel = cancel

    def now(self) -> float:
        return self._base.now()

    def sleep(self, seconds: float) -> None:
        if self._cancel.is_set():
            raise _Aborted
        if isinstance(self._base, SystemClock):
            if self._cancel.wait(seconds):
                raise _Aborted
        else:
            self._base.sleep(seconds)
            if self._cancel.is_set():
                raise _Aborted

    async def asleep(self, seconds: float) -> None:  # pragma: no cover - hermes is sync
        await self._base.asleep(seconds)


class _Gate(Fallgate):
    """`Fallgate` whose attempts first check the request's cancel flag."""

    _cancel: threading.Event | None = None

    def _configured(self, client: Any) -> Any:
        if self._cancel is not None and self._cancel.is_set():
            raise _Aborted
        return super()._configured(client)


class _Stream:
    """What ``create(stream=True)`` returns to hermes: the `FallgateStream`'s chunks,
    with a failure after the first chunk raised as `HermesTurnFailed` too."""

    def __init__(self, inner: FallgateStream[Any]) -> None:
        #: The fallgate stream (``.trace``, ``.usage``, ``.text``).
        self.fallgate = inner

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            return next(self.fallgate)
        except _Aborted:
            failure = _aborted_failure()
        except TurnFailed as e:
            failure = _converted(e)
        raise failure

    def close(self) -> None:
        self.fallgate.close()

    def __enter__(self) -> _Stream:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _converted(e: TurnFailed) -> HermesTurnFailed:
    out = HermesTurnFailed(e)
    out.__cause__ = e.last_error
    out.__suppress_context__ = True
    return out


class _Completions:
    def __init__(self, client: HermesChatClient) -> None:
        self._client = client

    def create(self, **kwargs: Any) -> Any:
        """One fallgate turn (``stream=True``: an iterator of ChatCompletionChunk)."""
        return self._client._attachment._create(self._client, kwargs)


class _Chat:
    def __init__(self, client: HermesChatClient) -> None:
        self.completions = _Completions(client)


class HermesChatClient:
    """What an attached agent's ``_create_openai_client`` returns: the part of an
    ``openai.OpenAI`` that hermes' chat path uses (``chat.completions.create``,
    ``close``, ``is_closed``, ``api_key``, ``base_url``), each call one turn on the
    attachment's `Fallgate`. Closing it closes nothing shared."""

    def __init__(self, attachment: HermesAttachment, client_kwargs: Mapping[str, Any]) -> None:
        self._attachment = attachment
        self.api_key = client_kwargs.get("api_key")
        self.base_url = client_kwargs.get("base_url")
        self.chat = _Chat(self)
        self._closed = False
        self._cancel = threading.Event()
        self._streams: weakref.WeakSet[_Stream] = weakref.WeakSet()

    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """hermes closes each request's client after the call (on its own thread)."""
        self._closed = True
        for s in list(self._streams):
            s.close()

    def abort(self) -> None:
        """hermes aborts a request from another thread: cancel its turn."""
        self._cancel.set()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"HermesChatClient wraps chat.completions.create for hermes' chat path; "
            f"{name!r} is not supported (it would not go through the fallback chain)"
        )

    def __repr__(self) -> str:
        return f"HermesChatClient({self._attachment.gate!r})"


class HermesAttachment:
    """fallgate attached to one `AIAgent` (see the module docstring); ``detach()``
    undoes it."""

    def __init__(
        self,
        agent: Any,
        policy: Policy | Mapping[str, Any] | None,
        health: HealthStore | None,
        on_transition: Hook | None,
    ) -> None:
        check_health(health)
        self.agent = agent
        self.health = health if health is not None else HealthStore()
        self.on_transition = on_transition
        #: How often hermes asked for its own fallback and was refused.
        self.fallback_refusals = 0
        self._options: dict[str, Any] = {}
        self._explicit = isinstance(policy, Policy)
        if isinstance(policy, Mapping):
            self._options = dict(policy)
        elif policy is not None and not self._explicit:
            raise TypeError(
                f"policy must be a fallgate Policy, a mapping of policy fields or None, "
                f"got {type(policy).__name__}"
            )
        self._lock = threading.Lock()
        self._saved = {name: getattr(agent, name) for name in _SAVED}
        #: hermes' fallback entries (hermes' own chain is emptied while attached).
        self.hermes_chain: list[dict[str, Any]] = list(self._saved["_fallback_chain"] or [])
        self._create_sdk = agent._create_openai_client  # hermes' own, bound
        self._abort_sdk = agent._abort_request_openai_client
        self._close_sdk = agent._close_openai_client
        self._extras: dict[str | None, dict[str, Any]] = {}
        self._signature: tuple[Any, ...] | None = None
        self.policy = policy if isinstance(policy, Policy) else self._build_policy()
        self.gate = self._new_gate(self.policy)

    # -- the policy and the gate --------------------------------------------------------

    def _agent_signature(self) -> tuple[Any, ...]:
        a = self.agent
        kw = getattr(a, "_client_kwargs", None) or {}
        return (a.provider, a.model, kw.get("base_url"), kw.get("api_key"))

    def _build_policy(self) -> Policy:
        data, extras = policy_data(self.agent, self.hermes_chain)
        data.update(self._options)
        self._extras = extras
        self._signature = self._agent_signature()
        return Policy.from_dict(data, source="the hermes agent's configuration")

    def _new_gate(self, policy: Policy) -> _Gate:
        if self._explicit:
            self._extras = primary_extras(self.agent)
        return _Gate(
            policy,
            health=self.health,
            on_transition=self.on_transition,
            client_factory=self._sdk_client,
        )

    def _sdk_client(self, target: Any, api_key: str) -> openai.OpenAI:
        """One target's SDK client, built by hermes' own client builder."""
        kwargs = dict(self._extras.get(target.base_url, {}))
        kwargs["api_key"] = api_key
        kwargs["base_url"] = target.base_url
        client = self._create_sdk(kwargs, reason="fallgate_attempt", shared=False)
        if not isinstance(client, openai.OpenAI):
            raise TypeError(
                f"hermes built a {type(client).__name__} for {target.name}, not an openai.OpenAI"
            )
        return client

    def _current_gate(self) -> _Gate:
        """The gate; rebuilt when hermes switched model or provider (``/model``)."""
        if self._explicit:
            return self.gate
        with self._lock:
            if self._agent_signature() != self._signature:
                old = self.gate
                self.policy = self._build_policy()
                self.gate = self._new_gate(self.policy)
                log.info("hermes switched model: fallgate chain rebuilt: %r", self.gate)
                old.close()
            return self.gate

    # -- one model call -------------------------------------------------------------------

    def _create(self, client: HermesChatClient, kwargs: Mapping[str, Any]) -> Any:
        gate = self._current_gate()
        call = dict(kwargs)
        if call.get("model") == self.agent.model:
            call.pop("model")  # hermes' own model: the whole chain (the policy's primary first)
        g = gate.with_options()  # a _Gate: with_options keeps the class
        g._cancel = client._cancel
        g.clock = _RequestClock(gate.clock or default_clock(), client._cancel)
        try:
            out = g.chat.completions.create(**call)
        except _Aborted:
            failure = _aborted_failure()
        except TurnFailed as e:
            failure = _converted(e)
        else:
            if isinstance(out, FallgateStream):
                stream = _Stream(out)
                client._streams.add(stream)
                return stream
            return out
        raise failure

    # -- the patches ----------------------------------------------------------------------

    def _patch(self) -> None:
        agent = self.agent

        def create_openai_client(
            client_kwargs: dict[str, Any], *, reason: str, shared: bool
        ) -> HermesChatClient:
            return HermesChatClient(self, client_kwargs)

        def try_activate_fallback(reason: Any = None) -> bool:
            self.fallback_refusals += 1
            return False

        def try_recover_primary_transport(*args: Any, **kwargs: Any) -> bool:
            return False

        def recover_with_credential_pool(**kwargs: Any) -> tuple[bool, bool]:
            return False, bool(kwargs.get("has_retried_429", False))

        def abort_request_openai_client(client: Any, *, reason: str) -> None:
            if isinstance(client, HermesChatClient):
                client.abort()
            else:
                self._abort_sdk(client, reason=reason)

        patches: dict[str, Callable[..., Any]] = {
            "_create_openai_client": create_openai_client,
            "_try_activate_fallback": try_activate_fallback,
            "_try_recover_primary_transport": try_recover_primary_transport,
            "_recover_with_credential_pool": recover_with_credential_pool,
            "_abort_request_openai_client": abort_request_openai_client,
        }
        for name, fn in patches.items():
            setattr(agent, name, fn)
        agent._api_max_retries = 1
        agent._fallback_chain = []
        agent._fallback_index = 0
        agent._fallback_model = None
        old = getattr(agent, "client", None)
        agent.client = HermesChatClient(self, getattr(agent, "_client_kwargs", None) or {})
        if old is not None and not isinstance(old, HermesChatClient):
            self._close_sdk(old, reason="fallgate_attach", shared=True)
        agent._fallgate = self

    def detach(self) -> None:
        """Give the agent back its own client, retries and fallback; close fallgate's
        clients."""
        agent = self.agent
        if getattr(agent, "_fallgate", None) is not self:
            return
        for name in _PATCHED:
            agent.__dict__.pop(name, None)
        for name, value in self._saved.items():
            setattr(agent, name, value)
        agent.client = agent._create_openai_client(
            agent._client_kwargs, reason="fallgate_detach", shared=True
        )
        del agent._fallgate
        self.gate.close()

    def __repr__(self) -> str:
        return f"HermesAttachment({self.gate!r})"


def attach(
    agent: Any,
    policy: Policy | Mapping[str, Any] | None = None,
    health: HealthStore | None = None,
    *,
    on_transition: Hook | None = None,
) -> HermesAttachment:
    """Route `agent`'s chat calls (plain and streamed) through fallgate; switch off
    hermes' own retries and fallback for it. See the module docstring.

    ``policy``: a `Policy`, a mapping of policy fields laid over the chain built
    from the agent's configuration, or None (that chain with fallgate's
    defaults). ``health``: the cross-turn `HealthStore`. ``on_transition``
    receives every `TraceEvent`. Attaching again replaces the earlier attachment.
    """
    mode = getattr(agent, "api_mode", None)
    if mode != "chat_completions":
        raise ValueError(
            f"fallgate.providers.integrations.hermes covers hermes' chat_completions path; "
            f"this agent's "
            f"api_mode is {mode!r}"
        )
    if getattr(agent, "provider", None) in ("copilot-acp", "moa"):
        raise ValueError(f"provider {agent.provider!r} does not speak HTTP to one chain")
    previous = getattr(agent, "_fallgate", None)
    if previous is not None:
        previous.detach()
    attachment = HermesAttachment(agent, policy, health, on_transition)
    attachment._patch()
    log.info("fallgate attached to hermes agent: %r", attachment.gate)
    return attachment


def detach(agent: Any) -> None:
    """Undo `attach` (nothing happens if the agent is not attached)."""
    attachment = getattr(agent, "_fallgate", None)
    if attachment is not None:
        attachment.detach()
