"""The one way tests build a policy: a chain of models, with made-up keys.

    chain("glm-5.1", "glm-4.7", max_attempts=2)        # primary + one fallback
    chain("big@8192", "small@4096", "huge@128000")     # "@n": the entry's context_length
    chain(*numbered(3), keys=2)                        # m0, m1, m2; two keys each
    chain("a", {"model": "b", "key_env": "FG_KEY"})    # a dict sets any target field
    chain("a", "b", server=fault_server)               # both served by the fault server

Entry `i` gets provider ``p{i}`` (override with ``provider=``, which may use ``{i}``), a
made-up base_url ``https://p{i}.test/v1`` when its provider is not a known one (a
policy's endpoints are always explicit) and, unless its dict names credentials, ``keys``
made-up API keys (`key(i, k)`, all between
`KEY_PREFIX` and `KEY_TAIL`, so a test can assert that no key leaked). Every other keyword is a
policy field (``max_attempts=2``, ``rules={...}``). The result goes through
`Policy.from_dict`, so it is validated exactly like a user's policy.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from fallgate.fsm import Policy
from fallgate.fsm.catalogue.registry import PROVIDERS

#: Every made-up key starts with KEY_PREFIX and ends with KEY_TAIL: a text holding
#: neither shows no key, not even a partly masked one ("sk-...0f1e2d3c4b5a").
KEY_PREFIX = "sk-fallgate-test"
KEY_TAIL = "0f1e2d3c4b5a"

_CREDENTIALS = ("api_key", "api_keys", "key_env", "key_envs")

Model = str | Mapping[str, Any]


def key(i: int, k: int = 0) -> str:
    """Made-up API key number `k` (0-based) of chain entry `i`."""
    return f"{KEY_PREFIX}-{i}-{k}-{KEY_TAIL}"


def numbered(n: int) -> tuple[str, ...]:
    """Model names ``m0`` .. ``m{n-1}``: a primary and n-1 fallbacks."""
    return tuple(f"m{i}" for i in range(n))


def target(
    model: Model,
    i: int = 0,
    *,
    keys: int = 1,
    provider: str = "p{i}",
    base_url: str | None = None,
) -> dict[str, Any]:
    """Chain entry `i` as a policy dict (the ``fallback_providers`` shape)."""
    fields: dict[str, Any]
    if isinstance(model, str):
        name, _, ctx = model.partition("@")
        fields = {"model": name}
        if ctx:
            fields["context_length"] = int(ctx)
    else:
        fields = dict(model)
    entry: dict[str, Any] = {"provider": provider.format(i=i)}
    if base_url is not None:
        entry["base_url"] = base_url
    entry.update(fields)
    if "base_url" not in entry and entry["provider"] not in PROVIDERS:
        entry["base_url"] = f"https://{entry['provider']}.test/v1"
    if not any(field in entry for field in _CREDENTIALS) and not entry.get("keyless"):
        entry["api_keys"] = [key(i, k) for k in range(keys)]
    return entry


def chain(
    *models: Model,
    keys: int | Sequence[int] = 1,
    provider: str | None = None,
    base_url: str | None = None,
    server: Any = None,
    **policy_fields: Any,
) -> Policy:
    """A validated policy: `models[0]` is the primary, the rest the fallbacks in order.

    `keys` is the pool size of every entry, or one size per entry. `server` (anything
    with a ``base_url``, such as the fault server) points every entry at it, with
    provider ``fault`` unless `provider` says otherwise.
    """
    if not models:
        raise ValueError("chain() needs at least one model (the primary)")
    sizes = [keys] * len(models) if isinstance(keys, int) else list(keys)
    if len(sizes) != len(models):
        raise ValueError(f"keys: {len(sizes)} pool sizes for {len(models)} models")
    if server is not None:
        base_url = server.base_url
        provider = provider or "fault"
    entries = [
        target(m, i, keys=sizes[i], provider=provider or "p{i}", base_url=base_url)
        for i, m in enumerate(models)
    ]
    return Policy.from_dict(
        {"primary": entries[0], "fallback_providers": entries[1:], **policy_fields}
    )


#: A two-target policy file: what the CLI tests check (its report has the default
#: policy's shape in seconds, not a minute).
SMALL_POLICY = (
    'max_attempts = 2\n[primary]\nprovider = "a"\nmodel = "a"\nkey_env = "A_KEY"\n'
    'base_url = "https://a.test/v1"\n[[fallback_providers]]\nprovider = "b"\nmodel = "b"\n'
    'key_env = "B_KEY"\nbase_url = "https://b.test/v1"\n'
)


@contextmanager
def no_collector_pauses() -> Iterator[None]:
    """For code run on bounds of tenths of a second: a full collection over the objects
    the suite's earlier tests leave in this process takes about as long (0.15 s
    measured), and an attempt starved by it is rightly the client's timeout. The earlier
    objects are frozen out of the collector's sight meanwhile."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def chat_text(gate: Any, messages: Any, *, stream: bool) -> str:
    """One chat turn on a `Fallgate` (streamed or not): the text the caller got."""
    if stream:
        with gate.chat.completions.create(messages=messages, stream=True) as s:
            return "".join(c.choices[0].delta.content or "" for c in s if c.choices)
    return str(gate.chat.completions.create(messages=messages).choices[0].message.content)


async def achat_text(gate: Any, messages: Any, *, stream: bool) -> str:
    """`chat_text` on an `AsyncFallgate`."""
    if stream:
        s = await gate.chat.completions.create(messages=messages, stream=True)
        async with s:
            return "".join([c.choices[0].delta.content or "" async for c in s if c.choices])
    reply = await gate.chat.completions.create(messages=messages)
    return str(reply.choices[0].message.content)


#: An empty output_text part, as a Responses message's content opens with.
OUTPUT_TEXT = {"type": "output_text", "text": "", "annotations": []}


def response_message(text: str | None, status: str, id: str = "msg_1") -> dict[str, Any]:
    """A Responses API message output item (no content yet when `text` is None)."""
    content = [] if text is None else [{**OUTPUT_TEXT, "text": text}]
    return {"type": "message", "id": id, "role": "assistant", "status": status, "content": content}


def response_body(status: str, output: list[Any], id: str = "resp_1") -> dict[str, Any]:
    """A Responses API response object of model ``a``."""
    return {"id": id, "object": "response", "created_at": 1, "model": "a", "status": status,
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": []}  # fmt: skip


def sdk_cut_errors() -> tuple[type[BaseException], ...]:
    """What the real SDK raises mid-iteration for a stream cut after its commit under
    `fallgate.http_client`: its connection error on openai 3.x, the HTTP library's own
    transport error on 2.x."""
    import openai
    from fallgate.providers.openai.http.transport import transport_errors

    return (openai.APIConnectionError, *transport_errors())
