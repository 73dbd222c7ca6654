"""The host loop of the sans-IO protocol: once for threads, once for asyncio.

A turn returns actions; the host carries them out and feeds back what came
of them::

    start -> Attempt: make it, feed its Outcome
           | Wait:    sleep on the clock, then waited()
           | Rebuild: rebuild the target's client, then rebuilt(ok)
           | Finish / Fail: the end

`host_loop` (sync) and `ahost_loop` (asyncio) are that loop, and its only
copies: `fsm.run` / `fsm.drive`, `fsm.arun` / `fsm.adrive`,
`fsm.testing.play`, the openai wrappers and their streams all run on them.
Each is a generator that performs the waits and rebuilds itself. An Attempt
is made by ``attempt(action) -> Outcome`` when one is given, or else yielded
to the caller, who sends back its Outcome: that is how a stream makes
attempts whose chunks must reach its own caller as they arrive. The last
value the generator yields is the `Finish` or `Fail`, so without streaming a
turn is one call::

    end = next(host_loop(turn, clock=clock, attempt=make_attempt))

KeyboardInterrupt (and asyncio cancellation) while the loop runs, or closing
the generator before its end, cancel the turn (it ends `aborted`, recorded in
its trace) and propagate.

Before an Attempt the loop asks the turn's health store for its grant (`HealthStore.grant`:
the probe lease for a half-open target's probe, a token for a retry, taken atomically; no
attempt on a breaker that opened since; skipped while the store is quiet and the attempt
is neither); refused, it feeds ``denied`` and the turn moves on. A shared store
(`fsm.shared.SharedHealthStore`, ``shared = True``) is asked before every attempt (its one
exchange with the backend: what the turn reported goes out, the records it needs come
back), once before the turn starts and once after it ends; the asyncio loop runs those
exchanges in a worker thread, never on the event loop.

While turns are recorded (`fsm.record.record_traces`), each loop hands its turn to
the recorder first, which writes it (turn line and transitions) when the loop ends.

With OpenTelemetry switched on (`fsm.otel.enable`), each loop hands its turn
to `fsm.otel` first, which records it (spans, events, metrics) and makes each
attempt's span current while `attempt` runs; `telemetry` is what the caller
knows beyond the engine (`fsm.otel.Telemetry`). Switched off, that is one check
per turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from typing import Any

from . import otel as _otel
from . import record as _record
from .actions import Action, Attempt, Rebuild, Wait
from .clock import Clock
from .outcomes import Outcome
from .policy import Target
from .turn import _TurnBase

__all__ = ["ahost_loop", "host_loop", "must_sleep"]


def must_sleep(wait: Wait) -> bool:
    """Does this Wait take time? A zero wait (say a backoff the failed attempt
    already spent) ends at once, without handing control to anyone."""
    return wait.seconds > 0


def host_loop(
    turn: _TurnBase,
    *,
    clock: Clock,
    rebuild: Callable[[Target], Any] | None = None,
    attempt: Callable[[Attempt], Outcome] | None = None,
    telemetry: _otel.Telemetry | None = None,
) -> Generator[Action, Outcome, None]:
    """Run `turn` to its end on this thread.

    Waits sleep with ``clock.sleep``; ``rebuild(target)`` recreates a client
    (raising means it could not; without one every rebuild succeeds). Each
    Attempt is made by `attempt` when given, else yielded (send its Outcome
    back). The last value yielded is the Finish or Fail.
    """
    if _otel.ACTIVE is not None:
        turn, attempt = _otel.ACTIVE.observe(turn, attempt, telemetry)
    s = turn.s
    tape = _record.ACTIVE.begin(s) if _record.ACTIVE is not None else None
    health = s.health
    shared = health.shared
    if shared:
        health.begin(s)
    action = turn.start()
    try:
        while True:
            if type(action) is Attempt:
                if shared or action.probe or action.retry or not health.quiet():
                    why = health.grant(s, action)
                    if why is not None:
                        action = turn.deny(why)
                        continue
                if attempt is None:
                    action = turn.feed((yield action))
                else:
                    action = turn.feed(attempt(action))
            elif type(action) is Wait:
                if must_sleep(action):
                    clock.sleep(action.seconds)
                action = turn.waited()
            elif type(action) is Rebuild:
                ok = True
                if rebuild is not None:
                    try:
                        rebuild(action.target)
                    except Exception:
                        ok = False
                action = turn.rebuilt(ok)
            else:
                break
    except (GeneratorExit, KeyboardInterrupt):
        turn.cancel()
        raise
    finally:
        if shared:
            health.end(s)
        if tape is not None:
            tape.end()
    yield action


async def ahost_loop(
    turn: _TurnBase,
    *,
    clock: Clock,
    rebuild: Callable[[Target], Awaitable[Any]] | None = None,
    attempt: Callable[[Attempt], Awaitable[Outcome]] | None = None,
    telemetry: _otel.Telemetry | None = None,
) -> AsyncGenerator[Action, Outcome]:
    """The asyncio twin of `host_loop`: waits ``await clock.asleep``, `rebuild` and
    `attempt` are awaited. Cancellation also ends the turn `aborted`. Close it
    (``await gen.aclose()``) once you have the end."""
    if _otel.ACTIVE is not None:
        turn, attempt = _otel.ACTIVE.aobserve(turn, attempt, telemetry)
    s = turn.s
    tape = _record.ACTIVE.begin(s) if _record.ACTIVE is not None else None
    health = s.health
    shared = health.shared
    if shared:
        await asyncio.to_thread(health.begin, s)
    action = turn.start()
    try:
        while True:
            if type(action) is Attempt:
                if shared or action.probe or action.retry or not health.quiet():
                    why = (
                        await asyncio.to_thread(health.grant, s, action)
                        if shared
                        else health.grant(s, action)
                    )
                    if why is not None:
                        action = turn.deny(why)
                        continue
                if attempt is None:
                    action = turn.feed((yield action))
                else:
                    action = turn.feed(await attempt(action))
            elif type(action) is Wait:
                if must_sleep(action):
                    await clock.asleep(action.seconds)
                action = turn.waited()
            elif type(action) is Rebuild:
                ok = True
                if rebuild is not None:
                    try:
                        await rebuild(action.target)
                    except Exception:
                        ok = False
                action = turn.rebuilt(ok)
            else:
                break
    except (GeneratorExit, asyncio.CancelledError, KeyboardInterrupt):
        turn.cancel()
        raise
    finally:
        if shared:
            await asyncio.to_thread(health.end, s)
        if tape is not None:
            tape.end()
    yield action
