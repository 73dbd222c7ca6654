"""Initial configurations: the health facts a checked turn can start from.

Each is a list of setup steps (targets or keys cooling, for a short or a long time)
fed to a fresh health store before the first turn; together they cover how a turn
can find the chain: all free, the primary (or one key of it) cooling briefly, any
one target cooling for good (pairs with `max_cooling=2`), runs of targets cooling
for good (the turn starts further down the chain, or a target has no eligible
fallback left), everything cooling, and each target the soonest free (not the first).
A cooling target has its breaker open: once its span is over it is half-open, and the
turn's attempt on it is a probe.

With pacing on, also the headroom the providers' replies spoke of (`fsm.checker.pacing`),
seen between the primary and its first fallback (the targets after those cooling for
good): every key of the primary out of headroom until a reset within the Retry-After
cap, and until one beyond the search; every key
of every target out of it beyond the search (the turn fails at once, saying which limit);
every key of the primary with one request of headroom (each attempt reserves it; a grant
may be refused for it), and each target's, the other targets cooling for good (so that
a refusal there has no fallback left: the turn waits for a key's reset). With
`max_cooling=0`, only every key of every target out of headroom for good.
"""

from __future__ import annotations

from ..policy.model import Policy
from ..policy.targets import Target
from .context import Bounds
from .pacing import NO_HEADROOM, brief_reset
from .steps import COOL_CREDENTIAL, COOL_TARGET, Step, step


def initial_configurations(
    policy: Policy, bounds: Bounds, max_cooling: int
) -> list[tuple[Step, ...]]:
    """The setups, without repeats, the empty one (all free) first."""
    b = bounds
    short = b.small if b.small is not None else 1.0
    targets = policy.targets
    n = len(targets)
    per: list[list[tuple[Step, ...]]] = []
    for t in targets:
        pool = t.pool()
        opts: list[tuple[Step, ...]] = [
            (step(COOL_TARGET, target=t.name, seconds=b.large),),
        ]
        if t.index == 0:  # the primary: also a key cooling, and cooling briefly
            opts.append((step(COOL_TARGET, target=t.name, seconds=short),))
            if len(pool) > 1:
                cool_key = step(
                    COOL_CREDENTIAL, target=t.name, credential=pool[0].id, seconds=short
                )
                opts.append((cool_key,))
        per.append(opts)
    configs: list[tuple[Step, ...]] = [()]
    if max_cooling >= 1:
        for opts in per:
            configs += opts
    if max_cooling >= 2:
        for i in range(n):
            for j in range(i + 1, n):
                configs += [a + c for a in per[i] for c in per[j]]
    if n > 1 or max_cooling < 1:
        for secs in (short, b.large):
            configs.append(tuple(step(COOL_TARGET, target=t.name, seconds=secs) for t in targets))
    names = [t.name for t in targets] if max_cooling >= 1 else []

    def cooling(run: list[str]) -> tuple[Step, ...]:
        return tuple(step(COOL_TARGET, target=x, seconds=b.large) for x in run)

    configs += [cooling(names[: k + 1]) for k in range(1, len(names) - 1)]
    configs += [cooling(names[k:]) for k in range(1, len(names))]
    configs += [cooling(names[1 : k + 1]) for k in range(2, len(names) - 1)]
    if n > 1:  # the soonest-free target is not the first one: each in turn
        configs.append(
            tuple(
                step(COOL_TARGET, target=t.name, seconds=short if t.index else b.large)
                for t in targets
            )
        )
        for k in range(2, n):
            configs.append(
                tuple(
                    step(COOL_TARGET, target=t.name, seconds=short if t.index == k else b.large)
                    for t in targets
                )
            )
    if policy.pacing:
        configs += paced_configurations(policy, short, b.large, max_cooling)
    return list(dict.fromkeys(configs))


def paced_configurations(
    policy: Policy, short: float, large: float, max_cooling: int = 1
) -> list[tuple[Step, ...]]:
    """The headroom setups of a policy with pacing on (see the module's docstring); with
    `max_cooling` 0, only every key out of headroom for good (as every target cooling)."""

    def said(
        targets: list[Target], left: int, seconds: float, keys: int = 1000
    ) -> tuple[Step, ...]:
        return tuple(
            step(NO_HEADROOM, target=t.name, credential=c.id, left=left, seconds=seconds)
            for t in targets
            for c in t.pool()[:keys]
        )

    first, every = [policy.targets[0]], list(policy.targets)

    def cool(ts: list[Target]) -> tuple[Step, ...]:
        return tuple(step(COOL_TARGET, target=t.name, seconds=large) for t in ts)

    # the primary and its first fallback (the ones after it cooling for good: what pacing
    # adds to the chain is seen between two targets)
    # resets `brief` away: before the turn's first backoff ends (the waits for them are
    # seen, and the rest of the turn merges with the turns that had no headroom to read)
    brief = brief_reset(policy, short)
    if max_cooling < 1:
        return [said(every, 0, large)]
    rest = cool(every[2:])
    configs = [said(first, 0, brief) + rest, said(first, 0, large) + rest]
    if len(every) > 1:
        configs.append(said(every, 0, large))
    configs.append(said(first, 1, brief, 1) + rest)
    if len(every) > 1:  # the last target alone with a request of headroom
        configs.append(cool(every[:-1]) + said(every[-1:], 1, brief, 1))
    return configs
