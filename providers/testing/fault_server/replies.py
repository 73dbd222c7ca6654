"""What the fault server sends: OpenAI-shaped JSON bodies, as plain dicts.

Chat completions and stream chunks (with usage and tool calls), embeddings,
error bodies (OpenAI's and Anthropic's), model objects, and how a scripted
text is cut into stream pieces. No I/O here. (The Responses API shapes are in
`.responses`.)
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from .script import ToolCall

#: The body of an ``invalid_json`` step that gives none.
BROKEN_JSON = '{"id": "chatcmpl-broken", "choices": [ <html>oops'

_ids = itertools.count(1)
_ids_lock = threading.Lock()


def new_id(prefix: str = "chatcmpl-fault-") -> str:
    """A fresh id, unique in this process: ``chatcmpl-fault-000001``."""
    with _ids_lock:
        return f"{prefix}{next(_ids):06d}"


def _tokens(text: str) -> int:
    return len(text.split())


#: A scripted call with the id it is sent under (the script's, or a fresh one).
IdentifiedCall = tuple[str, ToolCall]


def identify(calls: Sequence[ToolCall]) -> list[IdentifiedCall]:
    return [(c.id or new_id("call_fault_"), c) for c in calls]


def spoken(text: str, calls: Sequence[IdentifiedCall]) -> str:
    """What the model "said", for token counts: the text and the call arguments."""
    return " ".join([text, *(c.arguments for _, c in calls)])


def message_tokens(m: object) -> int:
    """One message's prompt tokens: the words of its content (1 for other content)."""
    content = m.get("content") if isinstance(m, Mapping) else None
    return _tokens(content) if isinstance(content, str) else 1


def usage(request: Mapping[str, Any], text: str, cached: int | None = None) -> dict[str, Any]:
    """Token counts: words of each message's content (1 for other content), of `text`;
    with `cached`, the prompt tokens the deployment's prompt cache served
    (`fault_server.prompt_cache`)."""
    prompt = 0
    messages = request.get("messages")
    if isinstance(messages, list):
        for m in messages:
            prompt += message_tokens(m)
    completion = _tokens(text)
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def completion(
    model: str,
    text: str,
    finish: str,
    request: Mapping[str, Any],
    calls: Sequence[IdentifiedCall] = (),
    cached: int | None = None,
) -> dict[str, Any]:
    """A ``chat.completion`` answering `request` with `text` (and tool `calls`)."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["content"] = text or None
        message["tool_calls"] = [
            {
                "id": ident,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for ident, c in calls
        ]
    return {
        "id": new_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": usage(request, spoken(text, calls), cached),
    }


def chat_deltas(
    pieces: Sequence[str], calls: Sequence[IdentifiedCall], arg_pieces: int
) -> list[dict[str, Any]]:
    """The deltas of a streamed chat answer: the text pieces, then each tool
    call (its id, type and name with empty arguments, then the arguments in
    `arg_pieces` pieces); the first delta carries the role."""
    out: list[dict[str, Any]] = [{"content": p} for p in pieces]
    for index, (ident, call) in enumerate(calls):
        function = {"name": call.name, "arguments": ""}
        opener = {"index": index, "id": ident, "type": "function", "function": function}
        out.append({"tool_calls": [opener]})
        for part in split(call.arguments, arg_pieces):
            out.append({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
    if out:
        first = {"role": "assistant", **out[0]}
        first.setdefault("content", None)
        out[0] = first
    return out


def chunk(
    ident: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish: str | None,
    *,
    with_usage: bool,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``usage: null`` when the client asked for usage."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    out: dict[str, Any] = {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [choice],
    }
    if with_usage:
        out["usage"] = None
    return out


def usage_chunk(
    ident: str,
    created: int,
    model: str,
    request: Mapping[str, Any],
    text: str,
    cached: int | None = None,
) -> dict[str, Any]:
    """The last chunk of a stream with ``include_usage``: no choices, the usage."""
    out = chunk(ident, created, model, {}, None, with_usage=True)
    out["choices"] = []
    out["usage"] = usage(request, text, cached)
    return out


def stream_error(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The object of a mid-stream ``data: {"error": ...}`` event."""
    return {
        "message": "scripted stream error",
        "type": "server_error",
        "param": None,
        "code": None,
        **(overrides or {}),
    }


def anthropic_error(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """An Anthropic-style stream error event: ``{"type": "error", "error": {...}}``."""
    return {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded", **(overrides or {})},
    }


def error_type(status: int) -> str:
    """The OpenAI error ``type`` that goes with an HTTP status."""
    return {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_exceeded",
    }.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(message: str, type_: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": None}}


def model_object(model: str) -> dict[str, Any]:
    """An entry of ``GET /v1/models``."""
    return {"id": model, "object": "model", "created": 0, "owned_by": "fallgate-fault-server"}


def answer_pieces(text: str, chunks: int | tuple[str, ...] | None) -> list[str]:
    """An ``answer`` step's text as stream pieces: the given list, N near-equal
    pieces, or (no `chunks`) one piece per word with its surrounding blanks."""
    if isinstance(chunks, tuple):
        return list(chunks)
    if chunks is None:
        return re.findall(r"\s*\S+\s*", text) or [text]
    size, extra = divmod(len(text), chunks)
    out, at = [], 0
    for i in range(chunks):
        n = size + (1 if i < extra else 0)
        out.append(text[at : at + n])
        at += n
    return out


def split(text: str, n: int) -> list[str]:
    """`text` in `n` near-equal pieces, fewer if it is shorter (never an empty piece
    unless `text` is empty)."""
    return answer_pieces(text, max(1, min(n, len(text))))


def stream_pieces(chunks: int | tuple[str, ...] | None) -> list[str]:
    """A ``stream`` step's pieces: the given list, or ``chunk-1 ``, ... (3 by default)."""
    if chunks is None:
        chunks = 3
    if isinstance(chunks, int):
        return [f"chunk-{i} " for i in range(1, chunks + 1)]
    return list(chunks)


# --------------------------------------------------------------------------- embeddings

EMBEDDING_DIMENSIONS = 16


def embedding_inputs(raw: Any) -> list[str | list[int]] | None:
    """The inputs of an embeddings request (a string, strings, a token array or
    token arrays), one per vector; None when `input` is none of these."""
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list) or not raw:
        return None
    if all(isinstance(x, str) for x in raw):
        return list(raw)
    if all(_is_int(x) for x in raw):
        return [list(raw)]
    if all(isinstance(x, list) and x and all(_is_int(t) for t in x) for x in raw):
        return [list(x) for x in raw]
    return None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def vector(item: str | list[int], dimensions: int) -> list[float]:
    """A deterministic unit vector for one input: SHA-256 of the input stretched
    to `dimensions` numbers, normalised, each exactly a float32 (so the float
    and base64 encodings of it are the same numbers)."""
    seed = (item if isinstance(item, str) else json.dumps(item)).encode()
    raw: list[float] = []
    block = 0
    while len(raw) < dimensions:
        digest = hashlib.sha256(b"%d:" % block + seed).digest()
        raw.extend(n / 2**31 - 1.0 for n in struct.unpack(">8I", digest))
        block += 1
    raw = raw[:dimensions]
    norm = sum(x * x for x in raw) ** 0.5 or 1.0
    return list(
        struct.unpack(f"<{dimensions}f", struct.pack(f"<{dimensions}f", *(x / norm for x in raw)))
    )


def embeddings(
    model: str, inputs: Sequence[str | list[int]], dimensions: int, encoding: str
) -> dict[str, Any]:
    """A ``list`` of ``embedding`` objects, one per input, as floats or base64
    (little-endian float32, as OpenAI sends them)."""
    data = []
    for i, item in enumerate(inputs):
        vec = vector(item, dimensions)
        sent: list[float] | str = vec
        if encoding == "base64":
            sent = base64.b64encode(struct.pack(f"<{dimensions}f", *vec)).decode()
        data.append({"object": "embedding", "index": i, "embedding": sent})
    tokens = sum(_tokens(x) if isinstance(x, str) else len(x) for x in inputs)
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


#: What a provider that takes no assistant prefix answers one (``refuse_prefix``): the
#: words Anthropic's newer models use.
PREFIX_REFUSED: Final = {
    "error": {
        "message": "This model does not support assistant message prefill. The "
        "conversation must end with a user message.",
        "type": "invalid_request_error",
    }
}


def assistant_prefix(request: Mapping[str, Any], api: str) -> str | None:
    """The text of the request's last message when it is the assistant's (a
    continuation's prefix: chat ``messages``, Responses ``input``); else None."""
    listed = request.get("messages") if api == "chat" else request.get("input")
    if not isinstance(listed, list) or not listed:
        return None
    last = listed[-1]
    if not isinstance(last, Mapping) or last.get("role") != "assistant":
        return None
    content = last.get("content")
    return content if isinstance(content, str) else None
