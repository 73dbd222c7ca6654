"""Where a stream under the embedded HTTP client commits: the first event with content.

`providers.openai.http.embedded` hands the SDK a streamed response only once it has
seen an event that carries something for the caller (text, a tool call, reasoning, a
finish reason; for the Responses API a delta that is not empty, or the response's end;
openers, progress events and ``*.done`` events say nothing new). The events before it are held
back and replayed in front of the rest, so the SDK parses the stream the server
sent. Until then the stream still belongs to the turn: an error event raises
`FailedReply`, a stream that ends without content `MalformedReply`, and a cut
reaches the turn as the HTTP library's own error; each is classified by the
wrapper's classifier and may fall back.
"""

from __future__ import annotations

import json
from typing import Any

from ..deliveries import ENDINGS
from ..exceptions import FailedReply, MalformedReply
from .sse import boundary

__all__ = ["PEEK_LIMIT", "Peek"]

#: Bytes held back at most: a stream that says nothing for this long commits anyway
#: (its events go to the caller; the turn can no longer fall back).
PEEK_LIMIT = 1 << 20


def _chat_content(event: Any) -> bool:
    """A chat chunk that gives the caller something (not only ``role``)."""
    for choice in event.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("finish_reason"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(v for k, v in delta.items() if k != "role"):
            return True
    return False


class Peek:
    """Feed it the stream's bytes; `feed` says when the stream commits.

    `api` is ``"chat"`` (``/chat/completions``) or ``"responses"``.
    """

    __slots__ = ("_api", "_held", "_pending", "events")

    def __init__(self, api: str) -> None:
        self._api = api
        self._pending = b""
        self._held = 0
        #: Events seen so far (diagnostics).
        self.events = 0

    def feed(self, data: bytes) -> bool:
        """True once an event with content arrived; raises on an error event."""
        self._held += len(data)
        self._pending += data
        while True:
            cut = boundary(self._pending)
            if cut is None:
                break
            block, self._pending = self._pending[: cut[0]], self._pending[cut[1] :]
            if self._event(block):
                return True
        return self._held > PEEK_LIMIT

    def end(self) -> None:
        """The stream ended before any content: not a reply."""
        raise MalformedReply("a stream that ended before any content")

    def _event(self, block: bytes) -> bool:
        name = ""
        lines: list[str] = []
        for raw in block.decode("utf-8", "replace").splitlines():
            if raw.startswith(":"):
                continue  # an SSE comment (keep-alive)
            field, _, value = raw.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                lines.append(value)
        if not lines:
            return False
        self.events += 1
        data = "\n".join(lines)
        if data.strip() == "[DONE]":
            self.end()
        try:
            event = json.loads(data)
        except ValueError:  # dropped by the transport's `sse.SseFilter`; never seen here
            return False
        if not isinstance(event, dict):
            raise MalformedReply(f"a stream event that is {type(event).__name__}, not an object")
        if self._api == "chat":
            if event.get("error"):
                raise FailedReply(event["error"])
            return _chat_content(event)
        kind = str(event.get("type") or name)
        if kind == "error":
            raise FailedReply(event.get("error") or event)
        if kind == "response.failed":
            raise FailedReply((event.get("response") or {}).get("error") or event)
        if kind in ENDINGS:
            return True
        # a delta says something only when it is not empty (output, reasoning, arguments);
        # openers, progress and `*.done` events say nothing new
        return kind.endswith(".delta") and bool(event.get("delta"))
