"""One request of the SDK's, read once, and what each attempt of its turn sends.

The embedded HTTP client (`providers.openai.http.embedded`) receives requests the
caller's own `openai.OpenAI` built for its own ``base_url`` and ``api_key``. An
`Exchange` keeps the request's endpoint (the path from the API resource on:
``/chat/completions``, ``/responses``, ...; whatever prefix the caller's base_url
had is dropped) and its JSON body, and builds each attempt's request: the target's
base_url (host and path prefix, its query kept), the body's ``model`` set to the
target's, the ``Authorization`` header to the attempt's key. Headers the caller's
client sent for OpenAI's own API (organization, project) are dropped for anyone
else, like the wrapper's clients do (`providers.openai.http.pools.client_arguments`).

The answers the SDK is handed are built here too: a reply as the target sent it
(decoded, so the SDK parses plain bytes), and a failed turn as an HTTP error with
``x-should-retry: false`` (the SDK never retries what the turn already decided).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import openai
from openai.types import CreateEmbeddingResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response as ResponsesReply

from ....fsm import Policy, TurnFailed
from ....fsm.core.actions import Attempt
from ..calls import check_completion, check_embeddings, check_response
from ..chain import Chains, model_objects
from . import transport
from .timeouts import engine_phases

__all__ = ["Exchange", "Refused", "failed_answer", "reply_answer", "status_error"]

#: The first path segment of each OpenAI API resource: where the caller's prefix ends.
_RESOURCES = frozenset(
    {
        "assistants",
        "audio",
        "batches",
        "chat",
        "completions",
        "containers",
        "conversations",
        "embeddings",
        "evals",
        "files",
        "fine_tuning",
        "images",
        "models",
        "moderations",
        "realtime",
        "responses",
        "threads",
        "uploads",
        "vector_stores",
        "videos",
    }
)
#: Headers never sent on: the caller's key, and what the HTTP library sets per request.
_DROPPED = frozenset(
    {"authorization", "api-key", "x-api-key", "host", "content-length", "transfer-encoding"}
)
_OPENAI_ONLY = frozenset({"openai-organization", "openai-project"})
_OPENAI_HOSTS = frozenset({"api.openai.com"})
#: Headers of a reply that no longer hold once its body was read (and decoded).
_STALE = frozenset({"content-encoding", "content-length", "transfer-encoding"})
#: What a 2xx reply on an endpoint must be for the turn to accept it.
_CHECKS: dict[str, tuple[Any, Callable[[Any, Any], None]]] = {
    "/chat/completions": (ChatCompletion, check_completion),
    "/responses": (ResponsesReply, check_response),
    "/embeddings": (CreateEmbeddingResponse, check_embeddings),
}
_APIS = {"/chat/completions": "chat", "/responses": "responses"}


class Refused(Exception):
    """A request the gate answers itself, without a turn (a model not in the chain)."""

    def __init__(self, status: int, message: str, code: str) -> None:
        self.status = status
        self.code = code
        super().__init__(message)

    def answer(self, request: Any) -> Any:
        body = {"error": {"message": str(self), "type": "invalid_request_error", "code": self.code}}
        return _json_answer(self.status, body, request)


def endpoint_of(path: str) -> str:
    """``/v1/chat/completions`` -> ``/chat/completions`` (any prefix before the resource)."""
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        if part in _RESOURCES:
            return "/" + "/".join(parts[i:])
    if parts and parts[0] == "v1":
        parts = parts[1:]
    return "/" + "/".join(parts)


class Exchange:
    """The caller's request and what an attempt of its turn sends (see the module)."""

    __slots__ = ("api", "body", "endpoint", "first", "payload", "request", "stream")

    def __init__(self, request: Any, chains: Chains) -> None:
        self.request = request
        self.endpoint = endpoint_of(request.url.path)
        #: ``"chat"`` / ``"responses"`` where a stream is peeked before it commits.
        self.api = _APIS.get(self.endpoint) if request.method == "POST" else None
        self.body: bytes = request.content
        self.payload: dict[str, Any] | None = None
        ctype = request.headers.get("content-type", "")
        if self.body and ctype.startswith("application/json"):
            try:
                loaded = json.loads(self.body)
            except ValueError:
                loaded = None  # sent as it is: the target says what it makes of it
            if isinstance(loaded, dict):
                self.payload = loaded
        self.stream = bool(self.payload and self.payload.get("stream") is True)
        self.first = 0
        if self.payload is not None and "model" in self.payload:
            try:
                self.first = chains.index(self.payload["model"])
            except ValueError as e:
                raise Refused(400, f"fallgate: {e}", "model_not_in_chain") from None

    def local(self, policy: Policy) -> Any | None:
        """``GET /models`` (and ``/models/ID``) answered from the chain, as the wrapper's
        ``models.list()`` is; None for anything that goes to a target."""
        if self.request.method != "GET" or not self.endpoint.startswith("/models"):
            return None
        models = model_objects(policy)
        name = self.endpoint.removeprefix("/models").strip("/")
        if not name:
            data = [m.model_dump() for m in models]
            return _json_answer(200, {"object": "list", "data": data}, self.request)
        for m in models:
            if m.id == name:
                return _json_answer(200, m.model_dump(), self.request)
        raise Refused(404, f"fallgate: model {name!r} is not in this gate's chain", "not_found")

    def outbound(self, a: Attempt, policy: Policy) -> Any:
        """The request attempt `a` sends: target's URL, model and key, and each phase's
        timeout (the engine's, `engine_phases`, at most the SDK's own)."""
        target = a.target
        key = a.credential.resolve(target.name)
        base = urlsplit(str(target.base_url))
        query = "&".join(q for q in (base.query, self.request.url.query.decode()) if q)
        url = urlunsplit(
            (base.scheme, base.netloc, base.path.rstrip("/") + self.endpoint, query, "")
        )
        openai_host = base.hostname in _OPENAI_HOSTS
        headers = [
            (k, v)
            for k, v in self.request.headers.items()
            if k not in _DROPPED and (openai_host or k not in _OPENAI_ONLY)
        ]
        headers.append(("authorization", f"Bearer {key}"))
        if self.stream:
            headers = [(k, v) for k, v in headers if k != "accept-encoding"]
            headers.append(("accept-encoding", "identity"))  # the peek reads plain SSE
        body = self.body
        if self.payload is not None and self.payload.get("model", target.model) != target.model:
            body = json.dumps({**self.payload, "model": target.model}).encode()
        return transport.http.Request(
            self.request.method,
            url,
            headers=headers,
            content=body,
            extensions={**self.request.extensions, "timeout": self._timeouts(a, policy)},
        )

    def _timeouts(self, a: Attempt, policy: Policy) -> dict[str, float]:
        """Each phase's timeout: the engine's for attempt `a` (connect at most
        ``connect_timeout``; a stream's reads as long as ``stream_idle_timeout``), at
        most the SDK's (the caller's ``timeout=``). The socket-level bounds of the
        attempt (`providers.openai.http.bounds`) apply under these."""
        idle = policy.stream_idle_timeout if self.stream else None
        engine = engine_phases(a.timeout, policy.connect_timeout, idle).phases
        given = self.request.extensions.get("timeout")
        sdk: Mapping[str, float | None] = given if isinstance(given, Mapping) else {}
        out = {}
        for phase, limit in zip(_PHASES, engine, strict=True):
            v = sdk.get(phase)
            mine = math.inf if limit is None else limit
            out[phase] = mine if v is None else min(float(v), mine)
        return out

    def check(self, content: bytes) -> None:
        """Raise what the turn classifies when a 2xx reply is not a usable reply."""
        shape = _CHECKS.get(self.endpoint) if self.request.method == "POST" else None
        if shape is None:
            return
        data = json.loads(content)  # a JSONDecodeError is a malformed reply
        if not isinstance(data, dict):
            check = shape[1]
            check(data, self.payload)
            return
        model, check = shape
        try:  # a well-formed reply: pydantic-core's validation, some 50 us less per turn
            reply = model.model_validate(data)  # than `construct`, which is pure Python
        except ValueError:  # any shape the SDK takes, as the SDK reads it (not validated)
            reply = model.construct(**data)
        check(reply, self.payload)  # against the caller's request (embeddings: one per input)


_PHASES = ("connect", "read", "write", "pool")


def _json_answer(status: int, body: Any, request: Any, headers: Any = ()) -> Any:
    return transport.http.Response(
        status,
        headers=[("content-type", "application/json"), ("x-should-retry", "false"), *headers],
        content=json.dumps(body).encode(),
        request=request,
    )


def reply_answer(reply: Any, content: bytes, request: Any, target: str) -> Any:
    """A read reply as the SDK gets it: the target's status, headers and (decoded) body."""
    headers = [(k, v) for k, v in reply.headers.items() if k.lower() not in _STALE]
    headers.append(("x-fallgate-target", target))
    if reply.status_code >= 400:
        headers = [(k, v) for k, v in headers if k.lower() != "x-should-retry"]
        headers += [("x-should-retry", "false"), ("x-fallgate-turn", "failed")]
    return transport.http.Response(
        reply.status_code,
        headers=headers,
        content=content,
        request=request,
        extensions={k: v for k, v in reply.extensions.items() if k == "http_version"},
    )


def status_error(reply: Any, out: Any) -> openai.APIStatusError:
    """An error status as the SDK's own exception, for the wrapper's classifier: it
    reads status, headers and the raw body (`providers.openai.exceptions`)."""
    reply.request = out
    try:
        body: Any = json.loads(reply.content)
    except ValueError:
        body = reply.text
    if isinstance(body, dict) and "error" in body:
        body = body["error"]
    return openai.APIStatusError(f"Error code: {reply.status_code}", response=reply, body=body)


def failed_answer(e: TurnFailed, last: BaseException | None, target: str, request: Any) -> Any:
    """What the SDK is handed when the turn failed: the last HTTP error a target sent
    (so the caller's code sees the provider's status and body, e.g. a 400 about its
    own request), else a 502 (504 when time ran out) whose message is the turn's."""
    if isinstance(last, openai.APIStatusError):
        reply = last.response
        return reply_answer(reply, reply.content, request, target)
    timed_out = last is not None and "timeout" in type(last).__name__.lower()
    if isinstance(last, TimeoutError | openai.APITimeoutError):
        timed_out = True
    body = {"error": {"message": str(e), "type": "fallgate_turn_failed", "code": e.state}}
    return _json_answer(504 if timed_out else 502, body, request, [("x-fallgate-turn", "failed")])
