"""Deployment groups and conversation affinity (`python -m bench --only groups,affinity`).

**groups**: one model at two deployments (one fault server each on loopback): the one
declared first answers in 150 ms, the other in 30 ms; a third server holds the fallback
model. 8 threads send turns for two phases of `TURNS` turns each: both deployments
healthy, then the fast one down (503 to everything). Systems: fallgate with the two as
one group (`members = [...]`), and fallgate with the same two as the first two entries
of a plain chain (what a policy without groups says). Reported per system and phase:
turns answered, the share each deployment and the fallback model served, p50 / p99 turn
latency, requests the down deployment received.

**affinity**: the same two deployments, both answering in 30 ms, and `CONVERSATIONS`
conversations of `TURNS_EACH` turns each, sent in turn order by 8 threads (each turn
re-sends the conversation so far, so the prefix is the same as the last turn's). The
router's measured latencies are left to the network's noise, so without affinity turns
go to whichever deployment looks faster or less busy at that moment; with affinity
(``prompt_cache_key`` = the conversation) they stay. Halfway, the deployment serving
most conversations goes down for good. Reported with affinity on and off: the share of
turns served by their conversation's pinned deployment while it was healthy, the share
of prompt tokens the deployments' caches served (`usage.prompt_tokens_details`), and,
after the fault, the turns each affected conversation took to settle on its new
deployment.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fallgate import Fallgate, HealthStore, Policy, TurnFailed
from fallgate.testing import FaultServer

TURNS = 200
THREADS = 8
CONVERSATIONS = 24
TURNS_EACH = 12
SLOW, FAST = 0.15, 0.03
KEYS = ("sk-bench-a-0000000000", "sk-bench-b-0000000000", "sk-bench-c-0000000000")


def _answer(delay: float) -> dict[str, Any]:
    return {"default": {"kind": "answer", "text": "ok", "delay": delay}}


DOWN = {"default": {"kind": "status", "status": 503}}


def _policy(servers: list[FaultServer], grouped: bool) -> Policy:
    a, b, c = servers
    members = [
        {"base_url": a.base_url, "api_key": KEYS[0]},
        {"base_url": b.base_url, "api_key": KEYS[1]},
    ]
    small = {"provider": "fault", "model": "small", "base_url": c.base_url, "api_key": KEYS[2]}
    knobs = {"attempt_timeout": 5, "deadline": 20, "backoff": {"initial": 0.05, "cap": 0.2}}
    if grouped:
        entries = [{"provider": "fault", "model": "m", "members": members}, small]
    else:
        entries = [{"provider": "fault", "model": "m", **m} for m in members] + [small]
    return Policy.from_dict({"targets": entries, **knobs})


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _phase(gate: Fallgate, turns: int, names: dict[str, str]) -> dict[str, Any]:
    lat: list[float] = []
    served: dict[str, int] = {}
    failed = 0
    lock = threading.Lock()

    def one(_: int) -> None:
        nonlocal failed
        t0 = time.perf_counter()
        try:
            r = gate.run(messages=[{"role": "user", "content": "hi"}])
        except TurnFailed:
            with lock:
                failed += 1
            return
        with lock:
            lat.append(time.perf_counter() - t0)
            who = names.get(r.target, r.target)
            served[who] = served.get(who, 0) + 1

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(one, range(turns)))
    return {
        "answered": len(lat),
        "failed": failed,
        "served": {k: v / turns for k, v in sorted(served.items())},
        "p50_ms": 1000 * statistics.median(lat) if lat else float("nan"),
        "p99_ms": 1000 * _pct(lat, 0.99),
    }


def measure_groups(*, quick: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    turns = 40 if quick else TURNS
    out: dict[str, Any] = {"turns": turns, "threads": THREADS, "slow_s": SLOW, "fast_s": FAST}
    rows = []
    for grouped in (True, False):
        with FaultServer() as a, FaultServer() as b, FaultServer() as c:
            servers = [a, b, c]
            policy = _policy(servers, grouped)
            roles = ("slow", "fast", "fallback")
            names = dict(zip((t.name for t in policy.targets), roles, strict=True))
            label = "fallgate, one group" if grouped else "fallgate, plain chain"
            log(f"  {label} ...")
            a.script(_answer(SLOW))
            b.script(_answer(FAST))
            c.script(_answer(FAST))
            with Fallgate(policy, health=HealthStore()) as gate:
                healthy = _phase(gate, turns, names)
                b.script(DOWN)
                before = b.count("m")
                down = _phase(gate, turns, names)
                down["requests_to_down"] = b.count("m") - before
            rows.append({"system": label, "healthy": healthy, "fast_down": down})
    out["systems"] = rows
    return out


def groups_table(g: dict[str, Any]) -> list[str]:
    lines = [
        f"**Deployment groups** (one model at two deployments answering in "
        f"{1000 * g['slow_s']:.0f} ms (declared first) and {1000 * g['fast_s']:.0f} ms, a "
        f"fallback model; {g['turns']} turns per phase from {g['threads']} threads; then the "
        "fast deployment answers 503 to everything)",
        "",
        "| system | phase | answered | slow / fast / fallback share | p50 ms | p99 ms "
        "| requests to the down one |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for r in g["systems"]:
        for phase, label in (("healthy", "both healthy"), ("fast_down", "fast one down")):
            v = r[phase]
            share = " / ".join(f"{100 * v['served'].get(k, 0):.0f}%" for k in
                               ("slow", "fast", "fallback"))
            down = v.get("requests_to_down", "-")
            lines.append(
                f"| {r['system']} | {label} | {v['answered']}/{g['turns']} | {share} "
                f"| {v['p50_ms']:.0f} | {v['p99_ms']:.0f} | {down} |"
            )
    lines.append("")
    return lines


# -- affinity ------------------------------------------------------------------------------------


def _conversations(
    gate: Fallgate,
    histories: list[list[dict[str, str]]],
    turns: tuple[int, int],
    affinity: bool,
    record: dict[int, list[Any]],
) -> None:
    """Turns `turns[0]..turns[1]-1` of every conversation, the conversations side by side;
    per turn (its number, the target that answered, cached and prompt tokens)."""

    def one(n: int) -> None:
        msgs = histories[n]
        for k in range(*turns):
            msgs.append({"role": "user", "content": f"question {k}"})
            extra = {"prompt_cache_key": f"conv-{n}"} if affinity else {}
            try:
                r = gate.run(messages=list(msgs), **extra)
            except TurnFailed:
                record.setdefault(n, []).append((k, None, 0, 0))
                msgs.pop()
                continue
            u = r.value.usage
            details = u.prompt_tokens_details
            cached = details.cached_tokens if details and details.cached_tokens else 0
            record.setdefault(n, []).append((k, r.target, cached, u.prompt_tokens))
            msgs.append({"role": "assistant", "content": r.value.choices[0].message.content})

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(one, range(len(histories))))


def _affinity_run(affinity: bool, convs: int, each: int) -> dict[str, Any]:
    with FaultServer() as a, FaultServer() as b, FaultServer() as c:
        servers = [a, b, c]
        for s in servers:
            s.script(_answer(FAST))
        policy = _policy(servers, grouped=True)
        record: dict[int, list[Any]] = {}
        histories = [
            [{"role": "system", "content": f"conversation {n}: " + "be terse " * 60}]
            for n in range(convs)
        ]
        with Fallgate(policy, health=HealthStore()) as gate:
            half = each // 2
            _conversations(gate, histories, (0, half), affinity, record)
            firsts = [rows[half - 1][1] for rows in record.values()]
            victim = max(set(firsts), key=firsts.count)
            (a if victim == policy.targets[0].name else b).script(DOWN)
            _conversations(gate, histories, (half, each), affinity, record)
    stayed = moves = 0
    cached = prompt = 0
    settle: list[int] = []
    for rows in record.values():
        rows.sort(key=lambda row: row[0])
        for (_, prev, _, _), (_, cur, _, _) in itertools.pairwise(rows[:half]):
            moves += 1
            stayed += prev == cur
        for _, _, c_, p_ in rows:
            cached += c_
            prompt += p_
        if rows[half - 1][1] == victim:
            after = [t for _, t, _, _ in rows[half:]]
            final = after[-1]
            # turns after the fault until the conversation is on its final deployment
            settled = next(i for i in range(len(after)) if all(x == final for x in after[i:]))
            settle.append(settled + 1)
    return {
        "affinity": affinity,
        "stayed_while_healthy": stayed / moves if moves else float("nan"),
        "cache_share": cached / prompt if prompt else 0.0,
        "affected": len(settle),
        "settle_max_turns": max(settle) if settle else 0,
        "settle_mean_turns": statistics.mean(settle) if settle else 0.0,
    }


def measure_affinity(*, quick: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    convs, each = (8, 6) if quick else (CONVERSATIONS, TURNS_EACH)
    rows = []
    for on in (True, False):
        log(f"  affinity {'on' if on else 'off'} ...")
        rows.append(_affinity_run(on, convs, each))
    return {"conversations": convs, "turns_each": each, "threads": THREADS, "rows": rows}


def affinity_table(g: dict[str, Any]) -> list[str]:
    lines = [
        f"**Conversation affinity** ({g['conversations']} conversations x {g['turns_each']} "
        f"turns from {g['threads']} threads over a group of two deployments answering in "
        f"{1000 * FAST:.0f} ms; halfway, the deployment serving most conversations goes "
        "down)",
        "",
        "| affinity | turns on the last turn's deployment (healthy) | prompt tokens from "
        "cache | conversations moved | turns to settle after the fault (max / mean) |",
        "|---|---:|---:|---:|---|",
    ]
    for r in g["rows"]:
        lines.append(
            f"| {'on (`prompt_cache_key`)' if r['affinity'] else 'off'} "
            f"| {100 * r['stayed_while_healthy']:.1f}% | {100 * r['cache_share']:.1f}% "
            f"| {r['affected']} | {r['settle_max_turns']} / {r['settle_mean_turns']:.2f} |"
        )
    lines.append("")
    return lines


if __name__ == "__main__":
    print("\n".join(groups_table(measure_groups())))
    print("\n".join(affinity_table(measure_affinity())))
