"""Trace records: one per transition, safe to log and ship (no secrets)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import attrs


@attrs.frozen(slots=True)
class TraceEvent:
    """One transition of a turn.

    `time` is seconds since the turn started (injected clock); `credential`
    is the credential's id (``env:NAME`` / ``key#N``), never the key.
    """

    seq: int
    time: float
    source: str
    event: str
    dest: str
    action: str
    target: str | None = None
    model: str | None = None
    credential: str | None = None
    wait: float | None = None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=False)


def to_jsonl(trace: Iterable[TraceEvent]) -> str:
    """The trace as JSON lines (one object per transition)."""
    return "".join(e.to_json() + "\n" for e in trace)


def from_jsonl(text: str) -> list[TraceEvent]:
    """Read back a JSON-lines trace (for diagrams with a highlighted path)."""
    out = []
    fields = {f.name for f in attrs.fields(TraceEvent)}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"trace line {n}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"trace line {n}: expected an object")
        missing = {"seq", "time", "source", "event", "dest", "action"} - obj.keys()
        if missing:
            raise ValueError(f"trace line {n}: missing {', '.join(sorted(missing))}")
        out.append(TraceEvent(**{k: v for k, v in obj.items() if k in fields}))
    return out
