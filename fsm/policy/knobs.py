"""The policy's knobs: backoff, cooldown, breaker and retry budget, and the chain's limit.

Frozen attrs classes, validated at construction (each names its bad fields in one
`PolicyError`). They sit below `fsm.policy.model` so that the loader
(`fsm.policy.loading`) builds them without importing the policy it builds.
"""

from __future__ import annotations

import attrs

from .checks import Problems, check_growth, check_seconds, is_int, is_number

__all__ = ["MAX_TARGETS", "Backoff", "Breaker", "Cooldown", "RetryBudget", "chain_too_long"]

#: The longest chain: the primary and 99 fallbacks. Far above any real fallback list
#: (a handful); a turn that keeps failing calls every target in turn, and what lists
#: every edge (each target may fall back to every later one) grows with the square of
#: the chain: the full diagram (~1 MB of Mermaid at 100), the `transitions` executor,
#: the model checker. The declaration and the default executor grow linearly.
MAX_TARGETS = 100


@attrs.frozen(slots=True)
class Backoff:
    """Exponential backoff with full jitter: wait = U(0, min(cap, initial * multiplier**n))."""

    initial: float = 0.5
    multiplier: float = 2.0
    cap: float = 8.0
    jitter: bool = True

    def __attrs_post_init__(self) -> None:
        ps = Problems()
        check_growth(ps, self.initial, self.multiplier, self.cap)
        if not isinstance(self.jitter, bool):
            ps.add("jitter", self.jitter, "must be true or false")
        ps.raise_if_any()


@attrs.frozen(slots=True)
class Cooldown:
    """Cross-turn cooldown after a hard failure when no Retry-After says otherwise."""

    initial: float = 5.0
    multiplier: float = 2.0
    cap: float = 300.0

    def __attrs_post_init__(self) -> None:
        ps = Problems()
        check_growth(ps, self.initial, self.multiplier, self.cap)
        ps.raise_if_any()


@attrs.frozen(slots=True)
class Breaker:
    """A circuit breaker per backend, shared through the health store.

    More than `allowed_failures` turns leaving the target with a hard failure within `window`
    seconds open it (for the `cooldown` span, growing with each reopening up to `max_open`);
    a Retry-After from the server opens it at once (for at most ``cooldown.cap``). Once the
    span is over one turn at a time probes it (a lease of one attempt timeout and a second);
    success closes it. The default tolerates two failed turns a minute, so one 503 does not
    move an agent's later turns to another model; and it probes a backend that stays down at
    least every `max_open` seconds (20: 5, 10, 20, 20, ... s), so that a recovered primary
    carries the turns again within `max_open` and one turn's gap of its recovery."""

    allowed_failures: int = 2
    window: float = 60.0
    #: The longest open span the breaker picks by itself (no Retry-After): the span grows
    #: with `cooldown` (5, 10, 20 s, ...) and stays here. The time between probes of a
    #: backend that stays down, and so the most a recovered one waits for its probe.
    max_open: float = 20.0

    def __attrs_post_init__(self) -> None:
        ps = Problems()
        if not is_int(self.allowed_failures) or not 0 <= self.allowed_failures <= 1000:
            ps.add("allowed_failures", self.allowed_failures, "must be an integer 0..1000")
        check_seconds(ps, "window", self.window)
        check_seconds(ps, "max_open", self.max_open)
        ps.raise_if_any()


@attrs.frozen(slots=True)
class RetryBudget:
    """A retry budget per backend (a token bucket, shared through the health store).

    First attempts are free; each retry on the same target takes one token; each success
    puts `refill` back, up to `size`. An empty bucket means no retry on this target now
    (the turn falls back, or fails saying so): while a backend is down, retries stop
    multiplying its traffic."""

    size: float = 10.0
    refill: float = 0.2
    enabled: bool = True

    def __attrs_post_init__(self) -> None:
        ps = Problems()
        if not is_number(self.size) or not 1 <= self.size <= 1e6:
            ps.add("size", self.size, "must be a number of tokens between 1 and 1000000")
        if not is_number(self.refill) or not 0 <= self.refill <= 1e6:
            ps.add("refill", self.refill, "must be a number of tokens >= 0")
        if not isinstance(self.enabled, bool):
            ps.add("enabled", self.enabled, "must be true or false")
        ps.raise_if_any()


def chain_too_long(n: int) -> str:
    """Why a chain of `n` targets is refused (the limit and its reasons)."""
    return (
        f"{n} targets: a chain holds at most {MAX_TARGETS} (the primary and "
        f"{MAX_TARGETS - 1} fallbacks); a failing turn calls each target in turn, and the "
        "diagrams and the model checker grow with the square of the chain"
    )
