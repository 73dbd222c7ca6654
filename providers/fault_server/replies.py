"""What the fault server sends: OpenAI-shaped JSON bodies, as plain dicts.

Chat completions and stream chunks (with usage), error bodies, model objects,
and how a scripted text is cut into stream pieces. No I/O here.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

#: The body of an ``invalid_json`` step that gives none.
BROKEN_JSON = '{"id": "chatcmpl-broken", "choices": [ <html>oops'

_ids = itertools.count(1)
_ids_lock = threading.Lock()


def new_id() -> str:
    """A fresh completion id, unique in this process: ``chatcmpl-fault-000001``."""
    with _ids_lock:
        return f"chatcmpl-fault-{next(_ids):06d}"


def _tokens(text: str) -> int:
    return len(text.split())


def usage(request: Mapping[str, Any], text: str) -> dict[str, int]:
    """Token counts: words of each message's content (1 for other content), of `text`."""
    prompt = 0
    messages = request.get("messages")
    if isinstance(messages, list):
        for m in messages:
            content = m.get("content") if isinstance(m, Mapping) else None
            prompt += _tokens(content) if isinstance(content, str) else 1
    completion = _tokens(text)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion(model: str, text: str, finish: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """A ``chat.completion`` answering `request` with `text`."""
    return {
        "id": new_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": usage(request, text),
    }


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
    ident: str, created: int, model: str, request: Mapping[str, Any], text: str
) -> dict[str, Any]:
    """The last chunk of a stream with ``include_usage``: no choices, the usage."""
    out = chunk(ident, created, model, {}, None, with_usage=True)
    out["choices"] = []
    out["usage"] = usage(request, text)
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


def stream_pieces(chunks: int | tuple[str, ...] | None) -> list[str]:
    """A ``stream`` step's pieces: the given list, or ``chunk-1 ``, ... (3 by default)."""
    if chunks is None:
        chunks = 3
    if isinstance(chunks, int):
        return [f"chunk-{i} " for i in range(1, chunks + 1)]
    return list(chunks)
