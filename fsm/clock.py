"""The default clock and the testing switch that makes every wait instant.

The core never reads time itself: it is handed a clock. The default clock is
monotonic time plus a virtual offset; with `instant_waits()` on, drivers do
not sleep but advance that offset, so cooldowns and Retry-After stay honest
in tests that take no real time (like stamina's testing mode).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

_lock = threading.Lock()
_offset = 0.0
_instant = False


def now() -> float:
    """Monotonic seconds, plus whatever instant waits have skipped."""
    return time.monotonic() + _offset


def advance(seconds: float) -> None:
    """Move the default clock forward (what an instant wait does)."""
    global _offset
    if seconds > 0:
        with _lock:
            _offset += seconds


def is_instant() -> bool:
    return _instant


def set_instant_waits(on: bool) -> None:
    """Globally make waits instant (True) or real (False)."""
    global _instant
    _instant = bool(on)


@contextlib.contextmanager
def instant_waits() -> Iterator[None]:
    """Within the block, drivers skip sleeps and advance the default clock instead."""
    previous = _instant
    set_instant_waits(True)
    try:
        yield
    finally:
        set_instant_waits(previous)
