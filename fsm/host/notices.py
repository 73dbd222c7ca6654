"""What the user sees when it matters: WARNINGs on the ``fallgate`` logger.

Read after each turn (`notice`, called by the drivers as a turn ends), once per change
of state, never once per turn:

- a turn **falls back** from a target: WARNING with the reason (``rate_limited (HTTP
  429 ...)``), then nothing while later turns keep falling back from it for the same
  reason; INFO once the target answers again;
- a target's **breaker opens**, or one of its **keys is benched** (its cooldown in the
  health store): WARNING with how long and why, once per bench;
- a target that answers **not_found** (a 404 model not found, or a redirect) before
  it ever answered in this process: ERROR, a configuration error (a typo in a model
  name or a base_url must not move all traffic to the fallback for good, silently).

The happy path costs one check: a turn that succeeded at its first attempt on a target
with nothing to report reads no trace. State is per process (a lock guards it: turns
run on many threads); secrets never appear (details are redacted by the drivers).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..core.events import wait_and_detail
from ..core.state import TurnState
from ..health.store import HealthStore
from ..policy.model import Policy, Target

__all__ = ["forget", "notice"]

logger = logging.getLogger("fallgate")

_lock = threading.Lock()
#: Target key -> the outcome kind turns are falling back from it for.
_falling: dict[Any, str] = {}
#: Target key -> end of the breaker opening already reported.
_opened: dict[Any, float] = {}
#: (target key, credential id) -> end of the bench already reported.
_benched: dict[tuple[Any, str], float] = {}
#: Target keys that answered in this process (a 404 after that is no typo).
_answered: set[Any] = set()
_misnamed: set[Any] = set()


def forget() -> None:
    """Start over (tests)."""
    with _lock:
        _falling.clear()
        _opened.clear()
        _benched.clear()
        _answered.clear()
        _misnamed.clear()


def _name(t: Target) -> str:
    return f"{t.name} ({t.provider}/{t.model})"


def notice(s: TurnState, policy: Policy, health: HealthStore | None, ended: str) -> None:
    """Report what this finished turn changed (see the module)."""
    if ended == "done" and s.total_attempts == 1:
        target = s.target
        if target.key in _answered:
            if _falling and target.key in _falling:
                _recovered(target)
            return
    try:
        _read(s, policy, health, ended)
    except Exception:  # reporting must never break a turn
        logger.debug("fallgate: could not report a turn's changes", exc_info=True)


def _recovered(target: Target) -> None:
    with _lock:
        reason = _falling.pop(target.key, None)
    if reason is not None:
        logger.info(
            "fallgate: %s answers again (turns fell back from it: %s)", _name(target), reason
        )


def _read(s: TurnState, policy: Policy, health: HealthStore | None, ended: str) -> None:
    # the raw record of each transition, not the trace: a `TraceEvent` (and its detail
    # text) is built only for the rare transition that is reported
    by_state = {t.name: t for t in policy.targets}
    for raw in s._raw:
        src = by_state.get(raw[2])
        if src is None:
            continue
        event = str(raw[3])  # an OutcomeKind fed directly reads as its value
        if event == "success":
            with _lock:
                _answered.add(src.key)
            _recovered(src)
            continue
        if event == "not_found":
            _not_found(src, s, raw)
        dest = by_state.get(raw[4])
        if dest is not None and dest is not src:
            _fell_back(src, dest, event, s, raw)
    if health is not None:
        _health(s, policy, health)


def _detail(s: TurnState, raw: tuple[Any, ...]) -> str:
    """The detail the transition's `TraceEvent` shows."""
    return wait_and_detail(s, raw)[1]


def _not_found(t: Target, s: TurnState, raw: tuple[Any, ...]) -> None:
    with _lock:
        if t.key in _answered or t.key in _misnamed:
            return
        _misnamed.add(t.key)
    logger.error(
        "fallgate: %s answered not_found before it ever answered: check its model name "
        "(a 404) or base_url (a redirect) in the policy (%s); until then every turn "
        "falls back from it",
        _name(t),
        _detail(s, raw) or "not_found",
    )


def _fell_back(src: Target, dest: Target, kind: str, s: TurnState, raw: tuple[Any, ...]) -> None:
    with _lock:
        if _falling.get(src.key) == kind:
            return
        _falling[src.key] = kind
    logger.warning(
        "fallgate: falling back from %s to %s: %s",
        _name(src),
        _name(dest),
        _detail(s, raw) or kind,
        extra={"fallgate": {"from": src.name, "to": dest.name, "kind": kind}},
    )


def _health(s: TurnState, policy: Policy, health: HealthStore) -> None:
    now = s.clock()
    for t in policy.targets:
        until = health.target_until(t.key)
        if until > now:
            with _lock:
                fresh = _opened.get(t.key, 0.0) < now
                _opened[t.key] = until
            if fresh:
                logger.warning(
                    "fallgate: %s's breaker is open for %.0fs: %s",
                    _name(t),
                    until - now,
                    health.cause(t.key) or "repeated failures",
                )
        for c in t.credentials:
            cred = c.health_id
            benched = health.credential_until(t.key, cred)
            if benched <= now:
                continue
            with _lock:
                fresh = _benched.get((t.key, cred), 0.0) < now
                _benched[(t.key, cred)] = benched
            if fresh:
                logger.warning(
                    "fallgate: %s's key %s is benched for %.0fs: %s",
                    _name(t),
                    c.id,
                    benched - now,
                    health.cause(t.key, cred) or "it failed",
                )
