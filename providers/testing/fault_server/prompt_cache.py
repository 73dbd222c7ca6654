"""A deployment's prompt cache, as the fault server plays it.

Providers cache the prompt prefixes they have processed, per deployment and account:
a request that begins with a prefix seen before on the same deployment and key is
billed, and answered, faster for those tokens, and its usage says how many
(``usage.prompt_tokens_details.cached_tokens``). The fault server keeps one
`PromptCache` per server (a server is one deployment) and reports, on every answer of
``/v1/chat/completions`` (a stream's usage chunk included), the tokens of the longest
run of whole messages, from the first, that an earlier answered request on this server
with this key began with (or was). The same conversation sent to another server, or
with another key, starts cold there. Counting is the server's usual one (words of each
message's content, 1 for other content); no minimum prefix length, no expiry but a
bound on what is kept (`MAX_PREFIXES`, oldest first out).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from .replies import message_tokens

__all__ = ["MAX_PREFIXES", "PromptCache"]

#: The most prefixes one server keeps (over all keys).
MAX_PREFIXES: Final = 200_000


class PromptCache:
    """The prefixes one deployment has seen, per API key (thread-safe)."""

    def __init__(self, max_prefixes: int = MAX_PREFIXES) -> None:
        self._lock = threading.Lock()
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._max = max_prefixes

    def read(self, api_key: str | None, request: Mapping[str, Any]) -> int:
        """The cached tokens of `request` (chat ``messages``) under `api_key`; then
        every prefix of it is cached."""
        messages = request.get("messages")
        if not isinstance(messages, list):
            return 0
        h = hashlib.sha256((api_key or "").encode()).digest()
        chain: list[tuple[bytes, int]] = []
        tokens = 0
        for m in messages:
            text = json.dumps(m, sort_keys=True, default=str).encode()
            h = hashlib.sha256(h + text).digest()
            tokens += message_tokens(m)
            chain.append((h, tokens))
        cached = 0
        with self._lock:
            for h, upto in chain:
                if h not in self._seen:
                    break
                cached = upto
                self._seen.move_to_end(h)
            for h, _ in chain:
                self._seen[h] = None
            while len(self._seen) > self._max:
                self._seen.popitem(last=False)
        return cached

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()
