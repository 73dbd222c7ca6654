"""Script files: `load_script` reads a JSON or TOML fault script, and a bad one
raises `ScriptError` naming the file and the line of the bad field."""

from __future__ import annotations

import itertools
import json
import os
import re
import tomllib

from .script import Script, ScriptError, parse_script

__all__ = ["MAX_SCRIPT_BYTES", "load_script"]

#: The largest script file read (bytes): a regular file, never a pipe or a device.
MAX_SCRIPT_BYTES = 16 << 20


def load_script(path: str | os.PathLike[str]) -> Script:
    """Read and validate a JSON or TOML script file (by suffix, else by content)."""
    # Imported here: a valid script (and the pytest plugin) need not load `fsm`.
    from ....fsm.policy.textfile import UnreadableFile, read_text

    name = os.fspath(path)
    try:
        text = read_text(name, MAX_SCRIPT_BYTES)
    except UnreadableFile as e:
        raise ScriptError(f"cannot read the script file: {e.reason}", file=name) from None
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
    except RecursionError:
        raise ScriptError(_TOO_DEEP, file=name) from None
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
        line = int(m.group(1)) if m else None
        col = f" (column {m.group(2)})" if m else ""
        raise ScriptError(f"invalid TOML: {msg}{col}", file=name, line=line) from None
    except ValueError as e:  # a number of more than 4,300 digits
        what = "JSON" if is_json else "TOML"
        raise ScriptError(f"invalid {what}: {str(e).split(';')[0]}", file=name) from None
    try:
        return parse_script(raw)
    except RecursionError:
        raise ScriptError(_TOO_DEEP, file=name) from None
    except ScriptError as e:
        if is_json:
            line = _json_line(text, e.path)
        else:
            # Imported here: a valid script (and the pytest plugin) need not load `fsm`.
            from ....fsm.policy.tomlpos import toml_line

            line = toml_line(text, e.path)
        raise e.located(name, line) from None


_TOO_DEEP = "nested too deeply (tables or arrays inside one another)"


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
