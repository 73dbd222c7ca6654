"""The policy under check and the facts derived from it once, before the search.

Everything here is fixed for a whole check: the properties and the oracle read it
through every transition record, so it is computed once rather than per event.
"""

from __future__ import annotations

import re
from typing import Final

import attrs

from ..core.guards import VERDICT_WAITS
from ..core.machine import Declaration
from ..policy.model import Credential, Policy, Secret

#: The prefix of the literal key every credential holds during a check.
CANARY: Final = "sk-live-CHECK"

TargetKey = tuple[str, str]


def default_policy() -> Policy:
    """The default policy (primary + 3 fallbacks, 2 keys each, 3 attempts)."""
    from ..policy.defaults import default_policy as _default

    return _default()


def with_canaries(policy: Policy) -> Policy:
    """`policy` with every credential holding a literal canary key (same ids).

    The engine never reads key values, so behaviour is unchanged; the secrets
    property then scans every trace, action, repr and error for the canaries.
    """
    targets = []
    for t in policy.targets:
        creds = tuple(
            c
            if c.key is not None
            else Credential(id=c.id, key=Secret(f"{CANARY}-{t.index}-{n}-7f3a9c"))
            for n, c in enumerate(t.credentials)
        )
        targets.append(attrs.evolve(t, credentials=creds))
    return attrs.evolve(policy, targets=tuple(targets))


@attrs.frozen
class Bounds:
    """Limits computed from the policy (how long a turn may run, how long it may wait)
    and the Retry-After values of the checker's alphabet."""

    per_target: tuple[int, ...]  # attempts on one target in one turn
    attempts: int  # attempts in one turn
    events: int  # events in one turn
    wait: float  # total waiting in one turn (the deadline)
    single_wait: float  # the longest single wait
    small: float | None  # a Retry-After below the cap (None when the cap is 0)
    large: float  # a Retry-After above the cap

    @classmethod
    def of(cls, p: Policy) -> Bounds:
        """Attempts per target: max_attempts, plus one per extra key (a rotation is an
        attempt), plus one after a transport recovery, plus one after each wait for the
        breaker's verdict."""
        per = tuple(
            p.max_attempts + (len(t.pool()) - 1) + (1 if p.recover_transport else 0) + VERDICT_WAITS
            for t in p.targets
        )
        cap = p.retry_after_cap
        return cls(
            per_target=per,
            attempts=sum(per),
            events=2 * sum(per) + 2,
            wait=p.deadline,
            single_wait=max(cap, p.backoff.cap),
            small=round(cap / 4, 6) if cap > 0 else None,
            large=round(2 * cap + 1, 6),
        )


@attrs.frozen(eq=False)
class Context:
    """What the properties and the oracle judge a transition against."""

    policy: Policy  # with canary keys
    decl: Declaration
    bounds: Bounds
    n: int
    names: tuple[str, ...]
    name_set: frozenset[str]
    keys: tuple[TargetKey, ...]
    pools: tuple[tuple[Credential, ...], ...]
    triples: frozenset[tuple[str, str, str]]  # every declared (source, trigger, dest)
    state_names: frozenset[str]
    leak: re.Pattern[str]  # any secret of the policy, or a canary
    # the same, less those holding another (every canary key holds CANARY): a text has
    # one of these when it has any secret (`in` is 4x a search, and this runs per transition)
    secrets: tuple[str, ...]
    # no secret has a character `repr` escapes (nor a quote): a key in a repr is then in
    # the string it was made from, and reprs need no scan of their own
    plain: bool
    # per target j: j and the targets identical to it (a turn that tried one skips j)
    twins: tuple[frozenset[int], ...]
    # ids of targets and credentials whose repr was already scanned for secrets: a memo
    # (a repr does not change), never a verdict
    scanned: set[int] = attrs.field(factory=set)

    def health_id(self, j: int, cid: str) -> str:
        """The health id of credential `cid` of target `j` (what the health store keys)."""
        for c in self.pools[j]:
            if c.id == cid:
                return c.health_id
        return cid

    @classmethod
    def of(cls, policy: Policy, decl: Declaration, bounds: Bounds) -> Context:
        targets = policy.targets
        secrets = sorted({*policy.secrets(), CANARY}, key=len, reverse=True)
        return cls(
            policy=policy,
            decl=decl,
            bounds=bounds,
            n=len(targets),
            names=tuple(t.name for t in targets),
            name_set=frozenset(t.name for t in targets),
            keys=tuple(t.key for t in targets),
            pools=tuple(tuple(t.pool()) for t in targets),
            triples=frozenset((t.source, t.trigger, t.dest) for t in decl.edges()),
            state_names=frozenset(st.name for st in decl.states),
            leak=re.compile("|".join(re.escape(s) for s in secrets)),
            secrets=tuple(s for s in secrets if not any(t != s and t in s for t in secrets)),
            plain=all(repr(x)[1:-1] == x and "'" not in x and '"' not in x for x in secrets),
            twins=tuple(
                frozenset({j} | {k for k, u in enumerate(targets) if u.same_as(t)})
                for j, t in enumerate(targets)
            ),
        )
