"""What the fault server remembers of each request: `RequestRecord` and its
`RequestHeaders`, which never show a secret (an API key, a cookie) in a repr,
a str, or a copy; the real value is only given by `RequestRecord.header`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs

__all__ = ["SECRET_HEADERS", "RequestHeaders", "RequestRecord"]

#: Request headers whose values are credentials (compared lower-case).
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "api-key", "x-api-key", "cookie"}
)
REDACTED = "<redacted>"


def _redact(name: str, value: str) -> str:
    """``Bearer sk-...`` -> ``Bearer <redacted>``; other secrets -> ``<redacted>``."""
    lower = name.lower()
    if lower not in SECRET_HEADERS:
        return value
    scheme, blank, _ = value.strip().partition(" ")
    if blank and lower.endswith("authorization"):
        return f"{scheme} {REDACTED}"
    return REDACTED


class RequestHeaders(Mapping[str, str]):
    """A request's headers: read-only, case-insensitive (``headers["x-trace"]``
    finds ``X-Trace``), a repeated header reads as its values joined with ", "
    (`get_all` lists them). Secret values (`SECRET_HEADERS`) read as
    ``Bearer <redacted>`` / ``<redacted>`` everywhere, including ``dict(headers)``;
    the real value only comes from `RequestRecord.header`."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items = tuple((str(n), str(v)) for n, v in items)

    def get_all(self, name: str) -> list[str]:
        """Every value sent for `name`, in order (secrets redacted)."""
        return [_redact(n, v) for n, v in self._reveal_all(name)]

    def _reveal_all(self, name: str) -> list[tuple[str, str]]:
        lower = name.lower()
        return [(n, v) for n, v in self._items if n.lower() == lower]

    def __getitem__(self, name: str) -> str:
        values = self.get_all(name)
        if not values:
            raise KeyError(name)
        return ", ".join(values)

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        for n, _ in self._items:
            if n.lower() not in seen:
                seen.add(n.lower())
                yield n

    def __len__(self) -> int:
        return len({n.lower() for n, _ in self._items})

    def __repr__(self) -> str:
        return f"RequestHeaders({dict(self)!r})"

    __str__ = __repr__


@attrs.frozen
class RequestRecord:
    """One request the server received. `api_key` (the bearer token) and the
    real values of secret headers are kept for credential tests only: never
    printed, logged, or shown in a repr; read them with `api_key` / `header`."""

    model: str
    stream: bool
    api_key: str | None = attrs.field(repr=False)
    time: float  # time.monotonic() when the request was read
    path: str = "/v1/chat/completions"
    kind: str = "answer"  # the kind of step that answered it
    step: int | None = None  # index in the model's steps; None for the default step
    body: Mapping[str, Any] = attrs.field(factory=dict, repr=False, eq=False)
    headers: RequestHeaders = attrs.field(factory=RequestHeaders, repr=False, eq=False)

    def header(self, name: str, default: str | None = None) -> str | None:
        """The real value of header `name` (case-insensitive; repeated values
        joined with ", "), secrets included: for assertions, never for printing."""
        values = [v for _, v in self.headers._reveal_all(name)]
        return ", ".join(values) if values else default
