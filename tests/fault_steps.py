"""Fault-server script steps that several scenarios replay, written once."""

from __future__ import annotations

from typing import Any

#: OpenAI's reply to a prompt longer than an 8k model's window (HTTP 400,
#: ``context_length_exceeded``): the outcome that skips smaller fallbacks.
CONTEXT_TOO_LONG_8K: dict[str, Any] = {
    "kind": "status",
    "status": 400,
    "body": {
        "error": {
            "message": "This model's maximum context length is 8192 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    },
}
