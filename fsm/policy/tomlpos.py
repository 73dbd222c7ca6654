"""Where a key is in TOML text: the 1-based line of a key path, for error messages.

    toml_line(text, ("fallback_providers", 1, "context_length"))   # -> 15
    toml_line(text, split_path("fallback_providers[1].context_length"))

A path is a sequence of table keys (str) and array indexes (int). Found are
tables (``[a.b]``), arrays of tables (``[[a]]``, each one an index), keys
(bare, quoted and dotted: ``a."b c".d = 1``), and, inside values, the keys of
inline tables (``x = { y = { z = 1 } }``) and the elements of arrays, also
spread over several lines. When the whole path is not found (a missing field,
say), the line of its deepest found prefix is returned instead.

Best effort on text that `tomllib` accepts; never raises on other text.
"""

from __future__ import annotations

import bisect
import re
import tomllib
from collections.abc import Sequence

from ..redact import MASK, looks_like_key

__all__ = ["split_path", "toml_line"]

KeyPath = tuple[str | int, ...]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_BLANK = " \t"
_SCALAR_END = ",]}\r\n#"


def toml_line(text: str, path: Sequence[str | int]) -> int | None:
    """The 1-based line of `path` in `text`, else of its deepest found prefix.

    None when the path is empty or not even its first key is in the text.
    Where a key is defined twice (invalid TOML), the first definition wins.
    """
    if isinstance(path, str):
        raise TypeError("toml_line takes a sequence of keys and indexes; see split_path")
    key = tuple(path)
    lines = _Scanner(text).lines()
    masked = MASK in key
    for n in range(len(key), 0, -1):
        line = lines.get(key[:n]) if not masked else _masked_line(lines, key[:n])
        if line is not None:
            return line
    return None


def _masked_line(lines: dict[KeyPath, int], key: KeyPath) -> int | None:
    """The line of `key` where some of its names were masked as `MASK` (a key typed as a
    field's name is never shown): each masked name stands for a key-shaped one of the
    text; the first such path wins."""
    if MASK not in key:
        return lines.get(key)
    found = [
        line
        for k, line in lines.items()
        if len(k) == len(key)
        and all(
            a == b or (a == MASK and isinstance(b, str) and (looks_like_key(b) or MASK in b))
            for a, b in zip(key, k, strict=True)
        )
    ]
    return min(found) if found else None


_PART = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


def split_path(dotted: str) -> KeyPath:
    """``"fallback_providers[1].context_length"`` -> ``("fallback_providers", 1,
    "context_length")``. Keys that themselves hold dots or brackets cannot be
    written this way: build the sequence directly."""
    return tuple(int(m[1]) if m[1] is not None else m[2] for m in _PART.finditer(dotted))


class _Stop(Exception):
    """The text ended or stopped being TOML: keep what was found so far."""


class _Scanner:
    """One pass over the text, recording the line where each path is first seen."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.found: dict[KeyPath, int] = {}
        self.arrays: dict[KeyPath, int] = {}  # array-of-tables path -> index of its last table
        self._newlines = [m.start() for m in re.finditer("\n", text)]

    def lines(self) -> dict[KeyPath, int]:
        try:
            self._document()
        except (_Stop, IndexError, ValueError, RecursionError, tomllib.TOMLDecodeError):
            pass  # deeper than the scanner goes: keep what was found
        return self.found

    # -- helpers

    def _line(self, at: int) -> int:
        return bisect.bisect_left(self._newlines, at) + 1

    def _record(self, path: KeyPath, at: int) -> None:
        for n in range(1, len(path) + 1):
            self.found.setdefault(path[:n], self._line(at))

    def _peek(self, n: int = 1) -> str:
        return self.text[self.i : self.i + n]

    def _blank(self) -> None:
        while self._peek() and self._peek() in _BLANK:
            self.i += 1

    def _comment(self) -> None:
        if self._peek() == "#":
            end = self.text.find("\n", self.i)
            self.i = len(self.text) if end < 0 else end

    def _space(self) -> None:
        """Blanks, newlines and comments (inside arrays, between statements)."""
        while True:
            self._blank()
            self._comment()
            if self._peek() in ("\n", "\r"):
                self.i += 1
            else:
                return

    def _expect(self, token: str) -> None:
        if not self.text.startswith(token, self.i):
            raise _Stop
        self.i += len(token)

    # -- grammar

    def _document(self) -> None:
        table: KeyPath = ()
        while True:
            self._space()
            if self.i >= len(self.text):
                return
            if self._peek() == "[":
                table = self._header()
            else:
                self._keyval(table)
            self._blank()
            self._comment()
            if self._peek() not in ("\n", "\r", ""):
                raise _Stop

    def _header(self) -> KeyPath:
        at = self.i
        many = self._peek(2) == "[["
        self.i += 2 if many else 1
        self._blank()
        keys = self._key()
        self._blank()
        self._expect("]]" if many else "]")
        path: KeyPath = ()
        for n, k in enumerate(keys):
            path = (*path, k)
            last = n == len(keys) - 1
            if many and last:
                index = self.arrays.get(path, -1) + 1
                self.arrays[path] = index
                path = (*path, index)
            elif path in self.arrays:  # [a.b] after [[a]]: a table in a's last element
                path = (*path, self.arrays[path])
        self._record(path, at)
        return path

    def _keyval(self, table: KeyPath) -> None:
        at = self.i
        path = (*table, *self._key())
        self._record(path, at)
        self._blank()
        self._expect("=")
        self._blank()
        self._value(path)

    def _key(self) -> list[str]:
        keys = [self._simple_key()]
        while True:
            self._blank()
            if self._peek() != ".":
                return keys
            self.i += 1
            self._blank()
            keys.append(self._simple_key())

    def _simple_key(self) -> str:
        c = self._peek()
        if c in ('"', "'"):
            start = self.i
            self._string()
            raw = self.text[start : self.i]
            if c == "'" or "\\" not in raw:
                return raw[1:-1]
            value = tomllib.loads(f"k = {raw}")["k"]
            return str(value)
        m = _BARE_KEY.match(self.text, self.i)
        if m is None:
            raise _Stop
        self.i = m.end()
        return m.group()

    def _value(self, path: KeyPath) -> None:
        c = self._peek()
        if c in ('"', "'"):
            self._string()
        elif c == "[":
            self._array(path)
        elif c == "{":
            self._inline_table(path)
        else:
            start = self.i
            while self._peek() and self._peek() not in _SCALAR_END:
                self.i += 1
            if self.i == start:
                raise _Stop

    def _array(self, path: KeyPath) -> None:
        self.i += 1
        index = 0
        while True:
            self._space()
            if self._peek() == "]":
                self.i += 1
                return
            element = (*path, index)
            self._record(element, self.i)
            self._value(element)
            self._space()
            if self._peek() == ",":
                self.i += 1
                index += 1
            elif self._peek() != "]":
                raise _Stop

    def _inline_table(self, path: KeyPath) -> None:
        self.i += 1
        while True:
            self._space()
            if self._peek() == "}":
                self.i += 1
                return
            self._keyval(path)
            self._space()
            if self._peek() == ",":
                self.i += 1
            elif self._peek() != "}":
                raise _Stop

    def _string(self) -> None:
        """Skip one string of any of the four kinds, escapes included."""
        quote = self._peek()
        triple = self._peek(3) == quote * 3
        close = quote * 3 if triple else quote
        self.i += len(close)
        while True:
            if self.i >= len(self.text):
                raise _Stop
            if quote == '"' and self._peek() == "\\":
                self.i += 2
            elif self.text.startswith(close, self.i):
                self.i += len(close)
                if triple:  # up to two quotes of the content may precede the closing three
                    for _ in range(2):
                        if self._peek() == quote:
                            self.i += 1
                return
            elif not triple and self._peek() == "\n":
                raise _Stop
            else:
                self.i += 1
