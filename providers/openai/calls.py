"""One caller request through the engine: which SDK method (`Op`), with what (`Call`).

An `Op` names one SDK method the wrappers cover (``chat.completions.create``,
``chat.completions.parse``, ``responses.create``, ``embeddings.create``, and
each one's ``with_raw_response`` twin), what a 2xx reply must be for the turn
to accept it, and how its streams commit (if it streams). `prepare` turns a
caller's keyword arguments into a `Call`: ``model`` picks where the chain
starts (`providers.openai.chain`), ``stream`` and ``timeout`` are taken out (the
engine sends its own), everything else goes to the SDK as given.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
from openai.types import CreateEmbeddingResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from ...fsm import OutcomeKind, Policy, TurnFailed
from ...fsm.core.actions import Attempt
from ...fsm.core.members import affinity_of
from .chain import Chains
from .exceptions import FailedReply, MalformedReply, content_filter_error
from .http.timeouts import Bound, combine, engine_phases, given

__all__ = [
    "CHAT_CREATE",
    "CHAT_PARSE",
    "EMBEDDINGS_CREATE",
    "RESPONSES_CREATE",
    "Call",
    "Op",
    "caller_mistake",
    "prepare",
]


def _malformed(what: str, reply: Any) -> MalformedReply:
    shown = " ".join(str(reply)[:80].split()) if isinstance(reply, str) else ""
    text = f"expected {what}, got {type(reply).__name__}"
    return MalformedReply(f"{text} {shown!r}" if shown else text)


def check_completion(reply: Any, request: Mapping[str, Any] | None = None) -> None:
    """A chat completion with choices; a content-filtered one is raised as the SDK's
    `ContentFilterFinishReasonError` (classified `content_filtered`)."""
    if not isinstance(reply, ChatCompletion):
        raise _malformed("a chat completion", reply)
    choices = getattr(reply, "choices", None)
    if not isinstance(choices, list) or not choices:
        error = getattr(reply, "error", None)
        if isinstance(error, dict) and error:
            # A 200 that reports a failure in its body (OpenRouter does, once the model
            # has started): classified by its error object, like a stream error event.
            raise FailedReply(error)
        raise MalformedReply("a chat completion without choices")
    filtered = usable = 0  # loops, not all()/any() over generators: every turn runs this
    for c in choices:
        f = getattr(c, "finish_reason", None) == "content_filter"
        filtered += f
        usable += f or _usable(c)  # a filtered choice ended (it is the provider's word)
    if filtered == len(choices):
        raise content_filter_error(reply)
    if usable < len(choices):  # one unfinished choice makes the reply unfinished
        for c in choices:
            error = getattr(c, "error", None)  # OpenRouter: finish_reason "error" + its error
            if isinstance(error, dict) and error:
                raise FailedReply(error)
        bad = next(c for c in choices if not _usable(c))
        which = "" if len(choices) == 1 else f"choice {getattr(bad, 'index', '?')}: "
        raise MalformedReply(which + _unusable(bad))


#: Finish reasons that end a real reply even when it carries nothing: the caller's own
#: token limit (a reasoning model can spend it all before any content).
_EMPTY_BUT_REAL = frozenset({"length"})
#: What a chat message may carry instead of (or with) content.
_CARRIERS = ("content", "refusal", "tool_calls", "function_call", "audio")


def _usable(choice: Any) -> bool:
    """A choice with a message that says something (or stopped at the token limit) and
    a finish_reason: without one the answer never ended (a proxy that gathered a stream
    which stopped before its end), however much text it holds."""
    finish = getattr(choice, "finish_reason", None)
    message = getattr(choice, "message", None)
    if not finish or finish == "error" or message is None:  # "": no finish either
        return False
    content = getattr(message, "content", None)
    if type(content) is str and content:
        return True  # the common reply: text (no generator over the other carriers)
    if content is not None and type(content) is not str and type(content) is not list:
        return False  # `content: 5`: the SDK does not check it (a list: content parts)
    return finish in _EMPTY_BUT_REAL or any(getattr(message, n, None) for n in _CARRIERS)


def _unusable(choice: Any) -> str:
    """What is wrong with a choice `_usable` refused (no provider text: its shape only)."""
    finish = getattr(choice, "finish_reason", None)
    if finish == "error":
        return "a chat completion whose choice has finish_reason 'error'"
    if getattr(choice, "message", None) is None:
        return "a chat completion whose choice has no message"
    if not finish:
        return "a chat completion whose choice has no finish_reason (the answer never ended)"
    content = getattr(getattr(choice, "message", None), "content", None)
    if content is not None and type(content) is not str and type(content) is not list:
        return f"a chat completion whose message content is {type(content).__name__}, not text"
    return "a chat completion whose message is empty (no content, refusal or tool call)"


def check_response(reply: Any, request: Mapping[str, Any] | None = None) -> None:
    """A Responses API ``response``; one whose status is ``failed`` is a `FailedReply`."""
    if not isinstance(reply, Response):
        raise _malformed("a response", reply)
    if reply.status == "failed":
        raise FailedReply(reply.error)
    if reply.status is not None and reply.status not in _ENDED and not (
        getattr(reply, "background", None) is True and reply.status in _RUNNING
    ):
        # in progress, queued, cancelled: the response never ended (a proxy that gathered a
        # stream which stopped before `response.completed`); a background response is
        # answered queued or in progress, by design; no status at all is a compatible
        # server that does not say (OpenAI always does): taken as it comes
        raise MalformedReply(f"a response that never completed (status {reply.status!r})")
    if reply.status in (None, "completed") and not reply.output:
        raise MalformedReply("a completed response without any output")
    if reply.status == "incomplete" and not reply.output and _filtered(reply):
        raise content_filter_error(reply)  # as a chat reply's `content_filter` finish


def _filtered(reply: Any) -> bool:
    """Did an ``incomplete`` Responses reply stop at the content filter (not the caller's
    token limit)?"""
    return bool(_field(_field(reply, "incomplete_details"), "reason") == "content_filter")


# -- streams: one rule for every reader -----------------------------------------------------
#
# A stream is judged as the reply it adds up to would be without a stream, and by one rule
# whoever reads it: the wrapper's deliveries (`deliveries.ChatDelivery` /
# `ResponsesDelivery`, on the SDK's objects), the embedded client's peek (`http.peek`,
# where its streams commit) and SSE filter (`http.sse`, which notes the answer's end),
# both on the events' JSON.

#: Where chat providers stream a reasoning model's thinking (DeepSeek, vLLM, OpenRouter):
#: no output, but a sign the stream is working.
REASONING = ("reasoning_content", "reasoning")
#: Finish reasons that end a real chat stream even with nothing said: the caller's token
#: limit (an empty reply, as without a stream), the content filter (which a stream that
#: said nothing before it is refused as: `content_filter_error`, as without a stream).
STREAM_EMPTY_BUT_REAL = frozenset({"length", "content_filter"})
#: Responses stream events that carry output: the first one commits the stream.
OUTPUT_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
    }
)
#: The events that end a whole Responses stream.
ENDINGS = frozenset({"response.completed", "response.incomplete"})


def _field(obj: Any, name: str) -> Any:
    """A field of an SDK object or of its JSON (a dict); None when it has none."""
    if isinstance(obj, dict):
        return obj.get(name)
    # Per stream event: a field an SDK model lacks (`error`, `reasoning_content`) costs
    # pydantic's `__getattr__` a raised AttributeError (~2 us); its dicts answer at once.
    extra = getattr(obj, "__pydantic_extra__", _ABSENT)
    if extra is _ABSENT:  # not a pydantic model
        return getattr(obj, name, None)
    found = obj.__dict__.get(name, _ABSENT)
    if found is not _ABSENT:
        return found
    return extra.get(name) if extra else None


_ABSENT: Any = object()


class StreamRule:
    """What one stream event says, for every reader of a stream (see above).

    Chat: `choices` is the reader's record of this attempt's choices, updated by each
    chunk: ``i`` a choice that spoke and has not finished, ``~i`` (negative) one that
    finished. A finished choice stays finished: a later chunk of it that says nothing
    (Azure's content-filter annotation after ``stop``) does not reopen it; the answer
    has ended (`ended`) once a choice finished and none is open. `judge`: raise what
    ends the reply as a fault (the filter only notes the end: it never judges).
    """

    __slots__ = ()

    @staticmethod
    def ended(choices: set[int], expect: int = 1) -> bool:
        """Has every chat choice that spoke given its finish_reason, `expect` (the
        request's ``n``) of them at least? A choice that never spoke is not finished."""
        return len(choices) >= expect and all(i < 0 for i in choices)

    @staticmethod
    def reasoning(event: Any) -> bool:
        """Does a chat chunk, or a Responses event, carry reasoning (no output)?"""
        kind = _field(event, "type")
        if isinstance(kind, str):
            return "reasoning" in kind and kind.endswith(".delta") and bool(_field(event, "delta"))
        for choice in _field(event, "choices") or ():
            delta = _field(choice, "delta") if _is_choice(choice) else None
            if delta is not None and any(_field(delta, n) for n in REASONING):
                return True
        return False

    @staticmethod
    def chat(event: Any, choices: set[int], said: bool, judge: bool = True) -> bool:
        """Note chat chunk `event` in `choices`; does it carry output (content, a refusal,
        a tool call, audio; a ``length`` / ``content_filter`` finish)? `said`: the stream
        had output before it. With `judge`, raises `FailedReply` / `MalformedReply` on
        ``finish_reason: "error"``, and the content filter's error when the stream stops
        on it having said nothing (`check_completion`'s verdicts on that reply)."""
        error = _field(event, "error")
        if judge and error:
            raise FailedReply(error)
        output = False
        for choice in _field(event, "choices") or ():
            if not _is_choice(choice):
                continue
            index = _field(choice, "index")
            index = index if isinstance(index, int) and index >= 0 else 0  # as the SDK reads it
            finish = _field(choice, "finish_reason")
            delta = _field(choice, "delta")
            carries = delta is not None and any(_field(delta, n) for n in _CARRIERS)
            if finish == "error":
                # OpenRouter ends a stream it cannot finish with finish_reason "error" (and
                # the choice's error object): never a success, interrupted once committed.
                if judge:
                    err = _field(choice, "error")
                    if isinstance(err, dict) and err:
                        raise FailedReply(err)
                    raise MalformedReply("the stream ended with finish_reason 'error'")
                choices.discard(~index)
                choices.add(index)  # an error never ends the answer
                continue
            output = output or carries
            if finish:
                if judge and finish == "content_filter" and not (said or output):
                    raise content_filter_error(None)
                choices.discard(index)
                choices.add(~index)
                output = output or finish in STREAM_EMPTY_BUT_REAL
            elif carries or (delta is not None and any(_field(delta, n) for n in REASONING)):
                choices.discard(~index)  # it speaks again: it had not ended after all
                choices.add(index)
            elif ~index not in choices:
                choices.add(index)  # an opener (``role``): the choice is under way
        return output

    @staticmethod
    def responses(event: Any, kind: str, said: bool, judge: bool = True) -> tuple[bool, bool]:
        """Responses event `event` of type `kind`: (does it carry output, does it end the
        stream?). `said`: the stream had output before it. With `judge`, raises
        `FailedReply` on an error event or ``response.failed``, and `MalformedReply` on a
        ``response.completed`` without output that nothing came before
        (`check_response`'s verdict on that response)."""
        if judge and kind == "response.failed":
            error = _field(_field(event, "response"), "error")
            raise FailedReply(error or (event if isinstance(event, dict) else None))
        if judge and kind == "error":  # the SDK raises on these; a bare one is still an error
            error = _field(event, "error")
            if not error:
                error = {"code": _field(event, "code"), "message": _field(event, "message")}
            raise FailedReply(error)
        if kind in ENDINGS:
            response = _field(event, "response")
            if judge and not said and not _field(response, "output"):
                if kind == "response.completed":
                    raise MalformedReply("the stream completed without any output")
                if _filtered(response):
                    raise content_filter_error(None)  # as the same reply without a stream
            return True, True
        # an empty delta says nothing (as an empty chat chunk): it does not commit
        return kind in OUTPUT_DELTAS and bool(_field(event, "delta")), False


def _is_choice(choice: Any) -> bool:
    return isinstance(choice, dict) or hasattr(choice, "finish_reason")


#: The one `StreamRule`.
STREAMS = StreamRule()


#: The statuses of a Responses API response that ended: in full, or at the caller's
#: limit (``max_output_tokens``: ``incomplete``, as a chat reply's ``length``).
_ENDED = frozenset({"completed", "incomplete"})
#: What ``background=True`` answers at once (the caller polls for the end).
_RUNNING = frozenset({"queued", "in_progress"})


def check_embeddings(reply: Any, request: Mapping[str, Any] | None = None) -> None:
    """A list of embeddings, not empty; one per input when the `request`'s count of
    inputs is known (`embedding_inputs`): a reply with fewer or more vectors than
    inputs cannot be the answer to the request (a truncated batch would misalign them)."""
    inputs = embedding_inputs(request)
    if not isinstance(reply, CreateEmbeddingResponse):
        raise _malformed("a list of embeddings", reply)
    if not isinstance(reply.data, list) or not reply.data:
        raise MalformedReply("an embeddings reply without data")
    if inputs is not None and len(reply.data) != inputs:
        raise MalformedReply(
            f"an embeddings reply with {len(reply.data)} vector(s) for {inputs} inputs"
        )
    if inputs is not None and inputs > 1:
        indexes = sorted(int(d.index) for d in reply.data if _is_index(d))
        if indexes != list(range(inputs)):
            raise MalformedReply(
                f"an embeddings reply whose vectors are not one per input (indexes "
                f"{indexes[:8]}{'...' if len(indexes) > 8 else ''} for {inputs} inputs)"
            )


def _is_index(d: Any) -> bool:
    return isinstance(getattr(d, "index", None), int)


def embedding_inputs(request: Mapping[str, Any] | None) -> int | None:
    """How many vectors an embeddings request's ``input`` asks for: a string or one list
    of token ids is one; a list of strings or of token-id lists, one each (None: unknown)."""
    given_input = request.get("input") if request is not None else None
    if isinstance(given_input, str):
        return 1
    if not isinstance(given_input, list | tuple) or not given_input:
        return None
    if all(isinstance(x, int) and not isinstance(x, bool) for x in given_input):
        return 1
    if all(isinstance(x, str | list | tuple) for x in given_input):
        return len(given_input)
    return None


@attrs.frozen(slots=True)
class Op:
    """One SDK method: ``client.<resource...>[.with_raw_response].<method>``."""

    name: str
    resource: tuple[str, ...]
    method: str
    #: the reply's check, given the caller's request too (what it asked for)
    check: Callable[[Any, Mapping[str, Any] | None], None] = attrs.field(repr=False)
    required: str | None = None  # the argument without which the SDK call is meaningless
    streams: str | None = None  # how its streams commit ("chat", "responses"); None: no stream
    raw: bool = False
    #: The GenAI operation name its turns are traced under (OpenTelemetry).
    operation: str = "chat"

    def with_raw_response(self) -> Op:
        parts = self.name.rsplit(".", 1)
        return attrs.evolve(self, name=f"{parts[0]}.with_raw_response.{parts[1]}", raw=True)

    def bind(self, client: Any) -> Callable[..., Any]:
        """The SDK method on `client`."""
        obj = client
        for part in self.resource:
            obj = getattr(obj, part)
        if self.raw:
            obj = obj.with_raw_response
        method: Callable[..., Any] = getattr(obj, self.method)
        return method

    def accept(self, reply: Any, request: Mapping[str, Any] | None = None) -> Any:
        """The SDK object inside `reply` (a raw response is parsed), once checked against
        the caller's `request`; raises what the turn classifies when it is not usable."""
        parsed = reply.parse() if self.raw else reply
        self.check(parsed, request)
        return parsed


CHAT_CREATE = Op(
    "chat.completions.create",
    ("chat", "completions"),
    "create",
    check_completion,
    "messages",
    "chat",
)
CHAT_PARSE = Op(
    "chat.completions.parse", ("chat", "completions"), "parse", check_completion, "messages"
)
RESPONSES_CREATE = Op(
    "responses.create", ("responses",), "create", check_response, streams="responses"
)
EMBEDDINGS_CREATE = Op(
    "embeddings.create",
    ("embeddings",),
    "create",
    check_embeddings,
    "input",
    operation="embeddings",
)


@attrs.frozen(slots=True)
class Call:
    """A caller's request, minus what the engine decides per attempt (model, timeout)."""

    op: Op
    kwargs: Mapping[str, Any]
    policy: Policy
    first: int = 0  # the chain entry this call's turn starts at (``model=``)
    stream: bool = False
    timeout: Bound | None = None
    #: The conversation the turn belongs to (``affinity=``, else ``prompt_cache_key`` or
    #: ``user``): its pinned member and key serve it while free (`fsm.core.members`).
    affinity: str | None = None

    def sdk_kwargs(
        self, a: Attempt, gate_timeout: Bound | None, *, prefix: str | None = None
    ) -> dict[str, Any]:
        """The SDK call's arguments for attempt `a`: its model, and the timeout that
        the engine's limit and the caller's bounds leave (`providers.openai.http.timeouts`)."""
        kw = dict(self.kwargs, model=a.target.model)
        p = self.policy
        idle = p.stream_idle_timeout if self.stream else None
        engine = engine_phases(a.timeout, p.connect_timeout, idle)
        kw["timeout"] = combine(engine, gate_timeout, self.timeout)
        if self.stream:
            kw["stream"] = True
        if prefix is not None:
            provider = p.provider(a.target)
            _continue(kw, prefix, provider.prefix_style if provider is not None else "trailing")
        return kw


def _continue(kw: dict[str, Any], prefix: str, style: str) -> None:
    """Ask for the rest of a broken stream: the delivered text as the assistant's message,
    marked as the provider wants it (`fsm.catalogue.registry.Provider.prefix_style`)."""
    said: dict[str, Any] = {"role": "assistant", "content": prefix}
    if style == "flag":
        said["prefix"] = True
    elif style == "vllm":
        extra = dict(kw.get("extra_body") or {})
        kw["extra_body"] = {**extra, "continue_final_message": True, "add_generation_prompt": False}
    if "messages" in kw:
        kw["messages"] = [*kw["messages"], said]
    else:
        given_input = kw.get("input")
        if isinstance(given_input, str):
            given_input = [{"role": "user", "content": given_input}]
        kw["input"] = [*(given_input or []), said]


def _listed(name: str, value: Any) -> list[Any]:
    """A list the SDK can send again on every attempt (a generator could not)."""
    if type(value) is list:  # the common case, without two ABC checks (Python calls) per turn
        return list(value)
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a list of message dicts, got {type(value).__name__}")
    return list(value)


#: The SDK resource class behind each `Op.resource` (the same module paths in 2.x and 3.x).
_SDK_CLASSES = {
    ("chat", "completions"): ("openai.resources.chat.completions.completions", "Completions"),
    ("responses",): ("openai.resources.responses.responses", "Responses"),
    ("embeddings",): ("openai.resources.embeddings", "Embeddings"),
}


@functools.cache
def sdk_parameters(resource: tuple[str, ...], method: str) -> frozenset[str] | None:
    """The keyword arguments the installed SDK's method takes (None: it takes any)."""
    where = _SDK_CLASSES.get(resource)
    if where is None:
        return None
    cls = getattr(importlib.import_module(where[0]), where[1])
    params = inspect.signature(getattr(cls, method)).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.name != "self")


def check_keywords(op: Op, kwargs: Mapping[str, Any]) -> None:
    """An argument the SDK's method does not take is the caller's mistake: Python's own
    TypeError now, not a failed turn after the first attempt."""
    known = sdk_parameters(op.resource, op.method)
    if known is None:
        return
    for name in kwargs:
        if name not in known and name != "stream":  # `prepare` says which ops stream
            raise TypeError(f"{op.name}() got an unexpected keyword argument {name!r}")


def caller_mistake(e: TurnFailed) -> BaseException | None:
    """The caller's own exception behind a failed turn, to raise in its place: a TypeError
    the SDK raised before sending (a message it cannot serialise, a wrong argument type)
    ends the turn ``bad_request`` at the first attempt, and is no fault of any target."""
    o = e.last_outcome
    if o is None or o.kind is not OutcomeKind.BAD_REQUEST or o.status is not None:
        return None
    error = o.error
    return error if isinstance(error, TypeError) else None


def prepare(op: Op, kwargs: Mapping[str, Any], chains: Chains) -> Call:
    """Check a caller's arguments before anything is sent, and pick the chain."""
    kw = dict(kwargs)
    affinity = kw.pop("affinity", None)  # fallgate's own: never sent
    if affinity is not None and not (isinstance(affinity, str) and affinity):
        raise TypeError(f"affinity must be a non-empty string (a conversation id): {affinity!r}")
    check_keywords(op, kw)
    if op.required is not None and op.required not in kw:
        raise TypeError(f"{op.method}() missing required keyword argument: {op.required!r}")
    if "messages" in kw:
        kw["messages"] = _listed("messages", kw["messages"])
    elif op.streams == "responses" and isinstance(kw.get("input"), list | tuple):
        kw["input"] = list(kw["input"])
    stream = kw.pop("stream", False)
    if stream is None or not given(stream):
        stream = False
    if not isinstance(stream, bool):
        raise TypeError(f"stream must be True or False, got {stream!r}")
    if stream and (op.streams is None or op.raw):
        hint = " (use create(stream=True))" if op.raw and op.streams else ""
        raise TypeError(f"{op.name}() does not stream through fallgate{hint}")
    timeout = Bound.parse(kw.pop("timeout", None))
    first = chains.index(kw.pop("model", None))
    return Call(op, kw, chains.policy, first, stream, timeout, affinity or affinity_of(kw))
