"""What `fsm.checker.interleave.check_fleet` found, per property: holds, or a shortest
interleaving that breaks it (as text for people and JSON for tools)."""

from __future__ import annotations

from typing import Any, Final

import attrs

__all__ = ["FLEET_PROPERTIES", "FleetReport", "Move"]

#: The properties judged on every interleaved transition.
FLEET_PROPERTIES: Final = (
    "one_probe_in_flight",
    "retry_budget",
    "probe_within_bound",
    "declared",
    "no_ping_pong",
    "termination",
    "honest_waits",
)

Move = tuple[int, str]  # (turn slot, step)


@attrs.frozen
class FleetReport:
    """What `check_fleet` found: per property "holds" or a shortest interleaving."""

    turns: int
    setups: tuple[str, ...]
    states: int
    transitions: int
    seconds: float
    complete: bool
    violations: dict[str, tuple[str, tuple[tuple[str, Move], ...]]]

    @property
    def ok(self) -> bool:
        return not self.violations and self.complete

    def text(self) -> str:
        lines = [
            f"{self.turns} concurrent turns on one shared health store, every interleaving "
            f"from {len(self.setups)} starting stores ({', '.join(self.setups)}): "
            f"{self.states} configurations, {self.transitions} transitions, "
            f"{self.seconds:.1f} s{'' if self.complete else ' (INCOMPLETE: state limit)'}"
        ]
        for p in FLEET_PROPERTIES:
            v = self.violations.get(p)
            if v is None:
                lines.append(f"  {p}: holds")
            else:
                why, path = v
                steps = ", ".join(f"turn {m[0] + 1} {m[1]}" for _, m in path)
                lines.append(
                    f"  {p}: BROKEN: {why}\n    shortest interleaving ({path[0][0]}): {steps}"
                )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "setups": list(self.setups),
            "states": self.states,
            "transitions": self.transitions,
            "seconds": round(self.seconds, 3),
            "complete": self.complete,
            "properties": {
                p: "holds"
                if p not in self.violations
                else {
                    "why": self.violations[p][0],
                    "setup": self.violations[p][1][0][0] if self.violations[p][1] else "",
                    "steps": [list(m) for _, m in self.violations[p][1]],
                }
                for p in FLEET_PROPERTIES
            },
        }
