"""Progress of a long check: a line now and then, once a search runs past a threshold.

A check of a long chain can take seconds; a silent minute looks like a hang. The
search calls `Progress.tick` as it goes; nothing is said before `after` seconds (a
quick check stays quiet), then one line every `every` seconds. The line goes to the
`write` callable (the CLI's is stderr), never into the report or its JSON.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

#: Seconds a check runs before `fallgate check` reports progress.
AFTER: Final = 2.0
#: Seconds between two progress lines.
EVERY: Final = 2.0


class Progress:
    """Says how far a search got, once it has run for `after` seconds."""

    __slots__ = ("_next", "_t0", "after", "clock", "every", "lines", "write")

    def __init__(
        self,
        write: Callable[[str], object],
        *,
        after: float = AFTER,
        every: float = EVERY,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not (after >= 0 and every > 0):
            raise ValueError(f"progress: after must be >= 0 and every > 0, got {after}, {every}")
        self.write = write
        self.after = after
        self.every = every
        self.clock = clock
        self._t0 = clock()
        self._next = self._t0 + after
        self.lines = 0  # how many lines were written

    def tick(self, states: int, transitions: int, queued: int) -> None:
        """Called by the search between expansions (cheap until a line is due)."""
        now = self.clock()
        if now < self._next:
            return
        spent = now - self._t0
        rate = states / spent if spent > 0 else 0.0
        self.write(
            f"still checking: {states:,} states, {transitions:,} transitions explored in "
            f"{spent:.1f} s ({rate:,.0f} states/s), {queued:,} queued"
        )
        self.lines += 1
        self._next = now + self.every
