"""fallgate inside hermes-agent: ``attach(agent)`` makes an `AIAgent`'s chat calls
fallgate turns.

    from run_agent import AIAgent
    from fallgate.providers.integrations.hermes import attach

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

from .attachment import HermesAttachment, HermesChatClient, HermesTurnFailed, attach, detach
from .config import policy_from_agent

__all__ = [
    "HermesAttachment",
    "HermesChatClient",
    "HermesTurnFailed",
    "attach",
    "detach",
    "policy_from_agent",
]
