"""The fault script: its schema, parsing and validation (`Step`, `Script`, `ScriptError`).

A script is a mapping, or a JSON / TOML file read by `.scriptfile.load_script`::

    {"default": {"kind": "answer", "text": "ok"},
     "models": {"glm-5.1": [{"kind": "timeout"},
                            {"kind": "status", "status": 429,
                             "headers": {"retry-after": "20"}}],
                "glm-4.7": [{"kind": "answer", "text": "hello", "delay": 0.1}]}}

Each request for a model takes that model's next step; when the steps are used
up the ``default`` step repeats. `KINDS` lists the step kinds; each one's fields
(`_FIELDS`) and what the client sees are in the fault server's documentation
(docs/fault-server.md). Every kind also takes ``delay``, seconds before anything is
sent. Every kind answers ``/v1/chat/completions`` and ``/v1/responses``; on
``/v1/embeddings`` an ``answer`` is a list of vectors, and ``stream`` /
``tool_calls`` steps are refused with a 400.

Two kinds read the request: ``continue`` answers a continuation (a last assistant
message, the delivered text) with the rest of its ``text`` (the whole of it when there
is no such message; a 400 when the message is not the start of ``text``: text lost or
repeated at a seam), its first ``echo`` characters repeating the delivered end;
``refuse_prefix`` answers a request that ends with an assistant message with a 400
(``status``, ``body``), as a provider that takes no assistant prefix does, and any
other with its ``text``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs

__all__ = [
    "DEFAULT_STEP",
    "ERROR_SHAPES",
    "KINDS",
    "STREAM_ENDINGS",
    "TRICKLES",
    "Script",
    "ScriptError",
    "Step",
    "ToolCall",
    "parse_script",
]

KINDS = (
    "answer",
    "status",
    "timeout",
    "hang",
    "drop",
    "drop_mid_body",
    "invalid_json",
    "empty",
    "stream",
    "tool_calls",
    "trickle_headers",
    "trickle_body",
    "keepalive",
    "endless",
    "sse",
    "continue",
    "refuse_prefix",
)
#: The slow-server kinds: they send something every `interval` (default below).
TRICKLES = ("trickle_headers", "trickle_body", "keepalive", "endless")
TRICKLE_INTERVAL = 0.4
_MAX_PIECE = 16 * 1024 * 1024
#: Pieces of one trickle (``seconds / interval``): its padding is built in memory.
_MAX_TRICKLE_PIECES = 1_000_000
STREAM_ENDINGS = ("done", "error", "cut", "hang", "keepalive")
ERROR_SHAPES = ("openai", "anthropic")
_MAX_SECONDS = 3600.0


# --------------------------------------------------------------------------- errors


class ScriptError(ValueError):
    """A malformed fault script. The message names the file and line (when
    known), the model, the step index and the field: ``models["m"][1].status``."""

    def __init__(
        self,
        problem: str,
        path: Sequence[str | int] = (),
        *,
        file: str | None = None,
        line: int | None = None,
    ) -> None:
        self.problem = problem
        self.path = tuple(path)
        self.file = file
        self.line = line
        super().__init__(self._render())

    @property
    def model(self) -> str | None:
        """The model whose steps are bad ("default" for the default step)."""
        if self.path[:1] == ("default",):
            return "default"
        if len(self.path) >= 2 and self.path[0] == "models":
            return str(self.path[1])
        return None

    @property
    def step(self) -> int | None:
        if len(self.path) >= 3 and self.path[0] == "models" and isinstance(self.path[2], int):
            return self.path[2]
        return None

    @property
    def field(self) -> str | None:
        last = self.path[-1] if self.path else None
        return last if isinstance(last, str) and len(self.path) >= 2 else None

    def located(self, file: str, line: int | None) -> ScriptError:
        return ScriptError(self.problem, self.path, file=file, line=line)

    def _render(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        at = _render_path(self.path)
        return f"fault script {where}{at + ': ' if at else ''}{self.problem}"


def _render_path(path: Sequence[str | int]) -> str:
    out = ""
    for i, p in enumerate(path):
        if isinstance(p, int):
            out += f"[{p}]"
        elif i == 1 and path[0] == "models":
            out += f"[{json.dumps(p)}]"
        else:
            out += f".{p}" if out else p
    return out


# --------------------------------------------------------------------------- script


def _short(raw: Any) -> str:
    text = repr(raw)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _seconds(raw: Any, path: tuple[str | int, ...]) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ScriptError(f"expected a number of seconds, got {_short(raw)}", path)
    # an int is compared as it is: float(10**400) would overflow
    if (isinstance(raw, float) and not math.isfinite(raw)) or not 0 <= raw <= _MAX_SECONDS:
        raise ScriptError(
            f"expected seconds between 0 and {_MAX_SECONDS:g}, got {_short(raw)}", path
        )
    return float(raw)


def _string(raw: Any, path: tuple[str | int, ...]) -> str:
    if not isinstance(raw, str):
        raise ScriptError(f"expected a string, got {_short(raw)}", path)
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate ("\ud800" in JSON): unsendable
        raise ScriptError(
            f"not sendable text: {raw[e.start]!r} at position {e.start} is a lone surrogate",
            path,
        ) from None
    return raw


def _chunks(raw: Any, path: tuple[str | int, ...], minimum: int) -> int | tuple[str, ...]:
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < minimum or raw > 100_000:
            raise ScriptError(
                f"expected a chunk count between {minimum} and 100000, got {raw}", path
            )
        return raw
    if isinstance(raw, list) and all(isinstance(c, str) for c in raw):
        if len(raw) < minimum:
            chunks = f"{minimum} chunk{'' if minimum == 1 else 's'}"
            raise ScriptError(f"expected at least {chunks}, got an empty list", path)
        return tuple(raw)
    raise ScriptError(f"expected an integer or a list of strings, got {raw!r}", path)


_FIELDS: dict[str, frozenset[str]] = {
    "answer": frozenset({"text", "chunks", "interval", "finish_reason", "headers"}),
    "status": frozenset({"status", "headers", "body", "content_type"}),
    "timeout": frozenset({"seconds"}),
    "hang": frozenset({"seconds"}),
    "drop": frozenset(),
    "drop_mid_body": frozenset(),
    "invalid_json": frozenset({"body"}),
    "empty": frozenset(),
    "stream": frozenset(
        {"chunks", "then", "error", "error_shape", "interval", "seconds", "headers"}
    ),
    "tool_calls": frozenset(
        {"tool_calls", "text", "finish_reason", "chunks", "interval", "headers"}
    ),
    "trickle_headers": frozenset({"text", "interval", "seconds"}),
    "trickle_body": frozenset({"text", "interval", "seconds"}),
    "keepalive": frozenset({"text", "interval", "seconds"}),
    "endless": frozenset({"interval", "seconds", "bytes"}),
    "sse": frozenset({"events", "done", "interval", "headers"}),
    "continue": frozenset({"text", "echo", "chunks", "interval", "finish_reason", "headers"}),
    "refuse_prefix": frozenset({"text", "status", "body", "headers"}),
}


@attrs.frozen
class ToolCall:
    """One function call of a ``tool_calls`` step; `arguments` is the JSON text sent."""

    name: str
    arguments: str = "{}"
    id: str | None = None

    @classmethod
    def parse(cls, raw: Any, path: tuple[str | int, ...]) -> ToolCall:
        if not isinstance(raw, Mapping):
            raise ScriptError(
                f"expected a call like {{name = ..., arguments = ...}}, got {raw!r}", path
            )
        for key in raw:
            if key not in ("name", "arguments", "id"):
                raise ScriptError("unknown field; allowed: arguments, id, name", (*path, str(key)))
        if "name" not in raw:
            raise ScriptError("missing field (the function name)", (*path, "name"))
        name = _string(raw["name"], (*path, "name"))
        call_id = _string(raw["id"], (*path, "id")) if "id" in raw else None
        args = raw.get("arguments", {})
        if not isinstance(args, str):
            if not isinstance(args, Mapping):
                raise ScriptError(
                    f"expected a JSON object or a string, got {args!r}", (*path, "arguments")
                )
            try:
                args = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
            except (TypeError, ValueError) as e:
                raise ScriptError(f"not JSON: {e}", (*path, "arguments")) from None
        return cls(name=name, arguments=args, id=call_id)


def _tool_calls(raw: Any, path: tuple[str | int, ...]) -> tuple[ToolCall, ...]:
    if not isinstance(raw, list) or not raw:
        raise ScriptError(f"expected a non-empty list of calls, got {raw!r}", path)
    return tuple(ToolCall.parse(c, (*path, i)) for i, c in enumerate(raw))


def _default_text(step: Step) -> str:
    return "" if step.kind == "tool_calls" else "ok"


def _default_finish(step: Step) -> str:
    return "tool_calls" if step.kind == "tool_calls" else "stop"


@attrs.frozen
class Step:
    """One scripted reply. Build with `Step.parse` (validates) or directly."""

    kind: str
    delay: float = 0.0
    text: str = attrs.field(default=attrs.Factory(_default_text, takes_self=True))
    finish_reason: str = attrs.field(default=attrs.Factory(_default_finish, takes_self=True))
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: Any = None
    content_type: str | None = None
    seconds: float = 30.0
    chunks: int | tuple[str, ...] | None = None
    then: str = "done"
    error: Mapping[str, Any] | None = None
    interval: float = 0.0
    error_shape: str = "openai"
    tool_calls: tuple[ToolCall, ...] = ()
    bytes: int = 65536
    events: tuple[Any, ...] = ()
    done: bool = True
    echo: int = 0

    @classmethod
    def parse(cls, raw: Any, path: Sequence[str | int] = ()) -> Step:
        """Validate one step mapping; `path` locates it in error messages."""
        where = tuple(path)
        if not isinstance(raw, Mapping):
            raise ScriptError(f"expected a step table like {{kind = ...}}, got {raw!r}", where)
        kind = raw.get("kind")
        if kind is None:
            raise ScriptError(f"missing field; one of: {', '.join(KINDS)}", (*where, "kind"))
        if kind not in KINDS:
            raise ScriptError(
                f"unknown kind {kind!r}; expected one of: {', '.join(KINDS)}", (*where, "kind")
            )
        allowed = _FIELDS[kind] | {"kind", "delay"}
        for key in raw:
            if key not in allowed:
                raise ScriptError(
                    f"unknown field for kind {kind!r}; allowed: {', '.join(sorted(allowed))}",
                    (*where, str(key)),
                )
        out: dict[str, Any] = {"kind": kind}
        for key, value in raw.items():
            if key != "kind":
                out[key] = _FIELD_PARSERS[key](value, (*where, key), kind)
        if kind in _REQUIRED and _REQUIRED[kind][0] not in raw:
            field, what = _REQUIRED[kind]
            raise ScriptError(f"missing field ({what})", (*where, field))
        if kind == "answer" and isinstance(out.get("chunks"), tuple):
            joined = "".join(out["chunks"])
            if "text" in out and out["text"] != joined:
                raise ScriptError("the chunks must join to the text", (*where, "chunks"))
            out["text"] = joined
        if kind == "refuse_prefix":
            out.setdefault("status", 400)
        for key in ("error", "error_shape"):
            if kind == "stream" and key in out and out.get("then") != "error":
                raise ScriptError('only used with then = "error"', (*where, key))
        if kind in TRICKLES:
            if kind != "endless" and out.get("interval", TRICKLE_INTERVAL) <= 0:
                raise ScriptError(
                    "expected a positive interval (seconds between the pieces of a trickle), "
                    f"got {out['interval']!r}",
                    (*where, "interval"),
                )
            out.setdefault("interval", 0.0 if kind == "endless" else TRICKLE_INTERVAL)
            seconds = out.get("seconds", 30.0)
            if kind != "endless" and seconds / out["interval"] > _MAX_TRICKLE_PIECES:
                # one piece per interval, each a byte of padding held in memory at once
                raise ScriptError(
                    f"a trickle of {seconds:g} s every {out['interval']:g} s is "
                    f"{seconds / out['interval']:.3g} pieces; at most {_MAX_TRICKLE_PIECES:,} "
                    "(raise interval or lower seconds)",
                    (*where, "interval"),
                )
        return cls(**out)

    def describe(self) -> str:
        """A short human label: ``status 429``, ``stream 3 then cut``."""
        if self.kind == "status":
            return f"status {self.status}"
        if self.kind == "stream":
            n = self.chunks if isinstance(self.chunks, int) else len(self.chunks or ())
            return f"stream {n} then {self.then}"
        if self.kind == "sse":
            return f"sse {len(self.events)} event{'' if len(self.events) == 1 else 's'}"
        if self.kind == "tool_calls":
            return f"tool_calls {', '.join(c.name for c in self.tool_calls)}"
        if self.kind in ("timeout", "hang"):
            return f"{self.kind} {self.seconds:g}s"
        if self.kind in TRICKLES:
            return f"{self.kind} every {self.interval:g}s for {self.seconds:g}s"
        if self.kind == "answer":
            return f"answer {self.text[:20]!r}" + (f" after {self.delay:g}s" if self.delay else "")
        return self.kind


def _sse_events(raw: Any, path: tuple[str | int, ...]) -> tuple[Any, ...]:
    """An ``sse`` step's events: JSON objects/arrays (sent as JSON) or strings (as-is)."""
    if not isinstance(raw, list) or not raw:
        raise ScriptError(f"expected a non-empty list of events, got {_short(raw)}", path)
    for i, event in enumerate(raw):
        if isinstance(event, str):
            if "\n" in event or "\r" in event:
                raise ScriptError("line breaks are not allowed in an event", (*path, i))
        elif isinstance(event, Mapping | list):
            try:
                json.dumps(event)
            except (TypeError, ValueError, RecursionError) as e:
                raise ScriptError(f"not JSON: {type(e).__name__}", (*path, i)) from None
        else:
            raise ScriptError(
                f"expected a JSON object or a string, got {_short(event)}", (*path, i)
            )
    return tuple(raw)


#: Characters an HTTP field value may not hold (RFC 9110 5.5): controls but HTAB.
_FIELD_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
#: The largest number a header value may be given as (it is sent as its digits).
_MAX_HEADER_NUMBER = 10**15


def header_value(value: Any) -> str:
    """The text of one header value, or ValueError saying why it cannot be sent:
    HTTP/1.1 sends Latin-1 bytes, and a control character (NUL, CR, LF, ...) would
    end or corrupt the header."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a string or number, got {_short(value)}")
    if not isinstance(value, str):
        if (isinstance(value, float) and not math.isfinite(value)) or not (
            -_MAX_HEADER_NUMBER <= value <= _MAX_HEADER_NUMBER
        ):
            raise ValueError(f"expected a finite number of at most 1e15, got {_short(value)}")
        return str(value)
    bad = _FIELD_CONTROL.search(value)
    if bad:
        what = "line breaks are" if bad.group() in "\r\n" else f"{bad.group()!r} is"
        raise ValueError(f"{what} not allowed (a control character, at position {bad.start()})")
    try:
        value.encode("latin-1")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{value[e.start]!r} at position {e.start} is not Latin-1: HTTP/1.1 header "
            "values are Latin-1 bytes (percent-encode other text)"
        ) from None
    return value


def _headers(raw: Any, path: tuple[str | int, ...]) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        raise ScriptError(f"expected a table of header names to values, got {_short(raw)}", path)
    out = []
    for name, value in raw.items():
        if not isinstance(name, str) or not re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name):
            raise ScriptError(f"bad header name {_short(name)}", path)
        try:  # a list: the header once per value
            out += [(name, header_value(v)) for v in (value if type(value) is list else [value])]
        except ValueError as e:
            raise ScriptError(f"header {name!r}: {e}", (*path, name)) from None
    return tuple(out)


#: One field's value parser: (value, its path, the step's kind) -> the Step's value.
_Parse = Callable[[Any, tuple[str | int, ...], str], Any]


def _whole(lo: int, hi: int, not_int: str, outside: str) -> _Parse:
    """An integer in lo..hi; the messages are templates over ``value``."""

    def parse(value: Any, at: tuple[str | int, ...], kind: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScriptError(not_int.format(value=repr(value)), at)
        if not lo <= value <= hi:
            raise ScriptError(outside.format(value=value), at)
        return value

    return parse


def _one_of(options: tuple[str, ...]) -> _Parse:
    def parse(value: Any, at: tuple[str | int, ...], kind: str) -> str:
        if value not in options:
            raise ScriptError(f"expected one of: {', '.join(options)}, got {value!r}", at)
        return str(value)

    return parse


def _content_type(value: Any, at: tuple[str | int, ...], kind: str) -> str:
    """Sent as the Content-Type header."""
    try:
        return header_value(_string(value, at))
    except ValueError as e:
        raise ScriptError(str(e), at) from None


def _body(value: Any, at: tuple[str | int, ...], kind: str) -> Any:
    if kind == "invalid_json":
        return _string(value, at)
    if not isinstance(value, str | Mapping | list):
        raise ScriptError(f"expected a JSON object, array or string, got {value!r}", at)
    return value


_PIECES = "expected a piece count between 1 and 1000, got {value}"
_TOOL_PIECES = _whole(1, 1000, _PIECES, _PIECES)


def _step_chunks(value: Any, at: tuple[str | int, ...], kind: str) -> int | tuple[str, ...]:
    """A tool-call reply's piece count, or an answer's / stream's chunks."""
    if kind == "tool_calls":
        return int(_TOOL_PIECES(value, at, kind))
    return _chunks(value, at, 1 if kind == "answer" else 0)


def _flag(value: Any, at: tuple[str | int, ...], kind: str) -> bool:
    if not isinstance(value, bool):
        raise ScriptError(f"expected true or false, got {value!r}", at)
    return value


def _error(value: Any, at: tuple[str | int, ...], kind: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ScriptError(f"expected an error object like {{message = ...}}, got {value!r}", at)
    return dict(value)


_STATUS = "expected an integer HTTP status, got {value}"
_ECHO = "expected between 0 and 100000 characters, got {value}"
_BYTES = f"expected a piece size between 1 and {_MAX_PIECE} bytes, got {{value}}"

#: The field a kind cannot do without, and what it holds.
_REQUIRED: Mapping[str, tuple[str, str]] = {
    "status": ("status", "an HTTP status, e.g. 429"),
    "sse": ("events", "a list of events: JSON objects or strings"),
    "tool_calls": ("tool_calls", "a list like [{name = ..., arguments = {...}}]"),
}

#: How each step field's value is read (which kinds take which field: `_FIELDS`).
_FIELD_PARSERS: Mapping[str, _Parse] = {
    **dict.fromkeys(("delay", "seconds", "interval"), lambda v, at, kind: _seconds(v, at)),
    **dict.fromkeys(("text", "finish_reason"), lambda v, at, kind: _string(v, at)),
    "content_type": _content_type,
    "status": _whole(200, 599, _STATUS, "expected an HTTP status between 200 and 599, got {value}"),
    "headers": lambda v, at, kind: _headers(v, at),
    "body": _body,
    "chunks": _step_chunks,
    "then": _one_of(STREAM_ENDINGS),
    "error_shape": _one_of(ERROR_SHAPES),
    "tool_calls": lambda v, at, kind: _tool_calls(v, at),
    "bytes": _whole(1, _MAX_PIECE, "expected a whole number of bytes, got {value}", _BYTES),
    "events": lambda v, at, kind: _sse_events(v, at),
    "done": _flag,
    "error": _error,
    "echo": _whole(0, 100_000, "expected a whole number of characters, got {value}", _ECHO),
}


DEFAULT_STEP = Step(kind="answer", text="ok")


def _readonly(models: Mapping[str, tuple[Step, ...]]) -> Mapping[str, tuple[Step, ...]]:
    return MappingProxyType(dict(models))


@attrs.frozen(eq=False)
class Script:
    """A validated script: per-model step lists and the step that repeats after."""

    models: Mapping[str, tuple[Step, ...]] = attrs.field(factory=dict, converter=_readonly)
    default: Step = DEFAULT_STEP

    def summary(self) -> str:
        """One line: each model's steps, then the default."""
        parts = [
            f"{m}: {', '.join(s.describe() for s in steps)}" for m, steps in self.models.items()
        ]
        models = "; ".join(parts) if parts else "no scripted models"
        return f"{models}; then {self.default.describe()}"


def parse_script(raw: Any) -> Script:
    """Validate a script given as a mapping (``None`` or ``{}``: every model answers "ok")."""
    if raw is None:
        return Script()
    if isinstance(raw, Script):
        return raw
    if not isinstance(raw, Mapping):
        raise ScriptError(f"expected a table with 'models' and/or 'default', got {raw!r}")
    for key in raw:
        if key not in ("models", "default"):
            raise ScriptError(
                "unknown top-level key; expected 'models' and/or 'default'", (str(key),)
            )
    default = Step.parse(raw["default"], ("default",)) if "default" in raw else DEFAULT_STEP
    models_raw = raw.get("models", {})
    if not isinstance(models_raw, Mapping):
        raise ScriptError(
            f"expected a table of model name -> list of steps, got {models_raw!r}", ("models",)
        )
    models: dict[str, tuple[Step, ...]] = {}
    for model, steps in models_raw.items():
        if not isinstance(steps, list):
            raise ScriptError(f"expected a list of steps, got {steps!r}", ("models", str(model)))
        models[str(model)] = tuple(
            Step.parse(s, ("models", str(model), i)) for i, s in enumerate(steps)
        )
    return Script(models=models, default=default)
