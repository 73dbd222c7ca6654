"""Trace records: one per transition, safe to log and ship (no secrets).

A trace file is JSON lines (format version 1, `FORMAT`; docs/cli.md, "Trace files"):

* a **turn line** when a turn starts: ``{"v": 1, "turn": ID, "start": EPOCH, "clock":
  READING, "domain": NAME, "first": N, "targets": [{"name", "provider", "model",
  "endpoint", "credentials": [ids]}]}`` — enough to match targets by their backend
  (endpoint and model), never a key;
* then one **transition line** per transition (`TraceEvent`), each naming its turn, so
  the turns of many workers may interleave in one file. A transition that leaves an
  attempt carries what the attempt produced: the outcome kind (its ``event``), ``status``,
  ``retry_after``, ``latency`` (seconds on the turn's clock) and whether a stream had
  delivered part of an answer (``partial``; never the text). ``draws`` lists the values
  the turn's random source gave while taking that transition (backoff jitter).

Older traces (transition lines only, no turn line) still read: they are one turn.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any, Final

import attrs

#: The trace format version this fallgate writes and replays.
FORMAT: Final = 1
#: The fields every transition line has (the rest are optional).
REQUIRED: Final = ("seq", "time", "source", "event", "dest", "action")


class TraceError(ValueError):
    """A trace file that cannot be read: `line` is the 1-based line at fault (0: the file)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"trace line {line}: {message}" if line else message)
        self.line = line
        self.message = message


def _draws(value: Iterable[float]) -> tuple[float, ...]:
    return tuple(value)


def _strs(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _ints(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


@attrs.frozen(slots=True)
class TraceEvent:
    """One transition of a turn.

    `time` is seconds since the turn started (injected clock); `credential`
    is the credential's id (``env:NAME`` / ``key#N``), never the key. The fields
    after `detail` are set by recording (`fsm.host.recorder`) or on the transitions that
    leave an attempt (what it produced), and are None otherwise.
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
    turn: str | None = None
    status: int | None = None
    retry_after: float | None = None
    latency: float | None = None
    partial: bool | None = None  # False is written out: nothing was delivered
    draws: tuple[float, ...] = attrs.field(default=(), converter=_draws)

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def to_json(self) -> str:
        """One line; the optional fields only when they are set."""
        d = self.as_dict()
        for k in _OPTIONAL:
            if d[k] is None or (k == "draws" and not d[k]):
                del d[k]
        if "draws" in d:
            d["draws"] = list(d["draws"])
        return json.dumps(d, sort_keys=False)

    @property
    def request(self) -> bool:
        """Did this transition end a request (an attempt that went out)?"""
        return self.latency is not None

    def same_step(self, other: TraceEvent) -> bool:
        """The same move (state, event, action, target, key, wait), whatever its time."""
        return (
            self.source == other.source
            and self.event == other.event
            and self.dest == other.dest
            and self.action == other.action
            and self.target == other.target
            and self.model == other.model
            and self.credential == other.credential
            and self.wait == other.wait
        )


_OPTIONAL: Final = ("turn", "status", "retry_after", "latency", "partial", "draws")
_FIELDS: Final = frozenset(f.name for f in attrs.fields(TraceEvent))
_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "seq": (int,),
    "time": (int, float),
    "source": (str,),
    "event": (str,),
    "dest": (str,),
    "action": (str,),
    "target": (str, type(None)),
    "model": (str, type(None)),
    "credential": (str, type(None)),
    "wait": (int, float, type(None)),
    "detail": (str,),
    "turn": (str, type(None)),
    "status": (int, type(None)),
    "retry_after": (int, float, type(None)),
    "latency": (int, float, type(None)),
    "partial": (bool, type(None)),
    "draws": (list,),
}


@attrs.frozen(slots=True)
class TracedTarget:
    """A target of the recording policy as a turn line names it (no key)."""

    name: str
    provider: str
    model: str
    endpoint: str
    credentials: tuple[str, ...] = attrs.field(converter=_strs)

    @property
    def key(self) -> tuple[str, str]:
        """The backend (endpoint, model): how a replay matches it to another policy's."""
        return (self.endpoint, self.model)


def _targets(value: Iterable[TracedTarget]) -> tuple[TracedTarget, ...]:
    return tuple(value)


@attrs.frozen(slots=True)
class TurnHeader:
    """A turn line: which turn, when it started, and the policy's targets.

    `start` is wall-clock epoch seconds as the turn's clock measured it; `clock` the
    turn clock's reading at that instant; `domain` names that clock (turns of one
    domain share one time scale, so their `clock` readings compare exactly). `store`
    names the health store the turn read and wrote (turns of one store learnt from each
    other; the name of a shared store, or one in-memory store of one process); None in a
    recording made before it was written.
    """

    turn: str
    start: float
    clock: float
    domain: str
    first: int
    targets: tuple[TracedTarget, ...] = attrs.field(converter=_targets)
    store: str | None = None

    def to_json(self) -> str:
        line: dict[str, Any] = {
            "v": FORMAT,
            "turn": self.turn,
            "start": self.start,
            "clock": self.clock,
            "domain": self.domain,
            "first": self.first,
            "targets": [attrs.asdict(t) for t in self.targets],
        }
        if self.store is not None:
            line["store"] = self.store
        return json.dumps(line)


def _events(value: Iterable[TraceEvent]) -> tuple[TraceEvent, ...]:
    return tuple(value)


@attrs.frozen(slots=True)
class TracedTurn:
    """One turn of a trace file: its turn line (None in an old trace), its transitions,
    and the file line each came from (for messages)."""

    header: TurnHeader | None
    events: tuple[TraceEvent, ...] = attrs.field(converter=_events)
    line: int = 1
    #: The file line of each event.
    lines: tuple[int, ...] = attrs.field(default=(), converter=_ints)

    @property
    def id(self) -> str:
        return self.header.turn if self.header is not None else "-"


def to_jsonl(trace: Iterable[TraceEvent]) -> str:
    """The trace as JSON lines (one object per transition)."""
    return "".join(e.to_json() + "\n" for e in trace)


def turn_jsonl(header: TurnHeader, trace: Iterable[TraceEvent]) -> str:
    """A whole turn as format-1 JSON lines: its turn line, then its transitions."""
    lines = [header.to_json()]
    lines += [attrs.evolve(e, turn=header.turn).to_json() for e in trace]
    return "\n".join(lines) + "\n"


def _check(obj: dict[str, Any], n: int, names: Iterable[str]) -> None:
    for k in names:
        v, kinds = obj[k], _TYPES[k]
        if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
            word = "a number" if float in kinds else _WORDS[kinds[0]]
            if type(None) in kinds:
                word += " or null"
            raise TraceError(n, f"{k} must be {word}, not {v!r:.40}")
    for k in ("time", "wait", "latency", "retry_after"):
        v = obj.get(k)
        if isinstance(v, float) and not math.isfinite(v):
            raise TraceError(n, f"{k} must be a finite number, not {v!r}")
    wait = obj.get("wait")
    if wait is not None and wait < 0:
        raise TraceError(n, f"wait must be seconds >= 0, not {wait!r}")
    draws = obj.get("draws", [])
    if not all(isinstance(d, int | float) and not isinstance(d, bool) for d in draws):
        raise TraceError(n, "draws must be a list of numbers")
    # a random source's values: a replay feeds them to the jitter again, so one out of
    # range (or NaN) would silently draw a wait the recording never took
    if not all(0 <= d < 1 for d in draws):
        raise TraceError(n, f"draws must be numbers in [0, 1), not {draws!r:.60}")


_WORDS: Final = {int: "an integer", str: "a string", bool: "true or false", list: "a list"}


def _header(obj: dict[str, Any], n: int) -> TurnHeader:
    v = obj["v"]
    if type(v) is not int or v != FORMAT:  # `true == 1`: a boolean is no version
        raise TraceError(
            n, f"trace format version {v!r} is not supported (this fallgate reads version {FORMAT})"
        )
    problems = []
    for k, kinds in (
        ("turn", (str,)),
        ("start", (int, float)),
        ("clock", (int, float)),
        ("domain", (str,)),
        ("first", (int,)),
        ("targets", (list,)),
    ):
        if k not in obj:
            problems.append(f"missing {k}")
        elif not isinstance(obj[k], kinds) or isinstance(obj[k], bool):
            problems.append(f"{k} must be {'a number' if float in kinds else _WORDS[kinds[0]]}")
    for k in ("start", "clock"):
        v = obj.get(k)
        if isinstance(v, float) and not math.isfinite(v):
            problems.append(f"{k} must be a finite number")
    if not isinstance(obj.get("store", ""), str):
        problems.append("store must be a string")
    if problems:
        raise TraceError(n, "turn line: " + ", ".join(problems))
    targets = []
    for i, t in enumerate(obj["targets"]):
        ok = isinstance(t, dict) and all(
            isinstance(t.get(k), str) for k in ("name", "provider", "model", "endpoint")
        )
        creds = t.get("credentials", []) if isinstance(t, dict) else None
        if not ok or not isinstance(creds, list) or not all(isinstance(c, str) for c in creds):
            raise TraceError(
                n,
                f"turn line: targets[{i}] must be an object with name, provider, model, "
                "endpoint (strings) and credentials (a list of ids)",
            )
        targets.append(
            TracedTarget(t["name"], t["provider"], t["model"], t["endpoint"], tuple(creds))
        )
    if not targets:
        raise TraceError(n, "turn line: targets is empty")
    if not 0 <= obj["first"] < len(targets):
        raise TraceError(
            n, f"turn line: first = {obj['first']} is not a position of its {len(targets)} targets"
        )
    return TurnHeader(
        obj["turn"],
        float(obj["start"]),
        float(obj["clock"]),
        obj["domain"],
        obj["first"],
        tuple(targets),
        obj.get("store"),
    )


def read_turns(text: str) -> list[TracedTurn]:
    """Every turn of a JSON-lines trace, in the order their first lines appear.

    Raises `TraceError` naming the line for anything that is not a trace: a line that is
    not a JSON object, a missing or mistyped field, a format version other than
    `FORMAT`, a transition of a turn whose turn line has not come yet. An old trace
    (no turn lines) is one turn with no header.
    """
    order: list[str] = []
    heads: dict[str, tuple[TurnHeader | None, int]] = {}
    events: dict[str, list[TraceEvent]] = {}
    lines: dict[str, list[int]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(n, f"not JSON ({e.msg})") from None
        except ValueError:  # an integer of more than 4,300 digits (Python's own limit)
            raise TraceError(n, "holds a number of more than 4,300 digits") from None
        except RecursionError:
            raise TraceError(n, "nested too deeply to be a trace") from None
        if not isinstance(obj, dict):
            raise TraceError(n, "expected an object")
        if "v" in obj:
            head = _header(obj, n)
            if head.turn in heads:
                raise TraceError(n, f"a second turn line for turn {head.turn!r}")
            heads[head.turn] = (head, n)
            order.append(head.turn)
            events[head.turn] = []
            lines[head.turn] = []
            continue
        missing = sorted(k for k in REQUIRED if k not in obj)
        if missing:
            raise TraceError(n, f"missing {', '.join(missing)}")
        _check(obj, n, [k for k in obj if k in _FIELDS])
        tid = obj.get("turn")
        key = tid if tid is not None else "-"
        if tid is not None and tid not in heads:
            raise TraceError(n, f"a transition of turn {tid!r}, whose turn line has not come")
        if key not in events:
            heads[key] = (None, n)
            order.append(key)
            events[key] = []
            lines[key] = []
        events[key].append(TraceEvent(**{k: v for k, v in obj.items() if k in _FIELDS}))
        lines[key].append(n)
    return [TracedTurn(heads[k][0], events[k], heads[k][1], lines[k]) for k in order]


def from_jsonl(text: str, turn: str | None = None) -> list[TraceEvent]:
    """The transitions of one turn of a JSON-lines trace (for diagrams with a highlighted
    path): the turn with id `turn`, else the first one of the file."""
    turns = read_turns(text)
    if turn is None:
        return list(turns[0].events) if turns else []
    for t in turns:
        if t.id == turn:
            return list(t.events)
    ids = ", ".join(t.id for t in turns[:10]) + (", ..." if len(turns) > 10 else "")
    raise TraceError(0, f"no turn {turn!r} in the trace (its turns: {ids or 'none'})")
