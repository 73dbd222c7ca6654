"""Where a stream under the embedded HTTP client commits: the first event with content.

`providers.openai.http.embedded` hands the SDK a streamed response only once it has
seen an event that carries something for the caller, judged by the wrapper's own rule
(`calls.StreamRule`, on the events' JSON): chat text, a refusal, a tool call, audio, a
``length`` / ``content_filter`` finish; for the Responses API an output delta that is
not empty, or the response's end with output. Reasoning commits too (under a framework
the thinking reaches the caller as it comes; the wrapper holds it back). Openers,
progress events, ``*.done`` events and a bare finish (``stop``, ``tool_calls`` with no
call) say nothing. The events before the commit are held back and replayed in front of
the rest, so the SDK parses the stream the server sent. Until then the stream still
belongs to the turn: an error event or ``finish_reason: "error"`` raises `FailedReply`
(or `MalformedReply`), a stream that ends without content `MalformedReply` (a
``response.completed`` without output at once), one stopped by the content filter
having said nothing the SDK's content-filter error, and a cut reaches the turn as the
HTTP library's own error; each is classified by the wrapper's classifier and may fall
back.
"""

from __future__ import annotations

import json

from ..calls import STREAMS
from ..exceptions import MalformedReply
from .sse import boundary

__all__ = ["PEEK_LIMIT", "Peek"]

#: Bytes held back at most: a stream that says nothing for this long commits anyway
#: (its events go to the caller; the turn can no longer fall back).
PEEK_LIMIT = 1 << 20


class Peek:
    """Feed it the stream's bytes; `feed` says when the stream commits.

    `api` is ``"chat"`` (``/chat/completions``) or ``"responses"``.
    """

    __slots__ = ("_api", "_choices", "_held", "_pending", "events")

    def __init__(self, api: str) -> None:
        self._api = api
        self._pending = b""
        self._held = 0
        self._choices: set[int] = set()  # chat: `StreamRule`'s record of the choices
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
        # nothing was said before this event (it would have committed the stream)
        if self._api == "chat":
            return STREAMS.chat(event, self._choices, said=False) or STREAMS.reasoning(event)
        kind = str(event.get("type") or name)
        output, _ = STREAMS.responses(event, kind, said=False)
        return output or STREAMS.reasoning({**event, "type": kind})
