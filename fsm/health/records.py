"""Fleet health records: what one backend (base_url + model) and one key have shown, and how
each report changes it. One home for these rules: the in-memory `HealthStore`, the local
replica of a `SharedHealthStore` and every shared backend (SQLite, Redis) apply the same
pure functions, so they cannot disagree.

A record is a flat JSON-able ``dict`` (the `fsm.health.backend.Record` shape). Its times are in the
clock of whoever holds it: the turn clock in a process, the backend's clock in a shared
store (`SharedHealthStore` converts through "seconds left", so hosts whose clocks disagree
still agree on how long a cooldown has to run).

Target record (key ``t|<base_url>|<model>``)::

    until   float  end of the open (benched) span; 0 when closed
    opens   int    consecutive openings: the open span grows with it (the policy's
                   `cooldown`, exponential, capped at ``breaker.max_open``); 0 once a
                   probe succeeds
    fails   int    hard failures in the current failure window (closed breaker)
    since   float  start of that window
    lease   float  end of the half-open probe lease; 0 when no probe is out
    owner   str    who holds the lease (a turn id, never a secret)
    tokens  float  retry budget left (absent: a full bucket)
    rr      int    round-robin cursor of the credential pool (absent: never used)

Credential record (key ``c|<base_url>|<model>|<credential id>``)::

    until   float  end of the key's cooldown

The breaker: closed; a turn leaving the target with a hard failure (an outcome whose rule
cools) counts one failure, and more than ``breaker.allowed_failures`` of them within
``breaker.window`` seconds open it (a Retry-After from the server opens it at once, for that
long up to ``cooldown.cap``); open until ``until``; then half-open: exactly one turn at a
time may probe it, holding the lease (it expires, so a crashed prober does not keep it); the
probe's success closes the breaker, its hard failure reopens it for a longer span (up to
``breaker.max_open``: a backend that stays down is probed that often); any other
outcome of the probe just gives the lease back.

The retry budget: a token bucket per target. First attempts are free; a retry (another
attempt on the same target in the same turn after a wait, a recovery or a stream
continuation) takes one token; a success puts ``retry_budget.refill`` back, up to
``retry_budget.size``. An empty bucket means no retry on this target now.
"""

from __future__ import annotations

import functools
from typing import Final
from urllib.parse import quote, unquote

from ..policy.backoff import breaker_span
from ..policy.model import Policy, Target
from .backend import Record

__all__ = [
    "CLOSED",
    "TIMES",
    "credential_key",
    "fail",
    "is_half_open",
    "keys_of",
    "parse_key",
    "probe_free",
    "release",
    "succeed",
    "target_key",
]

#: The target record of a backend nothing has been reported about.
CLOSED: Final[Record] = {}


# -- keys ------------------------------------------------------------------------------------------


def _part(text: str) -> str:
    return quote(text, safe=":/@")


def target_key(key: tuple[str, str]) -> str:
    """The shared key of the backend a target reaches (`Target.key`: its base_url and
    model, not the provider name, so aliases of one backend share their health)."""
    return f"t|{_part(key[0])}|{_part(key[1])}"


def credential_key(key: tuple[str, str], health_id: str) -> str:
    """The shared key of one credential of one backend (by `Credential.health_id`:
    ``env:NAME`` or a fingerprint of a literal key, never the key)."""
    return f"c|{_part(key[0])}|{_part(key[1])}|{_part(health_id)}"


@functools.lru_cache(maxsize=4096)  # a shared store parses its chain's keys on every pull
def parse_key(key: str) -> tuple[tuple[str, str], str | None] | None:
    """(`Target.key`, credential health id or None) of a shared key; None if not ours."""
    parts = key.split("|")
    if parts[0] == "t" and len(parts) == 3:
        return (unquote(parts[1]), unquote(parts[2])), None
    if parts[0] == "c" and len(parts) == 4:
        return (unquote(parts[1]), unquote(parts[2])), unquote(parts[3])
    return None


def keys_of(t: Target) -> tuple[str, ...]:
    """The shared keys of target `t` and of its credentials."""
    return (target_key(t.key), *(credential_key(t.key, c.health_id) for c in t.pool()))


#: The fields of a record that hold a time (converted between clocks on exchange).
TIMES: Final = ("until", "since", "lease")


# -- reading a target record ----------------------------------------------------------------------


#: What a record's number may be (a constant: `isinstance(v, int | float)` builds the union
#: on every call, and these run several times per transition of the checker).
NUMBER: Final = (int, float)


def num(r: Record, field: str, default: float = 0.0) -> float:
    v = r.get(field)
    return float(v) if isinstance(v, NUMBER) else default


def count(r: Record, field: str) -> int:
    v = r.get(field)
    return int(v) if isinstance(v, NUMBER) else 0


def is_half_open(r: Record, now: float) -> bool:
    """Opened, and its open span is over: the next attempt on it is a probe."""
    return count(r, "opens") > 0 and num(r, "until") <= now


def probe_free(r: Record, now: float, owner: str) -> bool:
    """No other turn holds an unexpired probe lease."""
    return num(r, "lease") <= now or r.get("owner") == owner


def tokens(r: Record, size: float) -> float:
    return num(r, "tokens", size)


# -- reports (pure: a new record from the old one) ----------------------------------------------


def fail(
    r: Record,
    now: float,
    policy: Policy,
    retry_after: float | None,
    owner: str,
    at_once: bool = False,
) -> Record:
    """A turn left the target with a hard failure.

    A running open span is never extended (reports from turns already in flight when it
    opened change nothing). The probe owner's failure reopens the breaker for a longer span;
    a Retry-After opens it for that long (at most ``cooldown.cap``), and a failure that is
    enough on its own (`at_once`: a model not found) for the first span; otherwise the
    failure is counted, and the breaker opens once more than ``allowed_failures`` fall
    within ``window``."""
    out = dict(r)
    until = num(r, "until")
    opens = count(r, "opens")
    if until > now:
        return r
    b = policy.breaker
    if opens > 0:  # half-open: only the prober's verdict counts
        if r.get("owner") != owner or num(r, "lease") <= 0:
            return r
        return _open(out, now, policy, opens + 1, retry_after)
    if retry_after is not None or at_once:
        return _open(out, now, policy, 1, retry_after)
    since = num(r, "since")
    fails = count(r, "fails")
    if fails == 0 or now - since > b.window:
        fails, since = 0, now
    fails += 1
    if fails > b.allowed_failures:
        return _open(out, now, policy, 1, None)
    out["fails"] = fails
    out["since"] = since
    return out


def _open(out: Record, now: float, policy: Policy, opens: int, retry_after: float | None) -> Record:
    # A Retry-After opens the breaker for that long, but no longer than the cooldown's
    # cap: past it the next attempt is a probe (one 503 saying "Retry-After: 99999999999"
    # must not bench a backend for a day with no probe); a probe that is told the same
    # again reopens it for the cap.
    span = (
        min(retry_after, policy.cooldown.cap)
        if retry_after is not None
        else breaker_span(policy.cooldown, policy.breaker, opens)
    )
    out["until"] = now + span
    out["opens"] = opens
    out["fails"] = 0
    out["since"] = 0.0
    out["lease"] = 0.0
    out["owner"] = ""
    return out


def succeed(r: Record, policy: Policy) -> Record:
    """A success closes the breaker (whoever made it: the backend answers) and refills the
    retry budget."""
    out = dict(r)
    for f in ("until", "opens", "fails", "since", "lease", "owner"):
        out.pop(f, None)
    rb = policy.retry_budget
    if "tokens" in out:
        t = num(out, "tokens") + rb.refill
        if t >= rb.size:
            del out["tokens"]
        else:
            out["tokens"] = _tokens(t)
    return out


def _tokens(n: float) -> float:
    """A token count as kept: rounded to 9 places (fractional refills add up with float
    error); a whole count, the usual one, as it is (`round` would cost a grant a third of
    its time, and gives a whole number back unchanged)."""
    return n if n.is_integer() else round(n, 9)


def release(r: Record, owner: str) -> Record:
    """The probe ended neither way (a key's fault, a transport fault, a cancellation):
    give the lease back, the breaker stays half-open."""
    if r.get("owner") != owner:
        return r
    out = dict(r)
    out["lease"] = 0.0
    out["owner"] = ""
    return out


#: How much longer than an attempt's timeout a probe lease lasts (the prober's report).
LEASE_GRACE: Final = 1.0


def lease_for(policy: Policy) -> float:
    """A probe lease lasts one attempt timeout (a probe cannot be in flight longer) and
    `LEASE_GRACE`; then another turn may probe (the prober crashed)."""
    return policy.attempt_timeout + LEASE_GRACE


def acquire(r: Record, now: float, owner: str, lease: float) -> Record | None:
    """Take (or renew) the probe lease; None when another turn holds it or the breaker
    is open again (a probe that failed meanwhile). A breaker closed meanwhile needs no
    probe: the attempt goes out as any other."""
    if count(r, "opens") == 0:
        return r
    if num(r, "until") > now or not probe_free(r, now, owner):
        return None
    out = dict(r)
    out["lease"] = now + lease
    out["owner"] = owner
    return out


def spend(r: Record, policy: Policy) -> Record | None:
    """Take one retry token; None when the bucket is empty."""
    rb = policy.retry_budget
    if not rb.enabled:
        return r
    left: float = r.get("tokens", rb.size)  # type: ignore[assignment]
    if left < 1.0:
        return None
    out = dict(r)
    out["tokens"] = _tokens(left - 1.0)
    return out


def advance(r: Record) -> tuple[Record, int]:
    """Advance the round-robin cursor; returns the record and the new position."""
    n = count(r, "rr") + 1 if "rr" in r else 0
    out = dict(r)
    out["rr"] = n
    return out, n


def cool(r: Record, now: float, until: float) -> Record:
    """Bench a credential until `until` unless it is benched already (never extended)."""
    if num(r, "until") > now:
        return r
    return {"until": until}
