"""How a policy's fields are checked: the limits, the per-field problems, and `Problems`.

Every attrs class of the policy (`fsm.policy.credentials`, `fsm.policy.targets`,
`fsm.policy.model`) and the loader of plain data (`fsm.policy.loading`) report through
`Problems`, so one
`PolicyError` names every bad field at once and never echoes a key: a value in a
field meant for a key, or one that looks like a key anywhere, is described, not
shown.
"""

from __future__ import annotations

import contextvars
import math
import re
import unicodedata
import urllib.parse
from collections.abc import Iterable

import attrs

from ..errors import PolicyError, Problem
from ..kinds import DEFAULT_RULES, FAULT_KINDS, TRAITS, OutcomeKind, Rule
from ..redact import MASK, looks_like_key, redact

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: "$" would let "A\n" through

#: The longest duration a policy may give (deadline, attempt_timeout, backoff,
#: cooldown, retry_after_cap): one day, the longest Retry-After fallgate honours.
#: Far longer ones overflow the OS's timers (a sync attempt of 1e10 s failed with
#: "timestamp out of range").
MAX_SECONDS = 86_400.0
#: The largest context_length (tokens): far above any model's window.
MAX_CONTEXT = 1_000_000_000
#: Characters no name may hold: controls (newline, NUL, ...), format characters
#: (bidi overrides, zero-width), line and paragraph separators, surrogates. A name
#: shows in traces, logs, errors and diagrams, where such a character breaks the
#: line or the Mermaid/DOT source, or hides what the name says.
_UNSEEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def name_problem(value: object) -> str | None:
    """Why `value` is no good as a name (provider, model, credential id), or None."""
    if not isinstance(value, str) or not value.strip():
        return "must be a non-empty string"
    for i, c in enumerate(value):
        if unicodedata.category(c) in _UNSEEN:
            return f"must not hold control characters (found {c!r} at position {i})"
    return None


def url_problem(value: object) -> str | None:
    """Why `value` is no good as a base_url (an http:// or https:// URL), or None."""
    want = "must be an http:// or https:// URL"
    if not isinstance(value, str):
        return want
    for i, c in enumerate(value):
        if c.isspace() or unicodedata.category(c) in _UNSEEN:
            what = "a space" if c == " " else repr(c)
            return f"{want} (found {what} at position {i})"
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 - raises on a port that is not a number in 0..65535
    except ValueError as e:
        return f"{want} ({e})"
    if parts.scheme.lower() not in ("http", "https"):
        return want
    if not parts.hostname:
        return f"{want} with a host"
    return None


_SEGMENTS = re.compile(r"(\.|\[\d+\])")


def redact_path(path: str, secrets: Iterable[str]) -> str:
    """`path` with a key typed as a field's name masked: a key of at least 8 characters
    wherever it stands (whole or in pieces), a shorter one only as a whole segment, so a
    short key inside a field's own name ("prov" in ``fallback_providers``) leaves it
    readable."""
    known = [s for s in secrets if isinstance(s, str)]
    path = redact(path, [s for s in known if len(s) >= 8])
    short = {s for s in known if len(s) < 8}
    if not short:
        return path
    return "".join(MASK if part in short else part for part in _SEGMENTS.split(path))


class Problems:
    """Collects problems under a path prefix; raises them together."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.items: list[Problem] = []

    def add(self, field: str, value: object, message: str, secret: bool = False) -> None:
        path = (
            f"{self.prefix}{field}"
            if field.startswith("[") or not self.prefix
            else (f"{self.prefix}.{field}")
        )
        secrets = KNOWN_SECRETS.get()
        path = redact_path(path, secrets)  # a key pasted as a field name is not echoed
        message = redact(message, secrets) if secrets else message
        if secret or _KEY_FIELD.search(path):
            # A field meant for a key (or its variable's name) is never echoed: a key
            # typed into it by mistake would be printed.
            shown = _hidden(value)
            if isinstance(value, str) and looks_like_key(value) and not secret:
                message += (
                    "; the value looks like an API key: put the key in an environment "
                    "variable and give its name here"
                )
        else:
            shown = short_repr(value)
            if isinstance(value, str) and looks_like_key(value):
                message += " (the value looks like an API key; it is not shown)"
        # A message may quote the value (a URL parser's complaint): masked too.
        self.items.append(Problem(path or "<policy>", shown, redact(message)))

    def extend(self, sub: PolicyError, field: str) -> None:
        for p in sub.problems:
            base = f"{self.prefix}.{field}" if self.prefix else field
            path = f"{base}.{p.path}" if not p.path.startswith("[") else f"{base}{p.path}"
            self.items.append(attrs.evolve(p, path=redact(path)))

    def raise_if_any(self) -> None:
        if self.items:
            raise PolicyError(self.items)


def env_name_ok(name: object) -> bool:
    """An environment variable's name, and not a key that happens to be shaped like one
    (``gsk_...``, ``AIza...``)."""
    return isinstance(name, str) and bool(_ENV_NAME.fullmatch(name)) and not looks_like_key(name)


#: Fields that hold a key or the name of the variable that holds one.
_KEY_FIELD = re.compile(r"(?:^|\.)(?:key_envs?|api_keys?|credentials?)(?:\[\d+\])?$")


def short_repr(value: object) -> str:
    """The value as a problem shows it: short, and with anything key-shaped masked."""
    if value is MISSING:
        return ""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**60:
        # repr of an int of more than 4,300 digits raises: say its size instead
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    text = redact(repr(value), KNOWN_SECRETS.get())
    return text if len(text) <= 60 else text[:57] + "..."


def _hidden(value: object) -> str:
    """A value of a key field, described without being shown."""
    if value is MISSING:
        return ""
    if isinstance(value, str):
        return f"*** ({len(value)} characters, not shown)"
    kind = type(value).__name__
    return f"*** ({'an' if kind[:1] in 'aeiou' else 'a'} {kind}, not shown)"


MISSING = object()


def key_text_problem(key: str) -> str | None:
    """Why a literal key cannot be sent as is (None when it can): a newline or blank at
    either end (pasted with it) or a control character would make every attempt fail as
    a transport fault, retried like a down server."""
    if key != key.strip():
        return "has a blank or a newline at its start or end (copied with the key?): remove it"
    if any(not c.isprintable() for c in key):
        return "holds a control character (a key is printable text): check what was pasted"
    return None


#: The keys of the policy being loaded (`fsm.policy.loading` sets it): masked wherever a
#: problem would show them, a key typed into the wrong field included.
KNOWN_SECRETS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "fallgate_policy_secrets", default=()
)


def is_number(v: object) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and math.isfinite(v))  # no int overflows


def is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_MAX_MULTIPLIER = 1000


def check_growth(ps: Problems, initial: float, multiplier: float, cap: float) -> None:
    """initial * multiplier**n, capped: the shape Backoff and Cooldown share."""
    n = len(ps.items)
    check_seconds(ps, "initial", initial)
    if not is_number(multiplier) or not 1 <= multiplier <= _MAX_MULTIPLIER:
        ps.add("multiplier", multiplier, f"must be a finite number from 1 to {_MAX_MULTIPLIER}")
    check_seconds(ps, "cap", cap)
    if len(ps.items) == n and cap < initial:
        ps.add("cap", cap, f"must be >= initial ({initial})")


#: The shortest time bound a policy may set (seconds): below it no request can be made
#: (``deadline = 1e-300`` was accepted, then every turn failed).
MIN_BOUND = 0.01


def check_seconds(ps: Problems, name: str, v: object, positive: bool = False) -> None:
    if not is_number(v) or v < 0 or (positive and v == 0):  # type: ignore[operator]
        ps.add(name, v, f"must be a finite number of seconds {'> 0' if positive else '>= 0'}")
    elif v > MAX_SECONDS:  # type: ignore[operator]
        ps.add(name, v, f"must be at most {MAX_SECONDS:g} seconds (one day)")
    elif positive and v < MIN_BOUND:  # type: ignore[operator]
        ps.add(
            name,
            v,
            f"must be at least {MIN_BOUND:g} seconds: shorter than any request can take, "
            "so every turn would fail",
        )


#: The `Policy.reserve` that keeps one attempt of the next eligible target (the default).
ONE_ATTEMPT = "one_attempt"


def check_reserve(ps: Problems, v: object) -> None:
    """`reserve`: "one_attempt", a number of seconds, or false (no reserve)."""
    if v is False or (isinstance(v, str) and v == ONE_ATTEMPT):
        return
    if is_number(v):
        check_seconds(ps, "reserve", v)
    else:
        ps.add("reserve", v, f'must be "{ONE_ATTEMPT}", a number of seconds >= 0, or false')


_RULE_FIELDS = tuple(f.name for f in attrs.fields(Rule))


def check_rule(ps: Problems, kind: object, rule: object) -> None:
    if not isinstance(kind, OutcomeKind) or kind not in DEFAULT_RULES:
        choices = ", ".join(k.value for k in FAULT_KINDS)
        ps.add(f"rules.{kind}", MISSING, f"unknown outcome class (choose from {choices})")
        return
    if not isinstance(rule, Rule):
        ps.add(f"rules.{kind.value}", rule, "must be a Rule")
        return
    path = f"rules.{kind.value}"
    for f in _RULE_FIELDS:
        if not isinstance(getattr(rule, f), bool):
            ps.add(f"{path}.{f}", getattr(rule, f), "must be true or false")
    traits = TRAITS[kind]
    if rule.retry and not traits.may_retry:
        retryable = ", ".join(k.value for k in FAULT_KINDS if TRAITS[k].may_retry)
        ps.add(
            f"{path}.retry",
            True,
            f"{kind.value} is never retried on the same target and credential "
            f"(only {retryable} are retryable)",
        )
    if rule.rotate and not traits.may_rotate:
        rotatable = ", ".join(k.value for k in FAULT_KINDS if TRAITS[k].may_rotate)
        ps.add(
            f"{path}.rotate",
            True,
            f"{kind.value} is not the key's fault; only {rotatable} rotate credentials",
        )
    if rule.fall_back and not traits.may_fall_back:
        ps.add(f"{path}.fall_back", True, "a committed stream is never replayed on another target")
