"""The host loop of the sans-IO protocol: once for threads, once for asyncio.

A turn returns actions; the host carries them out and feeds back what came
of them::

    start -> Attempt: make it, feed its Outcome
           | Wait:    sleep on the clock, then waited()
           | Rebuild: rebuild the target's client, then rebuilt(ok)
           | Finish / Fail: the end

`host_loop` (sync) and `ahost_loop` (asyncio) are that loop, and its only
copies: `fsm.run` / `fsm.drive`, `fsm.host.scripted.play`, the openai wrappers'
streams run on them; `fsm.arun` / `fsm.adrive` (and so the async wrappers'
turns) on `ahost_run`, the same asyncio loop as one coroutine (both share its
steps between attempts, `_AsyncSteps`).
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
(`fsm.health.shared_store.SharedHealthStore`, ``shared = True``) is asked before every
attempt (its one exchange with the backend: what the turn reported goes out, the
records it needs come back), once before the turn starts and once after it ends; the
asyncio loop runs those
exchanges in a worker thread, never on the event loop.

While turns are recorded (`fsm.host.recorder.record_traces`), each loop hands its turn to
the recorder first, which writes it (turn line and transitions) when the loop ends.

With an observer installed (`fsm.host.observe.ACTIVE`: OpenTelemetry's, by
`fsm.telemetry.otel.enable`), each loop hands its turn to it first, which records it
(spans, events, metrics) and makes each attempt's span current while `attempt` runs;
`telemetry` is what the caller knows beyond the engine (`fsm.host.observe.Telemetry`).
Without one, that is one check per turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from typing import Any

import attrs

from ..clock import Clock
from ..core.actions import Action, Attempt, Rebuild, Wait
from ..core.state import MIN_ATTEMPT, TurnState
from ..core.turn import TurnBase
from ..kinds import Outcome
from ..policy.model import Target
from . import observe as _observe
from . import recorder as _record
from .observe import Telemetry

__all__ = ["ahost_loop", "ahost_run", "host_loop", "must_sleep"]


#: Time between the turn's decision and the hand-over below which nothing is redone.
_HANDOVER_SLACK = 0.001
#: The least time left worth sending a late attempt with (its client's own set-up would
#: take the rest, and it would fail "before it reached the network", blaming its target).
_HANDOVER_LEAST = 0.01


def as_of_now(s: TurnState, a: Attempt) -> Attempt | str:
    """Attempt `a` as it goes out now: a shared store's exchange or a slow on_transition
    hook may have spent time since the turn decided it, which its bounds must not give
    again, so its timeout and time left are what the deadline leaves now. When it leaves
    none worth sending (`_HANDOVER_LEAST`; the store's exchange before the turn began may
    have taken it too), why the attempt is not made (the turn moves on as when the store
    refuses one, and the deadline ends it): no target is blamed for a timeout it never
    had. Asked only of turns on a shared store or with a hook (the others hand over at
    once)."""
    now = s.clock()
    left = s.policy.deadline - (now - s.started)
    if left < max(MIN_ATTEMPT, _HANDOVER_LEAST):
        return (
            f"the rest of the {s.policy.deadline:g}s deadline went before the attempt could "
            "go out (on the health store's exchanges or the on_transition hook)"
        )
    if now - s.at <= _HANDOVER_SLACK or left >= a.until_deadline:
        return a
    return attrs.evolve(a, timeout=min(a.timeout, left), until_deadline=left)


def must_sleep(wait: Wait) -> bool:
    """Does this Wait take time? A zero wait (say a backoff the failed attempt
    already spent) ends at once, without handing control to anyone."""
    return wait.seconds > 0


def host_loop(
    turn: TurnBase,
    *,
    clock: Clock,
    rebuild: Callable[[Target], Any] | None = None,
    attempt: Callable[[Attempt], Outcome] | None = None,
    telemetry: Telemetry | None = None,
) -> Generator[Action, Outcome, None]:
    """Run `turn` to its end on this thread.

    Waits sleep with ``clock.sleep``; ``rebuild(target)`` recreates a client
    (raising means it could not; without one every rebuild succeeds). Each
    Attempt is made by `attempt` when given, else yielded (send its Outcome
    back). The last value yielded is the Finish or Fail.
    """
    if _observe.ACTIVE is not None:
        turn, attempt = _observe.ACTIVE.observe(turn, attempt, telemetry)
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
                out = as_of_now(s, action) if shared or s.hook is not None else action
                if isinstance(out, str):
                    action = turn.deny(out)
                    continue
                if attempt is None:
                    action = turn.feed((yield out))
                else:
                    action = turn.feed(attempt(out))
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


class _AsyncSteps:
    """What both asyncio loops carry out between attempts: the shared store's
    exchanges (in a worker thread), grants, waits and rebuilds."""

    __slots__ = ("clock", "health", "rebuild", "s", "shared", "tape", "turn")

    def __init__(
        self,
        turn: TurnBase,
        clock: Clock,
        rebuild: Callable[[Target], Awaitable[Any]] | None,
    ) -> None:
        self.turn = turn
        self.clock = clock
        self.rebuild = rebuild
        self.s = turn.s
        self.health = self.s.health
        self.shared = self.health.shared
        self.tape: _record.Tape | None = None

    async def begin(self) -> Action:
        if _record.ACTIVE is not None:
            self.tape = _record.ACTIVE.begin(self.s)
        if self.shared:
            await asyncio.to_thread(self.health.begin, self.s)
        return self.turn.start()

    async def until_attempt(self, action: Action) -> Action:
        """Carry out `action` and what follows it until the turn asks for an Attempt
        the health store grants, or ends; returns that Attempt, or the Finish / Fail."""
        turn, health, shared = self.turn, self.health, self.shared
        while True:
            if type(action) is Attempt:
                if shared or action.probe or action.retry or not health.quiet():
                    why = (
                        await asyncio.to_thread(health.grant, self.s, action)
                        if shared
                        else health.grant(self.s, action)
                    )
                    if why is not None:
                        action = turn.deny(why)
                        continue
                out = as_of_now(self.s, action) if shared or self.s.hook is not None else action
                if isinstance(out, str):
                    action = turn.deny(out)
                    continue
                return out
            if type(action) is Wait:
                if must_sleep(action):
                    await self.clock.asleep(action.seconds)
                action = turn.waited()
            elif type(action) is Rebuild:
                ok = True
                if self.rebuild is not None:
                    try:
                        await self.rebuild(action.target)
                    except Exception:
                        ok = False
                action = turn.rebuilt(ok)
            else:
                return action

    async def end(self) -> None:
        if self.shared:
            await asyncio.to_thread(self.health.end, self.s)
        if self.tape is not None:
            self.tape.end()


async def ahost_loop(
    turn: TurnBase,
    *,
    clock: Clock,
    rebuild: Callable[[Target], Awaitable[Any]] | None = None,
    attempt: Callable[[Attempt], Awaitable[Outcome]] | None = None,
    telemetry: Telemetry | None = None,
) -> AsyncGenerator[Action, Outcome]:
    """The asyncio twin of `host_loop`: waits ``await clock.asleep``, `rebuild` and
    `attempt` are awaited. Cancellation also ends the turn `aborted`. Close it
    (``await gen.aclose()``) once you have the end."""
    if _observe.ACTIVE is not None:
        turn, attempt = _observe.ACTIVE.aobserve(turn, attempt, telemetry)
    steps = _AsyncSteps(turn, clock, rebuild)
    action = await steps.begin()
    try:
        while type(action := await steps.until_attempt(action)) is Attempt:
            outcome = (yield action) if attempt is None else await attempt(action)
            action = turn.feed(outcome)
    except (GeneratorExit, asyncio.CancelledError, KeyboardInterrupt):
        turn.cancel()
        raise
    finally:
        await steps.end()
    yield action


async def ahost_run(
    turn: TurnBase,
    *,
    clock: Clock,
    attempt: Callable[[Attempt], Awaitable[Outcome]],
    rebuild: Callable[[Target], Awaitable[Any]] | None = None,
    telemetry: Telemetry | None = None,
) -> Action:
    """`ahost_loop` for a host that makes every Attempt with `attempt`: one coroutine
    that returns the Finish or Fail. (Not a generator: an async generator per turn sits
    between the caller and every resumption of the SDK, and costs its own bookkeeping.)"""
    if _observe.ACTIVE is not None:
        turn, observed = _observe.ACTIVE.aobserve(turn, attempt, telemetry)
        assert observed is not None  # given an attempt, it hands back its wrapper
        attempt = observed
    steps = _AsyncSteps(turn, clock, rebuild)
    action = await steps.begin()
    try:
        while type(action := await steps.until_attempt(action)) is Attempt:
            action = turn.feed(await attempt(action))
    except (asyncio.CancelledError, KeyboardInterrupt):
        turn.cancel()
        raise
    finally:
        await steps.end()
    return action
