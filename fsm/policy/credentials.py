"""A target's keys: `Secret`, which never shows itself, and `Credential`, one key of a pool.

A key is either literal or read from an environment variable at use time; what
traces, logs and the health store see is the credential's id and a fingerprint,
never the key.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import attrs

from ..errors import MissingCredential
from .checks import MISSING, Problems, env_name_ok, key_text_problem, name_problem


@attrs.frozen(slots=True, repr=False)
class Secret:
    """A key that never shows itself in repr, str, logs or diagrams."""

    _value: str = attrs.field(alias="value")

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """Pretty-printers (IPython, Hypothesis) walk attrs fields: show *** there too."""
        p.text(repr(self))


@attrs.frozen(slots=True)
class Credential:
    """One API key of a target's pool: a literal key or an env var read at use time.

    `id` is the safe name that traces and logs show (``env:NAME`` or
    ``key#N``); the key itself only leaves through `resolve()`.
    """

    id: str
    env: str | None = None
    key: Secret | None = None
    #: The id health is shared under across processes: ``env:NAME`` for a key read from
    #: the environment, a fingerprint of a literal key (``key:`` + 16 hex digits of a
    #: salted SHA-256: the same key gets the same id in every process, and the id says
    #: nothing of the key), else the id.
    health_id: str = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        ps = Problems()
        bad_id = name_problem(self.id)
        if bad_id:
            ps.add("id", self.id, bad_id)
        if (self.env is None) == (self.key is None):
            ps.add("credential", MISSING, "give exactly one of key_env or api_key")
        if self.env is not None and not env_name_ok(self.env):
            ps.add("key_env", self.env, "must be an environment variable name")
        if self.key is not None and (
            not isinstance(self.key, Secret)
            or not isinstance(self.key.reveal(), str)
            or not self.key.reveal().strip()
        ):
            ps.add("api_key", self.key, "must be a non-empty string", secret=True)
        elif self.key is not None and (why := key_text_problem(self.key.reveal())) is not None:
            ps.add("api_key", self.key, why, secret=True)
        ps.raise_if_any()
        hid = self.id
        if self.key is not None and self.id != "none":
            digest = hashlib.sha256(b"fallgate-credential\0" + self.key.reveal().encode())
            hid = f"key:{digest.hexdigest()[:16]}"
        elif self.env is not None:
            hid = f"env:{self.env}"
        object.__setattr__(self, "health_id", hid)

    def resolve(self, target: str = "?") -> str:
        """The key, read now (env vars are read at use time, never cached)."""
        if self.key is not None:
            return self.key.reveal()
        assert self.env is not None
        value = os.environ.get(self.env, "")
        if not value.strip():
            raise MissingCredential(self.env, target)
        why = key_text_problem(value)
        if why is not None:  # never sent: it would fail every attempt as a transport fault
            raise MissingCredential(self.env, target, f"holds a key that {why}")
        return value

    @classmethod
    def from_env(cls, name: str) -> Credential:
        return cls(id=f"env:{name}", env=name)

    @classmethod
    def literal(cls, key: str, n: int = 1) -> Credential:
        return cls(id=f"key#{n}", key=Secret(key))


#: What a keyless target sends as its key: never empty (an empty key would let
#: the SDK look for one in its own environment variables).
KEYLESS_PLACEHOLDER = "no-key"
ANONYMOUS = Credential(id="none", key=Secret(KEYLESS_PLACEHOLDER))
