"""Headroom: what a provider said is left of one key's rate limits, and what is reserved.

One record per (backend, credential), kept apart from the key's cooldown (its shared key
is ``h|<base_url>|<model>|<health id>``, `headroom_key`). Every function here is a pure
update or read of such a record at `now`, so the in-memory store, the shared store's
replica and every backend (SQLite in one transaction, Redis in one compare-and-set
script) apply the same rules.

Fields (each optional; times in the clock of whoever holds the record):

| field | meaning |
|---|---|
| ``rq``, ``rqa``, ``rql`` | requests remaining as last said, when that limit resets, the limit |
| ``tk``, ``tka``, ``tkl`` | the same for tokens |
| ``said`` | when the request whose reply said them was sent |
| ``res`` | reservations in flight: id -> ``[tokens, made, expires]`` |

The rules:

- **What is said** (`observe`): dated when its request was sent (the provider counts a
  request as it arrives, so a slow reply's numbers are as old as the reply is slow); the
  reply about the request sent last wins (a reply that arrives late with older numbers
  does not raise the headroom back); a limit not mentioned keeps what an earlier reply
  said of it.
- **Headroom now** for a request of `cost` tokens (`ready_at`): a limit nobody spoke of
  is no limit. Otherwise what was said, less the reservations made since it was said
  (`ARRIVAL` before, at most: an attempt sent just before that reply's request was counted
  by the provider already); once its reset has passed, the whole limit (when one was said) less
  the reservations made since the reset. A request larger than a whole limit needs only
  the whole limit (it is the provider's to refuse). When a limit has no room: the key is
  free again at that limit's reset, or, past its reset and used up by the reservations
  since, `AFTER_RESET` later (the next reply says more).
- **No reset named** (none sent, or one that cannot be read): the limit is taken to
  reset `UNNAMED_RESET` after the request whose reply said it. A key is never held back
  for good by a reply that did not say until when.
- **Reserve** (`reserve`): take one request and `cost` tokens only if `ready_at` says
  now; else refuse (None). A reservation expires on its own at `expires` (an attempt's
  bound and a grace): a process that died mid-attempt leaks nothing.
- **Release** (`release`): the reservation goes, whatever the attempt's outcome (the
  reply's headers, read before, say what the provider counted).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import quote, unquote

from ..catalogue.ratelimit import Limits
from .backend import Record

__all__ = [
    "AFTER_RESET",
    "ARRIVAL",
    "GRACE",
    "UNNAMED_RESET",
    "headroom_key",
    "identities",
    "identity",
    "inert",
    "observe",
    "parse_headroom_key",
    "ready_at",
    "release",
    "reserve",
    "reserved",
    "shifted",
    "why_empty",
]

#: How long before a reply's request an attempt may have been sent and still be counted in
#: what the reply says (seconds): reservations older than that are taken as counted.
ARRIVAL: Final = 0.25
#: After a reset that the reservations since have used up: how long until it is looked at
#: again (the next reply says more).
AFTER_RESET: Final = 0.05
#: A reservation outlives its attempt's bound by this much before it expires on its own.
GRACE: Final = 1.0
#: A limit said with no reset named (or one that cannot be read) is taken to reset this
#: long after its request (seconds). Short: a key still empty then answers with its limits
#: again, or a 429 that benches it; a long guess would idle a key that has room.
UNNAMED_RESET: Final = 1.0
_TIMES: Final = ("rqa", "tka", "said")


def headroom_key(target: Any, health_id: str) -> str:
    """The shared key of one credential's headroom record."""
    return "h|" + "|".join(quote(p, safe=":/") for p in (*target, health_id))


@functools.lru_cache(maxsize=4096)  # parsed on every pull, like `records.parse_key`
def parse_headroom_key(key: str) -> tuple[tuple[str, str], str] | None:
    parts = key.split("|")
    if parts[0] != "h" or len(parts) != 4:
        return None
    return (unquote(parts[1]), unquote(parts[2])), unquote(parts[3])


def _num(r: Mapping[str, Any], f: str) -> float | None:
    v = r.get(f)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _reservations(r: Mapping[str, Any], now: float) -> dict[str, list[float]]:
    """The live reservations (expired and malformed ones dropped)."""
    res = r.get("res")
    if not isinstance(res, dict):
        return {}
    out: dict[str, list[float]] = {}
    for k, v in res.items():
        if (
            isinstance(k, str)
            and isinstance(v, list | tuple)
            and len(v) == 3
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
            and v[2] > now
        ):
            out[k] = [float(x) for x in v]
    return out


def observe(r: Record, now: float, limits: Limits, age: float = 0.0) -> Record:
    """What a reply arriving at `now` said (`limits`), of its request sent `age` seconds
    before: a provider counts a request, and words its headers, as the request arrives,
    so what they say is dated then (``said``), and their resets count from then. A
    reply about a request sent later wins over one about a request sent before it."""
    at = now - age if age > 0.0 else now
    said = _num(r, "said")
    if said is not None and said > at:
        return r  # a reply about a later request was recorded already
    out: dict[str, Any] = dict(r)
    for short, what in (("rq", "requests"), ("tk", "tokens")):
        rem = getattr(limits, f"{what}_remaining")
        if rem is None:
            continue
        out[short] = int(rem)
        reset = getattr(limits, f"{what}_reset")
        if reset is not None:
            out[short + "a"] = at + reset
        else:
            out.pop(short + "a", None)
        lim = getattr(limits, f"{what}_limit")
        if lim is not None:
            out[short + "l"] = int(lim)
    out["said"] = at
    return out


def _reset(r: Mapping[str, Any], short: str) -> tuple[float, bool]:
    """When limit `short` resets, and whether the provider named that time (else it is
    `UNNAMED_RESET` after the request whose reply said the limit)."""
    reset = _num(r, short + "a")
    if reset is not None:
        return reset, True
    said = _num(r, "said")
    return (said if said is not None else -math.inf) + UNNAMED_RESET, False


def _room(
    r: Mapping[str, Any], now: float, short: str, res: dict[str, list[float]]
) -> tuple[float, float, float, bool] | None:
    """Limit `short` ("rq" or "tk") now: (room, what the reservations not counted in it
    take, the limit's reset, whether that reset has passed); None when nobody spoke of
    it or it reset to a whole limit nobody said (no limit)."""
    rem = _num(r, short)
    if rem is None:
        return None  # never spoken of: no limit
    reset = _reset(r, short)[0]
    past = reset <= now
    if past:
        lim = _num(r, short + "l")
        if lim is None:
            return None  # reset, and the whole limit unknown: no limit until a reply says
        room, since = lim, reset
    else:
        room, since = rem, (_num(r, "said") or -math.inf) - ARRIVAL
    tokens = short == "tk"
    used = sum(v[0] if tokens else 1.0 for v in res.values() if v[1] > since)
    return room, used, reset, past


def _limit_ready(
    r: Mapping[str, Any], now: float, short: str, need: float, res: dict[str, list[float]]
) -> float:
    """When limit `short` ("rq" or "tk") has room for `need` (requests or tokens): `now`,
    or the time it will."""
    found = _room(r, now, short, res)
    if found is None:
        return now
    room, used, reset, past = found
    lim = _num(r, short + "l")
    want = need if lim is None else min(need, lim)
    if room - used >= want:
        return now
    return now + AFTER_RESET if past else reset


def ready_at(r: Record, now: float, cost: float) -> float:
    """When this key has room for one request of `cost` tokens (`now`: it has now)."""
    if not r:
        return now
    res = _reservations(r, now)
    a = _limit_ready(r, now, "rq", 1.0, res)
    b = _limit_ready(r, now, "tk", max(cost, 0.0), res)
    return a if a > b else b


def why_empty(r: Record, now: float, cost: float) -> str:
    """Which limit has no room and when it resets (safe words: numbers only)."""
    res = _reservations(r, now)
    parts = []
    for short, what, need in (("rq", "requests", 1.0), ("tk", "tokens", max(cost, 0.0))):
        at = _limit_ready(r, now, short, need, res)
        if at > now:
            rem = _num(r, short)
            lim = _num(r, short + "l")
            of = f" of {lim:.0f}" if lim is not None else ""
            found = _room(r, now, short, res)
            if found is None or found[1] <= 0:
                left = f"{rem:.0f}{of} left"
            elif found[3]:  # past its reset: the whole limit, less what went out since
                left = f"all{of[3:]} since its reset taken by attempts in flight"
            else:  # what was said is taken by attempts sent since
                left = f"{rem:.0f}{of} left, {found[1]:.0f} taken since by attempts in flight"
            named = _reset(r, short)[1]
            when = f"resets in {at - now:.2f}s" + ("" if named else " (no reset said)")
            parts.append(f"{what} {left}, {when}")
    return "; ".join(parts) or "headroom"


def reserve(r: Record, now: float, rid: str, cost: float, expires: float) -> Record | None:
    """Take one request and `cost` tokens as reservation `rid` (None: no room now)."""
    if ready_at(r, now, cost) > now:
        return None
    res = _reservations(r, now)
    res[rid] = [max(cost, 0.0), now, expires]
    out: dict[str, Any] = {**r, "res": res}
    return out


def release(r: Record, now: float, rid: str) -> Record:
    """Reservation `rid` ends (expired ones go with it)."""
    res = _reservations(r, now)
    if rid not in res and "res" not in r:
        return r
    res.pop(rid, None)
    out: dict[str, Any] = dict(r)
    if res:
        out["res"] = res
    else:
        out.pop("res", None)
    return out


def reserved(r: Record, now: float) -> dict[str, list[float]]:
    """The live reservations: id -> [tokens, made, expires]."""
    return _reservations(r, now)


def shifted(r: Record, shift: float) -> Record:
    """The record in another clock (`shift` added to every time), malformed fields
    dropped."""
    out: dict[str, Any] = {}
    for f in ("rq", "rql", "tk", "tkl"):
        v = _num(r, f)
        if v is not None and v >= 0:
            out[f] = v
    for f in _TIMES:
        v = _num(r, f)
        if v is not None:
            out[f] = v + shift
    res = _reservations(r, -math.inf)
    if res:
        out["res"] = {k: [v[0], v[1] + shift, v[2] + shift] for k, v in res.items()}
    return out


def _left(at: float | None, now: float, horizon: float) -> float | None:
    if at is None:
        return None
    if at <= now:
        return 0.0
    return round(at - now, 6) if at - now <= horizon else math.inf


def identity(r: Record, now: float, horizon: float = math.inf) -> tuple[Any, ...]:
    """The record as far as what it decides from `now` on can tell (the model checker's
    key): each limit's remaining count (only while its reset is ahead: past it, the
    whole limit counts), seconds to its reset (inf beyond `horizon`) and the limit; the
    live reservations as (tokens, age, seconds left), with the age of what was said."""
    out: list[Any] = []
    for short in ("rq", "tk"):
        rem, lim = _num(r, short), _num(r, short + "l")
        left = _left(_reset(r, short)[0] if rem is not None else None, now, horizon)
        out.append((None if left == 0.0 else rem, left, lim))
    res = _reservations(r, now)
    if res:
        said = _num(r, "said")
        out.append(None if said is None else round(now - said, 6))
        out.append(
            tuple(
                sorted(
                    (v[0], round(now - v[1], 6), _left(v[2], now, horizon)) for v in res.values()
                )
            )
        )
    return tuple(out)


def inert(r: Record, now: float) -> bool:
    """Whether a record can no longer hold any attempt back (as if nothing were said): no
    live reservation, and every limit it speaks of past its reset (then whole: `ready_at`
    is `now` for any cost)."""
    if _reservations(r, now):
        return False
    for short in ("rq", "tk"):
        if _num(r, short) is not None and _reset(r, short)[0] > now:
            return False
    return True


def identities(
    records: Mapping[Any, Record], keys: Iterable[Any], now: float, horizon: float
) -> tuple[Any, ...] | None:
    """`identity` of the records of `keys` (by position) that are not `inert`, as one
    entry of a store's key (an inert record keys as no record)."""
    got = tuple(
        (i, identity(records[k], now, horizon))
        for i, k in enumerate(keys)
        if k in records and not inert(records[k], now)
    )
    return ("headroom", got, len(got)) if got else None
