"""Timeouts as the SDK takes them, combined with the engine's limit per attempt.

A caller may bound an attempt with what the `openai` SDK accepts for
``timeout=``: a number of seconds, an ``openai.Timeout`` / ``httpx.Timeout``
/ ``httpx2.Timeout`` (per phase: connect, read, write, pool), or None (no
bound of the caller's own). The engine's limit for the attempt (the policy's
``attempt_timeout``, or what is left of the turn's deadline if that is less;
`engine_phases`: ``connect_timeout`` for the connect phase, and for a stream a
read phase as long as ``stream_idle_timeout`` when that is longer, since a
started stream waits that long between events) always applies: each phase gets
the smallest of the engine's limit and every bound given for it
(``Fallgate(timeout=...)``, ``with_options(timeout=...)``, ``create(timeout=...)``).
The result goes to the SDK per request, as a number when every phase agrees,
else as the installed HTTP library's
``Timeout`` (`providers.openai.http.transport.Timeout`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import attrs
import openai

from . import transport

__all__ = ["Bound", "combine", "engine_phases", "given"]

_PHASES = ("connect", "read", "write", "pool")


#: A tuple, not ``NotGiven | Omit``: that union would be built anew at every call.
_UNGIVEN = (openai.NotGiven, openai.Omit)


def given(value: Any) -> bool:
    """Did the caller pass a value (not ``openai.NOT_GIVEN`` / ``openai.omit``)?"""
    return not isinstance(value, _UNGIVEN)


def _seconds(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v) and v > 0


@attrs.frozen(slots=True)
class Bound:
    """A caller's timeout: seconds per phase (connect, read, write, pool); None: unbounded."""

    phases: tuple[float | None, float | None, float | None, float | None]

    @classmethod
    def parse(cls, value: Any, *, error: type[Exception] = TypeError) -> Bound | None:
        """A number, an SDK/httpx/httpx2 ``Timeout``, or None (NOT_GIVEN: None too)."""
        if value is None or not given(value):
            return None
        if _seconds(value):
            s = float(value)
            return cls((s, s, s, s))
        if all(hasattr(value, p) for p in _PHASES):
            phases = [getattr(value, p) for p in _PHASES]
            if all(v is None or _seconds(v) for v in phases):
                a, b, c, d = (None if v is None else float(v) for v in phases)
                return cls((a, b, c, d))
        raise error(
            "timeout must be a positive number of seconds, an openai.Timeout "
            f"(httpx.Timeout / httpx2.Timeout) or None, got {value!r}"
        )


@functools.lru_cache(maxsize=256)
def engine_phases(seconds: float, connect: float, idle: float | None = None) -> Bound:
    """The engine's limit per phase for an attempt of `seconds`: connect at most
    `connect`; with `idle` (a stream), each read as long as the wait for an event may be.
    Where the socket is bounded (`providers.openai.http.bounds`) these only back it up.
    Cached: most attempts get the whole ``attempt_timeout``, so the same few values."""
    read = seconds if idle is None or idle < seconds else idle
    return Bound((min(seconds, connect), read, seconds, seconds))


@functools.lru_cache(maxsize=256)
def _as_sent(engine: Bound) -> Any:
    """`engine` as the SDK takes it (cached, like `engine_phases`: built once per value)."""
    phases = [math.inf if v is None else v for v in engine.phases]
    if len(set(phases)) == 1:
        return phases[0]
    return transport.Timeout(**dict(zip(_PHASES, phases, strict=True)))


def combine(engine: float | Bound, *bounds: Bound | None) -> Any:
    """The attempt's timeout for the SDK: each phase the least of `engine` and the bounds."""
    if isinstance(engine, Bound):
        if not any(bounds):
            return _as_sent(engine)  # the common case: no bound of the caller's own
        phases = [math.inf if v is None else v for v in engine.phases]
    else:
        if not any(bounds):
            return engine  # the common case: no bound of the caller's own
        phases = [engine] * 4
    for b in bounds:
        if b is not None:
            phases = [p if v is None else min(p, v) for p, v in zip(phases, b.phases, strict=True)]
    if len(set(phases)) == 1:
        return phases[0]
    return transport.Timeout(**dict(zip(_PHASES, phases, strict=True)))
