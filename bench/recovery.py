"""A recovered primary: how soon after its recovery it carries the turns again.

`python -m bench --only recovery` (or `python -m bench.recovery`) prints the table. The
primary is down (503 to everything, or every connection dropped) for a while and then
healthy, the fallback is healthy, and one turn starts every 4 s through `Fallgate` (the
real openai SDK over loopback HTTP to the fault server) on a virtual clock: the policy's
waits and the breaker's spans are its defaults, in virtual seconds, so a five-minute
outage runs in a second or two. Each row: the seconds from the recovery to the start of
the first turn the primary answered, the requests the primary got during the outage, and
how many of the outage's turns the fallback answered. The peer, in the same process, is
the same policy with the schedule before ``breaker.max_open`` (its span doubling up to
``cooldown.cap``, 300 s).
"""

from __future__ import annotations

from typing import Any

import attrs
from fallgate.fsm import VirtualClock

from fallgate import Fallgate, HealthStore, Policy
from fallgate.testing import FaultServer

MESSAGES = [{"role": "user", "content": "hi"}]
GAP = 4.0
OUTAGES = (60.0, 120.0, 300.0)
DOWN: dict[str, dict[str, Any]] = {
    "503": {"kind": "status", "status": 503},
    "drop": {"kind": "drop"},
}


def _policy(base_url: str, old: bool) -> Policy:
    p = Policy.from_dict(
        {
            "primary": {
                "provider": "fault",
                "model": "primary",
                "base_url": base_url,
                "api_key": "sk-bench-0000000000",
            },
            "fallback_providers": [
                {
                    "provider": "fault",
                    "model": "fallback",
                    "base_url": base_url,
                    "api_key": "sk-bench-0000000000",
                }
            ],
        }
    )
    if old:
        p = attrs.evolve(p, breaker=attrs.evolve(p.breaker, max_open=p.cooldown.cap))
    return p


def _script(primary: dict[str, Any]) -> dict[str, Any]:
    return {"models": {"primary": [primary] * 10_000}, "default": {"kind": "answer", "text": "ok"}}


def one(outage: float, down: str, old: bool) -> dict[str, Any]:
    """One run: turns `GAP` apart until 40 s past the recovery (or the primary's return)."""
    clock = VirtualClock(0.0)
    with FaultServer(_script(DOWN[down])) as srv:
        with Fallgate(_policy(srv.base_url, old), health=HealthStore(), clock=clock) as gate:
            back: float | None = None
            during = answered = 0
            up = False
            i = 0
            while back is None and i * GAP < outage + 400.0:
                clock.t = max(clock.t, i * GAP)
                at = clock.t
                i += 1
                if not up and at >= outage:
                    during = srv.count("primary")
                    srv.script(_script({"kind": "answer", "text": "ok"}))
                    up = True
                r = gate.run(messages=MESSAGES)
                if at < outage:
                    answered += r.model == "fallback"
                elif r.model == "primary":
                    back = at - outage
    turns = int((outage + GAP - 1e-9) // GAP)
    return {
        "outage": outage,
        "down": down,
        "schedule": "capped" if not old else "doubling",
        "back_after": back,
        "primary_requests": during,
        "fallback_answered": answered,
        "outage_turns": turns,
    }


def worst_core(old: bool, gap: float = GAP) -> tuple[float, float]:
    """On the pure core (no network, the same policy): the latest the primary comes back
    over every outage length from 0.5 s to 400 s on a 1.3 s grid (every phase of the
    probe schedule against the recovery), and the outage length that gives it."""
    from fallgate.fsm import Outcome, OutcomeKind, Turn
    from fallgate.fsm.host.loop import host_loop

    policy = _policy("https://p.test/v1", old)
    worst = (0.0, 0.0)
    for step in range(308):
        outage = 0.5 + 1.3 * step
        health, clock = HealthStore(), VirtualClock(0.0)
        i = 0
        while True:
            clock.t = max(clock.t, i * gap)
            at = clock.t
            i += 1

            def attempt(a: Any, clock: VirtualClock = clock, outage: float = outage) -> Outcome:
                if a.target.model == "primary" and clock.t < outage:
                    return Outcome(OutcomeKind.OVERLOADED, status=503)
                return Outcome(OutcomeKind.SUCCESS, value=a.target.model)

            end = next(
                host_loop(
                    Turn(policy, health=health, clock=clock.now), clock=clock, attempt=attempt
                )
            )
            if getattr(end, "result", None) == "primary" and at >= outage:
                worst = max(worst, (at - outage, outage))
                break
    return worst


def measure(log: Any = None) -> list[dict[str, Any]]:
    rows = []
    for old in (False, True):
        back, outage = worst_core(old)
        rows.append(
            {
                "worst": back,
                "at_outage": round(outage, 1),
                "schedule": "capped" if not old else "doubling",
            }
        )
        if log is not None:
            log(
                f"  every outage 0.5-400 s, {rows[-1]['schedule']:8s}: back after at most "
                f"{back:g} s (a {outage:g} s outage)"
            )
    for outage in OUTAGES:
        for down in DOWN:
            for old in (False, True):
                row = one(outage, down, old)
                rows.append(row)
                if log is not None:
                    log(
                        f"  {outage:5.0f} s down ({down:4s}), {row['schedule']:8s}: back after "
                        f"{row['back_after']} s, {row['primary_requests']} primary requests"
                    )
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        f"**A recovered primary** (down, then healthy; a healthy fallback; a turn every "
        f"{GAP:g} s; the default policy on a virtual clock, the real SDK over loopback)",
        "",
        "| outage | down as | breaker span | first turn back on the primary | primary "
        "requests in the outage | outage turns answered by the fallback |",
        "|---:|---|---|---:|---:|---:|",
    ]
    worst = [r for r in rows if "worst" in r]
    for r in rows:
        if "worst" in r:
            continue
        span = (
            "capped at `max_open` (20 s)"
            if r["schedule"] == "capped"
            else "doubling to 300 s (before)"
        )
        back = "never" if r["back_after"] is None else f"{r['back_after']:g} s"
        out.append(
            f"| {r['outage']:g} s | {r['down']} | {span} | {back} | "
            f"{r['primary_requests']} | {r['fallback_answered']}/{r['outage_turns']} |"
        )
    out.append("")
    if worst:
        out += [
            "Over every outage length from 0.5 s to 400 s (1.3 s grid: every phase of the "
            "probe schedule), on the pure core with the same policy:",
            "",
            "| breaker span | latest first turn back on the primary | for an outage of |",
            "|---|---:|---:|",
        ]
        for r in worst:
            span = (
                "capped at `max_open` (20 s)"
                if r["schedule"] == "capped"
                else "doubling to 300 s (before)"
            )
            out.append(f"| {span} | {r['worst']:g} s | {r['at_outage']:g} s |")
        out.append("")
    return out


if __name__ == "__main__":
    print("\n".join(table(measure(log=print))))
