"""What a check returns: the properties that broke, each with a shortest counterexample,
and the figures of the search (as text for people, as JSON for tools)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ..core.machine import Transition
from ..policy.model import Policy
from .context import Bounds
from .pacing import NO_HEADROOM
from .properties import PROPERTIES
from .steps import COOL_CREDENTIAL, COOL_TARGET, Step, format_steps, steps_to_json

if TYPE_CHECKING:
    from .untaken import Untaken


def _count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 key``, ``2 keys``: a number and its noun, singular when the number is one."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


@attrs.frozen
class Violation:
    """A broken property and a shortest event sequence that breaks it."""

    prop: str
    why: str
    steps: tuple[Step, ...]

    @property
    def length(self) -> int:
        """Events fed to the machine (setup steps that cool targets or say a key's headroom
        are not counted)."""
        return sum(1 for t, _ in self.steps if t not in (COOL_TARGET, COOL_CREDENTIAL, NO_HEADROOM))

    def python(self) -> str:
        return format_steps(self.steps)


@attrs.frozen
class KeyAuditResult:
    """Merged configurations fed every event to check the key; the first that differed."""

    checked: int = 0
    finding: str | None = None
    steps: tuple[Step, ...] = ()  # reaches one of the two merged configurations


@attrs.frozen
class CheckReport:
    policy: Policy = attrs.field(repr=False)
    states: int
    transitions: int
    seconds: float
    violations: Mapping[str, Violation]
    unreachable: tuple[str, ...]
    initial: int
    turns: int
    complete: bool
    bounds: Bounds
    audit: KeyAuditResult = KeyAuditResult()
    # `unreachable` as findings: why each was not taken (fsm.checker.untaken)
    untaken: tuple[Untaken, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.violations and self.complete and self.audit.finding is None

    def holds(self, prop: str) -> bool:
        if prop not in PROPERTIES:
            raise KeyError(prop)
        return prop not in self.violations

    def to_json(self) -> dict[str, Any]:
        props: dict[str, Any] = {}
        for name in PROPERTIES:
            v = self.violations.get(name)
            props[name] = "holds" if v is None else {"counterexample": steps_to_json(v.steps)}
        return {
            "states": self.states,
            "transitions": self.transitions,
            "seconds": round(self.seconds, 3),
            "properties": props,
            "unreachable": list(self.unreachable),
            "untaken": [u.to_json() for u in self.untaken],
            "key_audit": {"checked": self.audit.checked, "finding": self.audit.finding},
        }

    def text(self) -> str:
        p = self.policy
        rate = self.states / self.seconds if self.seconds > 0 else float("inf")
        chain = " -> ".join(
            f"{t.name} ({t.model}, {_count(len(t.pool()), 'key')})" for t in p.targets
        )
        lines = [
            f"policy: {chain}; max_attempts {p.max_attempts}",
            f"explored {_count(self.states, 'state')}, {_count(self.transitions, 'transition')} "
            f"in {self.seconds:.2f} s ({rate:,.0f} states/s); "
            f"{_count(self.initial, 'initial configuration')}, "
            f"{_count(self.turns, 'turn')} per path",
            f"bounds: <= {_count(self.bounds.attempts, 'attempt')} and "
            f"{_count(self.bounds.events, 'event')} per turn, waits <= {self.bounds.wait:g} s",
        ]
        if not self.complete:
            lines.append("INCOMPLETE: the state limit was reached; properties are unproven")
        for name in PROPERTIES:
            v = self.violations.get(name)
            if v is None:
                lines.append(f"  holds   {name}")
            else:
                lines.append(f"  BROKEN  {name}: {v.why}")
                lines.append(
                    f"          counterexample ({_count(v.length, 'event')}; "
                    "replay with fallgate.fsm.checker.replay(policy, steps)):"
                )
                lines.append(f"          {v.python()}")
        a = self.audit
        if a.finding is None:
            lines.append(
                f"key audit: {_count(a.checked, 'merged configuration')} fed every event, "
                "each behaved like the one it was merged into"
            )
        else:
            lines.append(f"KEY UNSOUND: {a.finding}")
            lines.append(f"          reached by: {format_steps(a.steps)}")
        if self.untaken:
            kinds: dict[str, list[Untaken]] = {}
            for u in self.untaken:
                kinds.setdefault(u.finding, []).append(u)
            counts = ", ".join(
                _count(len(v), k, k if k.endswith("s") else None) for k, v in kinds.items()
            )
            lines.append(f"declared but never taken ({len(self.untaken)}: {counts}):")
            for k, us in kinds.items():
                whys: dict[str, list[str]] = {}
                for u in us:
                    whys.setdefault(u.why, []).append(u.short or u.edge)
                for why, edges in whys.items():
                    lines.append(f"  {k}: {why}:")
                    lines.append(f"    {', '.join(edges)}")
        elif self.unreachable:
            lines.append(f"declared but never taken ({len(self.unreachable)}):")
            lines += [f"  {u}" for u in self.unreachable]
        else:
            lines.append("every declared transition was taken")
        return "\n".join(lines)


def describe(t: Transition, policy: Policy) -> str:
    """A declared transition as one line: ``primary --rate_limited [next_is=...]--> ...``."""
    guard = f" [{t.guard.label(policy, t.arg)}]" if t.guard is not None else ""
    return f"{t.source} --{t.trigger}{guard}--> {t.dest}"
