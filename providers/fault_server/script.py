"""The fault script: its schema, parsing and validation (`Step`, `Script`, `ScriptError`).

A script is a mapping, or a JSON / TOML file read by `load_script`::

    {"default": {"kind": "answer", "text": "ok"},
     "models": {"glm-5.1": [{"kind": "timeout"},
                            {"kind": "status", "status": 429,
                             "headers": {"retry-after": "20"}}],
                "glm-4.7": [{"kind": "answer", "text": "hello", "delay": 0.1}]}}

Each request for a model takes that model's next step; when the steps are used
up the ``default`` step repeats. Step kinds and their fields (every kind also
takes ``delay``, seconds before anything is sent):

- ``answer``: ``text`` ("ok"), ``finish_reason`` ("stop"); for stream requests
  ``chunks`` (int N: the text cut in N pieces, or a list of strings; default:
  one piece per word) and ``interval`` (seconds between chunks).
- ``status``: ``status`` (required), ``headers``, ``body`` (JSON object/array,
  or a string sent as-is with ``content_type``; default: an OpenAI error body).
- ``timeout`` / ``hang``: hold the request unanswered for ``seconds`` (30),
  then close the connection.
- ``drop``: close the connection without sending a byte.
- ``drop_mid_body``: 200 headers with a Content-Length larger than what is
  sent, half of a JSON body, then close.
- ``invalid_json``: 200, application/json, a body that is not JSON (``body``).
- ``empty``: 200, application/json, an empty body.
- ``stream`` (stream requests only): ``chunks`` (int N -> "chunk-1 ",
  "chunk-2 ", ...; or a list of strings), then ``then``: "done" (a finish
  chunk and ``[DONE]``), "error" (an SSE ``data: {"error": ...}`` event with
  ``error`` as its object, then close), "cut" (close mid-stream: no
  ``[DONE]``, no terminating chunk) or "hang" (stall ``seconds``, then cut);
  ``interval`` between chunks.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

__all__ = [
    "DEFAULT_STEP",
    "KINDS",
    "STREAM_ENDINGS",
    "Script",
    "ScriptError",
    "Step",
    "load_script",
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
)
STREAM_ENDINGS = ("done", "error", "cut", "hang")
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


def _seconds(raw: Any, path: tuple[str | int, ...]) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ScriptError(f"expected a number of seconds, got {raw!r}", path)
    if not math.isfinite(raw) or raw < 0 or raw > _MAX_SECONDS:
        raise ScriptError(f"expected seconds between 0 and {_MAX_SECONDS:g}, got {raw!r}", path)
    return float(raw)


def _string(raw: Any, path: tuple[str | int, ...]) -> str:
    if not isinstance(raw, str):
        raise ScriptError(f"expected a string, got {raw!r}", path)
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
            raise ScriptError(f"expected at least {minimum} chunk(s), got an empty list", path)
        return tuple(raw)
    raise ScriptError(f"expected an integer or a list of strings, got {raw!r}", path)


_FIELDS: dict[str, frozenset[str]] = {
    "answer": frozenset({"text", "chunks", "interval", "finish_reason"}),
    "status": frozenset({"status", "headers", "body", "content_type"}),
    "timeout": frozenset({"seconds"}),
    "hang": frozenset({"seconds"}),
    "drop": frozenset(),
    "drop_mid_body": frozenset(),
    "invalid_json": frozenset({"body"}),
    "empty": frozenset(),
    "stream": frozenset({"chunks", "then", "error", "interval", "seconds"}),
}


@attrs.frozen
class Step:
    """One scripted reply. Build with `Step.parse` (validates) or directly."""

    kind: str
    delay: float = 0.0
    text: str = "ok"
    finish_reason: str = "stop"
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: Any = None
    content_type: str | None = None
    seconds: float = 30.0
    chunks: int | tuple[str, ...] | None = None
    then: str = "done"
    error: Mapping[str, Any] | None = None
    interval: float = 0.0

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
            at = (*where, key)
            if key in ("delay", "seconds", "interval"):
                out[key] = _seconds(value, at)
            elif key in ("text", "finish_reason", "content_type"):
                out[key] = _string(value, at)
            elif key == "status":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ScriptError(f"expected an integer HTTP status, got {value!r}", at)
                if not 200 <= value <= 599:
                    raise ScriptError(
                        f"expected an HTTP status between 200 and 599, got {value}", at
                    )
                out[key] = value
            elif key == "headers":
                out[key] = _headers(value, at)
            elif key == "body":
                if kind == "invalid_json":
                    out[key] = _string(value, at)
                elif not isinstance(value, str | Mapping | list):
                    raise ScriptError(f"expected a JSON object, array or string, got {value!r}", at)
                else:
                    out[key] = value
            elif key == "chunks":
                out[key] = _chunks(value, at, 1 if kind == "answer" else 0)
            elif key == "then":
                if value not in STREAM_ENDINGS:
                    raise ScriptError(
                        f"expected one of: {', '.join(STREAM_ENDINGS)}, got {value!r}", at
                    )
                out[key] = value
            elif key == "error":
                if not isinstance(value, Mapping):
                    raise ScriptError(
                        f"expected an error object like {{message = ...}}, got {value!r}", at
                    )
                out[key] = dict(value)
        if kind == "status" and "status" not in raw:
            raise ScriptError("missing field (an HTTP status, e.g. 429)", (*where, "status"))
        if kind == "answer" and isinstance(out.get("chunks"), tuple):
            joined = "".join(out["chunks"])
            if "text" in out and out["text"] != joined:
                raise ScriptError("the chunks must join to the text", (*where, "chunks"))
            out["text"] = joined
        if kind == "stream" and "error" in out and out.get("then") != "error":
            raise ScriptError('only used with then = "error"', (*where, "error"))
        return cls(**out)

    def describe(self) -> str:
        """A short human label: ``status 429``, ``stream 3 then cut``."""
        if self.kind == "status":
            return f"status {self.status}"
        if self.kind == "stream":
            n = self.chunks if isinstance(self.chunks, int) else len(self.chunks or ())
            return f"stream {n} then {self.then}"
        if self.kind in ("timeout", "hang"):
            return f"{self.kind} {self.seconds:g}s"
        if self.kind == "answer":
            return f"answer {self.text[:20]!r}" + (f" after {self.delay:g}s" if self.delay else "")
        return self.kind


def _headers(raw: Any, path: tuple[str | int, ...]) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        raise ScriptError(f"expected a table of header names to values, got {raw!r}", path)
    out = []
    for name, value in raw.items():
        if not isinstance(name, str) or not re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name):
            raise ScriptError(f"bad header name {name!r}", path)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ScriptError(f"header {name!r}: expected a string or number, got {value!r}", path)
        text = str(value)
        if "\r" in text or "\n" in text:
            raise ScriptError(f"header {name!r}: line breaks are not allowed", path)
        out.append((name, text))
    return tuple(out)


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


def load_script(path: str | os.PathLike[str]) -> Script:
    """Read and validate a JSON or TOML script file (by suffix, else by content)."""
    name = os.fspath(path)
    try:
        text = Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise ScriptError(f"cannot read the script file: {reason}", file=name) from None
    is_json = name.endswith(".json") or (
        not name.endswith(".toml") and text.lstrip().startswith("{")
    )
    try:
        if is_json:
            raw = json.loads(text)
        else:
            raw = tomllib.loads(text)
    except json.JSONDecodeError as e:
        raise ScriptError(
            f"invalid JSON: {e.msg} (column {e.colno})", file=name, line=e.lineno
        ) from None
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
        line = int(m.group(1)) if m else None
        col = f" (column {m.group(2)})" if m else ""
        raise ScriptError(f"invalid TOML: {msg}{col}", file=name, line=line) from None
    try:
        return parse_script(raw)
    except ScriptError as e:
        if is_json:
            line = _json_line(text, e.path)
        else:
            # Imported here: a valid script (and the pytest plugin) need not load `fsm`.
            from fsm.tomlpos import toml_line

            line = toml_line(text, e.path)
        raise e.located(name, line) from None


def _json_line(text: str, path: tuple[str | int, ...]) -> int | None:
    """Line of the deepest part of `path` found in the JSON text."""
    offsets = _json_offsets(text)
    for n in range(len(path), -1, -1):
        if path[:n] in offsets:
            return text.count("\n", 0, offsets[path[:n]]) + 1
    return None


def _json_offsets(text: str) -> dict[tuple[str | int, ...], int]:
    """Offset of every value in a (valid) JSON document, by its key path."""
    out: dict[tuple[str | int, ...], int] = {}
    decoder = json.JSONDecoder()

    def skip(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    def value(i: int, path: tuple[str | int, ...]) -> int:
        i = skip(i)
        out[path] = i
        if text[i] == "{":
            i = skip(i + 1)
            if text[i] == "}":
                return i + 1
            while True:
                key, i = json.decoder.scanstring(text, skip(i) + 1)  # type: ignore[attr-defined]
                i = value(skip(i) + 1, (*path, key))
                i = skip(i)
                if text[i] != ",":
                    return i + 1
                i += 1
        if text[i] == "[":
            i = skip(i + 1)
            if text[i] == "]":
                return i + 1
            for n in itertools.count():
                i = skip(value(i, (*path, n)))
                if text[i] != ",":
                    return i + 1
                i += 1
        _, end = decoder.raw_decode(text, i)
        return int(end)

    try:
        value(0, ())
    except (ValueError, IndexError, RecursionError):
        pass
    return out
