"""Recording turns as trace files (format 1, `fsm.trace`) that `fsm.replay.player` can replay.

Off until `record_traces` is called (``fallgate.record_traces("turns.jsonl")``): while
off, the host loops (`fsm.host.loop`) pay one check per turn (``ACTIVE is None``). While on,
every turn a host loop runs (``fsm.run``, ``Fallgate``, ...) is written when it ends,
finished or failed, as one block: its turn line, then its transitions. Each block is one
``write`` to a file opened for appending, so several processes may share one file.

What a recording holds beyond the trace: the turn's start (wall clock, and its clock's
reading), its policy's targets (provider, model, endpoint, credential ids: never a key)
and every value the turn's random source gave (the jitter of its waits), so that a
replay under the same policy draws the same waits.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import attrs

from ..trace import TracedTarget, TurnHeader, turn_jsonl

if TYPE_CHECKING:
    from ..core.state import TurnState
    from ..health.store import HealthStore

__all__ = ["ACTIVE", "Recorder", "record_traces", "stop_recording"]

logger = logging.getLogger("fallgate")
Sink = Callable[[str], None]

#: The recorder in force (None: recording is off).
ACTIVE: Recorder | None = None
_lock = threading.Lock()
_TURNS: Final = itertools.count(1)
#: The clocks turns were recorded on, the latest 64: (clock, domain name, wall, reading).
_domains: collections.OrderedDict[int, tuple[object, str, float, float]] = collections.OrderedDict()
_process = ""


def _process_id() -> str:
    """A short random name for this process (turn ids and clock domains stay apart in a
    file that several processes append to)."""
    global _process
    if not _process:
        _process = os.urandom(3).hex()
    return _process


#: This process's in-memory stores, numbered as first recorded (turns of one learnt
#: from each other; another process's never).
_stores: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()
_STORES: Final = itertools.count(1)  # never reused: a new store is never an old one


def _store_name(health: HealthStore) -> str:
    """The name of the health store a turn used, as a replay keeps stores apart: a shared
    one by its own name (its URL, never a password), an in-memory one by this process
    and its number here."""
    if health.shared:
        return f"shared:{getattr(health, 'name', '')}"
    with _lock:
        name = _stores.get(health)
        if name is None:
            name = _stores[health] = f"memory:{_process_id()}:{next(_STORES)}"
    return name


def _domain(clock: Callable[[], float], reading: float) -> tuple[str, float, float]:
    """The domain of a turn's clock, and its anchor: (name, wall time, clock reading) at
    the first turn recorded on it. Readings of one domain share a time scale."""
    owner = getattr(clock, "__self__", clock)
    with _lock:
        found = _domains.get(id(owner))
        if found is None or found[0] is not owner:
            found = (owner, f"{_process_id()}/{len(_domains) + 1}", time.time(), reading)
            _domains[id(owner)] = found
            while len(_domains) > 64:
                _domains.popitem(last=False)
        return found[1], found[2], found[3]


class _FileSink:
    """Appends each block to a file with one write (the file is opened per turn)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        # else every turn's write would fail, logged once
        if os.path.isdir(self.path):
            raise IsADirectoryError(f"cannot record turns to {self.path}: it is a directory")
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):
            raise FileNotFoundError(
                f"cannot record turns to {self.path}: its folder {folder} does not exist"
            )
        self._lock = threading.Lock()

    def __call__(self, text: str) -> None:
        data = text.encode("utf-8")
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

    def __repr__(self) -> str:
        return f"file {self.path}"


class Tape:
    """One turn being recorded: its header, and the draws of its random source."""

    __slots__ = ("draws", "header", "recorder", "s")

    def __init__(self, recorder: Recorder, s: TurnState) -> None:
        self.recorder = recorder
        self.s = s
        domain, wall, reading = _domain(s.clock, s.started)
        targets = tuple(
            TracedTarget(t.name, t.provider, t.model, t.key[0], tuple(c.id for c in t.credentials))
            for t in s.policy.targets
        )
        self.header = TurnHeader(
            f"{_process_id()}-{next(_TURNS)}",
            wall + (s.started - reading),
            s.started,
            domain,
            s.first,
            targets,
            _store_name(s.health),
        )
        self.draws: list[tuple[int, float]] = []
        inner = s.random

        def drawn() -> float:
            x = inner()
            self.draws.append((s.seq + 1, x))  # drawn while taking the next transition
            return x

        s.random = drawn

    def end(self) -> None:
        by_seq: dict[int, list[float]] = {}
        for seq, x in self.draws:
            by_seq.setdefault(seq, []).append(x)
        # times to full precision (a trace rounds them to the microsecond): a replay puts
        # each event at its recorded instant, in order with other turns' events
        raw = self.s._raw
        events = [
            attrs.evolve(e, time=r[1], draws=tuple(by_seq.get(e.seq, ())))
            for e, r in zip(self.s.trace, raw, strict=True)
        ]
        self.recorder.write(turn_jsonl(self.header, events))


class Recorder:
    """Writes each finished turn to `sink`: a path (appended to) or a callable given
    each turn's lines. A sink that fails is logged once and never fails a turn."""

    def __init__(self, sink: str | os.PathLike[str] | Sink) -> None:
        self.sink: Sink = sink if callable(sink) else _FileSink(sink)
        self.turns = 0
        self._failed = False

    def begin(self, s: TurnState) -> Tape:
        return Tape(self, s)

    def write(self, text: str) -> None:
        try:
            self.sink(text)
        except Exception as e:  # a full disk must not fail the call it records
            if not self._failed:
                self._failed = True
                logger.warning("fallgate: cannot record a turn to %r: %s", self.sink, e)
            return
        self.turns += 1

    def close(self) -> None:
        """Stop recording (if this is the recorder in force)."""
        global ACTIVE
        with _lock:
            if ACTIVE is self:
                ACTIVE = None

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Recorder({self.sink!r}, turns={self.turns})"


def record_traces(sink: str | os.PathLike[str] | Sink) -> Recorder:
    """Record every turn of this process from now on (replacing any recorder in force).
    Use the returned `Recorder` as a context manager, or call `stop_recording`."""
    global ACTIVE
    rec = Recorder(sink)
    with _lock:
        ACTIVE = rec
    return rec


def stop_recording() -> None:
    """Stop recording turns."""
    global ACTIVE
    with _lock:
        ACTIVE = None
