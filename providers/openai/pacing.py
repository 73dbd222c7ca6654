"""The adapter's part in pacing: every reply's rate-limit headers into the health store,
and each request's token cost.

Headers are read by a response hook on the HTTP client of every client the pool builds
(`attach`: the default factories' and a caller's own ``client_factory``'s alike), so
successes, errors and streams are read as their headers arrive; the attempt in flight
names its store, target and key in a context variable (`reading`), so a hook on a client
shared by turns of many stores (or used by the caller outside fallgate) writes to the
right one, or to none. A client whose HTTP client takes no ``event_hooks`` (not an httpx
client) is not read: pacing then does nothing for it.

The cost of a request (`Costs.estimate`): its input (characters / 4 at first) plus its
``max_tokens`` / ``max_completion_tokens`` / ``max_output_tokens``, or the completion the
model usually writes. Both parts are corrected per model by the ``usage`` that comes back
(`Costs.learn`: the prompt tokens per character and the completion tokens seen).
"""

from __future__ import annotations

import contextvars
import inspect
import operator
import threading
import time
from collections.abc import Mapping
from typing import Any, Final

from ...fsm.catalogue.ratelimit import parse_limits
from ...fsm.catalogue.registry import lookup
from ...fsm.clock import default_clock

__all__ = ["READING", "Costs", "attach", "done", "reading"]

#: (health store, target, credential, clock, when the request went out) of the attempt in
#: flight, for the hook (the adapter's hot path sets and resets it itself).
READING: Final[contextvars.ContextVar[tuple[Any, Any, Any, Any, float] | None]] = (
    contextvars.ContextVar("fallgate_ratelimit_reading", default=None)
)
_READING: Final = READING


def sent_at(clock: Any) -> float:
    """Now on the attempt's clock: when its request goes out. A provider words its
    rate-limit headers as the request arrives, so what a reply says is dated then."""
    now: float = (clock or default_clock()).now()
    return now


def reading(health: Any, target: Any, credential: Any, clock: Any) -> contextvars.Token[Any]:
    """Name where the attempt's replies are read into (reset the token when it ends)."""
    return _READING.set((health, target, credential, clock, sent_at(clock)))


def done(token: contextvars.Token[Any]) -> None:
    _READING.reset(token)


#: A header's lower-cased name in an httpx ``Headers``' own list of (raw, lower, value).
_LOWER: Final = operator.itemgetter(1)


def _silent(headers: Any) -> bool:
    """Whether no header name says "ratelimit" / "tokenlimit" (the names joined in C: no
    Python call per header); False when they cannot be read so (the parser reads them)."""
    try:
        names = b" ".join(map(_LOWER, headers._list))
    except Exception:  # not httpx's headers: let the parser read them
        return False
    return b"ratelimit" not in names and b"tokenlimit" not in names


def _note(response: Any) -> None:
    """The sync clients' response hook."""
    where = _READING.get()
    if where is not None and not _silent(response.headers):
        _observe(response, where)


def _observe(response: Any, where: tuple[Any, Any, Any, Any, float]) -> None:
    health, target, credential, clock, sent = where
    provider = lookup(target.provider)
    dialect = provider.ratelimit if provider is not None else None
    limits = parse_limits(response.headers, time.time(), dialect)
    if limits is None:
        return
    now = (clock or default_clock()).now()
    health.observe_limits(target.key, credential.health_id, limits, now, max(0.0, now - sent))


async def _anote(response: Any) -> None:
    """The asyncio clients' response hook (the check inlined: one Python call per reply
    without rate-limit headers, the core's call budget)."""
    where = _READING.get()
    if where is None:
        return
    try:
        names = b" ".join(map(_LOWER, response.headers._list))
    except Exception:  # not httpx's headers: let the parser read them
        names = b"ratelimit"
    if b"ratelimit" in names or b"tokenlimit" in names:
        _observe(response, where)


def attach(client: Any) -> bool:
    """Read `client`'s replies for pacing (an ``openai.OpenAI`` / ``AsyncOpenAI`` from any
    factory, or an httpx client): its HTTP client's response hooks get ours, once. False
    when it has no ``event_hooks`` to add to (its replies are then not read)."""
    http = getattr(client, "_client", client)
    try:
        current = http.event_hooks
        if not isinstance(current, Mapping):
            return False
        responses = list(current.get("response", ()))
        if _note in responses or _anote in responses:
            return True
        mine = _anote if inspect.iscoroutinefunction(getattr(http, "send", None)) else _note
        http.event_hooks = {**current, "response": [*responses, mine]}
    except Exception:  # not an httpx client: nothing to hook into
        return False
    return True


_LIMITS: Final = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def _chars(value: Any, depth: int = 0) -> int:
    """Characters of text in a request's messages / input (nested parts included; loops,
    not generators: this runs once per turn)."""
    if isinstance(value, str):
        return len(value)
    if depth > 6:
        return 0
    n = 0
    if isinstance(value, dict) or (not isinstance(value, list) and isinstance(value, Mapping)):
        for k, v in value.items():
            if k != "role":
                n += len(v) if isinstance(v, str) else _chars(v, depth + 1)
    elif isinstance(value, list | tuple):
        for v in value:
            n += len(v) if isinstance(v, str) else _chars(v, depth + 1)
    return n


class Costs:
    """Per model: prompt tokens per character and the completion usually written."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._per_char: dict[str, float] = {}
        self._completion: dict[str, float] = {}

    def estimate(self, model: str, kwargs: Mapping[str, Any]) -> tuple[float, int]:
        """(tokens expected, characters of input) for one attempt of this request."""
        chars = _chars(kwargs.get("messages"))
        if "input" in kwargs:
            chars += _chars(kwargs["input"])
        prompt = chars * self._per_char.get(model, 0.25)
        asked = None
        for k in _LIMITS:
            v = kwargs.get(k)
            if isinstance(v, int):
                asked = v
                break
        out = float(asked) if asked is not None else self._completion.get(model, 0.0)
        return prompt + out, chars

    def learn(self, model: str, chars: int, usage: Any) -> None:
        """Correct the estimate from a reply's usage (ignored when it has none)."""
        prompt = getattr(usage, "prompt_tokens", None) or getattr(usage, "input_tokens", None)
        done_ = getattr(usage, "completion_tokens", None) or getattr(usage, "output_tokens", None)
        with self._lock:
            if isinstance(prompt, int) and chars > 0:
                old = self._per_char.get(model)
                ratio = prompt / chars
                self._per_char[model] = ratio if old is None else 0.8 * old + 0.2 * ratio
            if isinstance(done_, int):
                old = self._completion.get(model)
                self._completion[model] = done_ if old is None else 0.8 * old + 0.2 * done_
