"""fallgate inside hermes-agent: ``attach(agent)`` makes an `AIAgent`'s chat calls
fallgate turns.

    from run_agent import AIAgent
    from fallgate.providers.hermes import attach

    agent = AIAgent(model="glm-5.1", provider="zai", fallback_model=[...], ...)
    attach(agent)                         # the one line
    agent.run_conversation("Say hello")   # every model call is one fallgate turn

Without ``policy`` the chain is built from the agent's own configuration: its
model, provider, base URL and key (its credential pool's keys too, rotated by
fallgate) as the primary, then each entry of ``fallback_model`` /
``fallback_providers`` in order (entries without a base URL or key are resolved
by hermes' own ``resolve_provider_client``, as hermes' fallback does).
``policy`` may be a `Policy` (used as is) or a mapping of policy fields laid
over the one built from the agent, e.g. ``attach(agent, {"attempt_timeout":
30, "max_attempts": 2})``. ``health`` is the cross-turn `HealthStore` (default:
one of the attachment's own, so cooldowns carry from one model call of the
conversation to the next).

What it patches (on the agent instance only; `HermesAttachment.detach()` puts
everything back):

- ``_create_openai_client``: hermes builds every chat client there (the shared
  one and one per request); it now returns a `HermesChatClient` whose
  ``chat.completions.create`` (plain and ``stream=True``, with tools) is one
  fallgate turn on one `Fallgate` per attachment. The SDK clients of each
  target are still built by hermes' original ``_create_openai_client`` (its
  TLS, proxy and keep-alive settings; the SDK's ``max_retries=0``).
- hermes' own retries are switched off, all four layers:

  1. ``agent._api_max_retries = 1``: the ``while retry_count < max_retries``
     loop of hermes' conversation loop makes one attempt per model call (its
     documented "1 = no retry"), so no jittered backoff and no Retry-After
     sleeps. Its Z.AI Coding overload rule raises that ceiling for an error
     whose own ``status_code`` is 429; `HermesTurnFailed` has none (the status
     is on its ``__cause__``), so that rule never matches.
  2. ``_try_recover_primary_transport`` returns False: hermes' one extra
     primary attempt on a rebuilt client (fallgate's ``_recovering`` state
     does that, once per target per turn).
  3. ``_recover_with_credential_pool`` returns "not recovered": hermes' key
     rotation (fallgate rotates the policy's keys, the pool's among them).
  4. The streaming path's reconnect loop (``HERMES_STREAM_RETRIES``) retries
     only transport exceptions (httpx errors, ``ConnectionError``, SSE
     connection errors, empty streams); a `HermesChatClient` raises none: every
     failure is a turn fallgate already retried, raised as `HermesTurnFailed`.

  The SDK's own retries were already 0 (hermes' builder sets ``max_retries=0``;
  fallgate's pools keep it so).
- hermes' own fallback is switched off: ``agent._fallback_chain`` is emptied
  (the entries are kept on the attachment and are fallgate's chain) and
  ``_try_activate_fallback`` returns False and counts the refusal
  (`HermesAttachment.fallback_refusals`), so the model and provider hermes
  shows never change and hermes never rebuilds its request for another
  provider.
- ``_abort_request_openai_client`` (hermes' interrupt and stale-call abort,
  called from another thread): for a `HermesChatClient` it cancels that
  request's turn, which ends `aborted` at its next wait or attempt (an attempt
  already in flight runs to its timeout on hermes' worker thread, whose result
  hermes has already dropped).

What hermes still gets: a failed turn raises `HermesTurnFailed` (a
`TurnFailed`) whose text is fallgate's reasons, every target of the chain and
why it did not answer; its ``__cause__`` is the last provider error, so
hermes' error classifier sees the real status and body (a 429 is a rate limit,
a 402 billing, a 400 a non-retryable request) and ends the turn with its usual
message and guidance, after one attempt. hermes' request repairs (context
compression, image shrinking, a provider's OAuth refresh, a length
continuation) still run as in hermes; each sends a new request, which is a new
fallgate turn.

Limits: only ``api_mode == "chat_completions"`` (hermes' OpenAI-wire path) is
covered; the request hermes builds for its primary (``extra_body``, reasoning
settings) is sent to every target of the chain. hermes-agent is imported only
inside functions: fallgate does not depend on it.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, cast

import openai

from ..fsm import HealthStore, Policy, TurnFailed
from ..fsm.clock import Clock, SystemClock, default_clock
from ..fsm.drivers import check_health
from ..fsm.turn import Hook
from .openai_adapter import Fallgate
from .streaming import FallgateStream

__all__ = [
    "HermesAttachment",
    "HermesChatClient",
    "HermesTurnFailed",
    "attach",
    "detach",
    "policy_from_agent",
]

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
        data, extras = _policy_data(self.agent, self.hermes_chain)
        data.update(self._options)
        self._extras = extras
        self._signature = self._agent_signature()
        return Policy.from_dict(data, source="the hermes agent's configuration")

    def _new_gate(self, policy: Policy) -> _Gate:
        if self._explicit:
            self._extras = _primary_extras(self.agent)
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
        g = cast(_Gate, gate.with_options())
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
            f"fallgate.providers.hermes covers hermes' chat_completions path; this agent's "
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


def policy_from_agent(agent: Any, options: Mapping[str, Any] | None = None) -> Policy:
    """The chain `attach` builds from an agent's configuration (see the module
    docstring), with ``options`` (policy fields) laid over it."""
    chain = getattr(agent, "_fallgate", None)
    entries = chain.hermes_chain if chain is not None else list(agent._fallback_chain or [])
    data, _ = _policy_data(agent, entries)
    data.update(options or {})
    return Policy.from_dict(data, source="the hermes agent's configuration")


# -- reading hermes' configuration ------------------------------------------------------


def _primary_extras(agent: Any) -> dict[str | None, dict[str, Any]]:
    """hermes' client options for its primary's base URL (headers, query, TLS)."""
    kw = dict(getattr(agent, "_client_kwargs", None) or {})
    base_url = kw.pop("base_url", None)
    kw.pop("api_key", None)
    kw.pop("http_client", None)
    return {_str_or_none(base_url): kw}


def _policy_data(
    agent: Any, entries: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str | None, dict[str, Any]]]:
    """(policy dict, per-base-URL client options) from the agent's configuration."""
    kw = getattr(agent, "_client_kwargs", None) or {}
    key = kw.get("api_key", getattr(agent, "api_key", None))
    if key is not None and not isinstance(key, str):
        raise ValueError(
            "the agent's key is not a string (an Entra ID token provider?): pass attach() a "
            "Policy of your own"
        )
    base_url = _str_or_none(kw.get("base_url") or getattr(agent, "base_url", None))
    keys = [key] if key else []
    for pooled in _pool_keys(agent, base_url):
        if pooled not in keys:
            keys.append(pooled)
    primary: dict[str, Any] = {
        "provider": (agent.provider or "custom"),
        "model": agent.model,
        "base_url": base_url,
        # a keyless local server still gets a bearer token (the SDK requires one)
        "api_keys": keys or ["no-key"],
    }
    extras = _primary_extras(agent)
    fallbacks: list[dict[str, Any]] = []
    seen = {(primary["provider"], primary["model"]), (base_url, primary["model"])}
    for entry in entries:
        fb = _fallback_entry(entry)
        if fb is None:
            continue
        target, options = fb
        ids = ((target["provider"], target["model"]), (target.get("base_url"), target["model"]))
        if any(i in seen for i in ids):
            log.warning("fallback %s/%s repeats an earlier target: skipped", *ids[0])
            continue
        seen.update(ids)
        fallbacks.append(target)
        if options and target.get("base_url") not in extras:
            extras[target.get("base_url")] = options
    return {"primary": primary, "fallback_providers": fallbacks}, extras


def _fallback_entry(entry: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """One hermes fallback entry as a policy target (and its client options), or None
    when hermes could not reach it either."""
    provider = str(entry.get("provider") or "").strip().lower()
    model = str(entry.get("model") or "").strip()
    if not provider or not model:
        return None
    base_url = _str_or_none(entry.get("base_url"))
    api_key = _str_or_none(entry.get("api_key"))
    key_env = _str_or_none(entry.get("key_env") or entry.get("api_key_env"))
    options: dict[str, Any] = {}
    if base_url is None or (api_key is None and key_env is None):
        resolved = _resolve(provider, model, base_url, api_key)
        if resolved is None:
            log.warning("fallback %s/%s: hermes cannot resolve it: skipped", provider, model)
            return None
        base_url = base_url or _str_or_none(str(resolved.base_url))
        if api_key is None and key_env is None:
            api_key = _str_or_none(resolved.api_key)
        headers = getattr(resolved, "_custom_headers", None)
        if headers:
            options["default_headers"] = dict(headers)
        try:
            resolved.close()
        except Exception:  # pragma: no cover - best effort
            pass
    target: dict[str, Any] = {
        "provider": provider,
        "model": _normalized(model, provider),
        "base_url": base_url,
    }
    if key_env is not None and api_key is None:
        target["key_env"] = key_env
    else:
        target["api_key"] = api_key or "no-key"
    return target, options


def _resolve(provider: str, model: str, base_url: str | None, api_key: str | None) -> Any:
    """hermes' own provider router (its fallback uses the same)."""
    try:
        from agent.auxiliary_client import (  # type: ignore[import-not-found]
            resolve_provider_client,
        )
    except ImportError:  # pragma: no cover - attach() is only given hermes agents
        return None
    try:
        client, _ = resolve_provider_client(
            provider,
            model=model,
            raw_codex=True,
            explicit_base_url=base_url,
            explicit_api_key=api_key,
        )
    except Exception as e:
        log.warning("fallback %s/%s: hermes' resolver failed: %s", provider, model, e)
        return None
    return client if isinstance(client, openai.OpenAI) else None


def _normalized(model: str, provider: str) -> str:
    try:
        from hermes_cli.model_normalize import (  # type: ignore[import-not-found]
            normalize_model_for_provider,
        )
    except ImportError:  # pragma: no cover
        return model
    try:
        return str(normalize_model_for_provider(model, provider) or model)
    except Exception:
        return model


def _pool_keys(agent: Any, base_url: str | None) -> list[str]:
    """The keys of the agent's credential pool for its primary (fallgate rotates them)."""
    pool = getattr(agent, "_credential_pool", None)
    if pool is None:
        return []
    out = []
    try:
        for entry in pool.entries():
            entry_url = _str_or_none(getattr(entry, "runtime_base_url", None))
            if entry_url is not None and base_url is not None and entry_url != base_url:
                continue
            key = entry.runtime_api_key
            if isinstance(key, str) and key.strip():
                out.append(key.strip())
    except Exception as e:  # a pool of another shape: its keys stay hermes'
        log.warning("credential pool not read (%s): only the agent's current key is used", e)
        return []
    return out


def _str_or_none(v: Any) -> str | None:
    if v is None:
        return None
    s = str(v).strip()
    return s or None
