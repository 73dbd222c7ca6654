"""Run every benchmark, print the table, write build/bench.json.

    python -m bench                 # the full run (several minutes; `make bench`)
    python -m bench --quick         # seconds: the smoke test's mode
    python -m bench --only core,checker
    python -m bench --only hermes   # hermes-agent alone / with fallgate (make bench-hermes)
    python -m bench --only overload # 1,000 concurrent turns, a server whose accept queue overflows
                                    # (then again with the clients saturated on one CPU)
    python -m bench --only declare  # declaration size for 10, 100, 1,000 targets
    python -m bench --only silent   # a silent primary vs the deadline
    python -m bench --only recovery # a primary down, then healthy: how soon it is back
    python -m bench --only groups,affinity  # deployment groups, conversation affinity
    python -m bench --only pacing   # 8 processes on one Redis store against real rate limits

bench.json holds the core, faults, throughput, checker and otel keys plus ``fleet`` and
``storm`` (and ``hermes`` when that section runs: it needs the hermes venv, so it is not in
the default run); everything else (fsm.run and the `transitions` executor, per-model request
counts, each round) goes to
build/bench-details.json, and the Markdown tables to build/bench.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path
from typing import Any

from .timing import median_ratio

SECTIONS = (
    "core", "faults", "throughput", "checker", "otel", "fleet", "storm", "hermes", "declare",
    "overload", "silent", "recovery", "groups", "affinity", "pacing",
)
#: What runs without --only (hermes needs its own venv: `make bench-hermes`; overload
#: saturates the machine for a minute: `--only overload`).
DEFAULT_SECTIONS = (
    "core", "faults", "throughput", "checker", "otel", "fleet", "storm", "groups", "affinity",
    "pacing",
)

GOALS = {
    "core_happy": "fallgate happy turn <= tenacity happy path",
    "core_fault": "fallgate faulty turn <= 0.5 x tenacity (same attempts)",
    "faults": "every scenario within 1.1 x oracle + 50 ms",
    "throughput": "fallgate wall time <= 1.05 x bare SDK",
    "throughput_cpu": "fallgate client CPU per turn <= 1.05 x bare SDK (median, interleaved)",
    "overload": "under overload fallgate answers at least as many turns as the bare SDK"
    " (quiet and saturated client)",
    "checker": "default policy checked (completely) in < 5 s",
    "checker_chain": "a chain of 8 targets x 3 keys checked (completely) in < 5 s",
    "fleet": "shared stores: primary requests in its cooldown <= 1 (per-process: one each)",
    "storm": "fallgate: <= 1.1 requests per turn to a primary that answers 503",
    "redis_overhead": "`RedisHealthStore` vs the in-memory store, client CPU per happy turn"
    " <= 1.05x (median, interleaved)",
    "otel": "OpenTelemetry on vs off, chat turn over loopback HTTP: fallgate's part <= 1.02 x"
    " the SDK's own floor (median, interleaved)",
    "otel_core": "OpenTelemetry on, pure core, scenario 1's turn <= 3 x off",
}


def _checker_table(
    policy: str, states: int, transitions: Any, seconds: float, complete: bool
) -> list[str]:
    """One exhaustive check as a Markdown table."""
    rate = round(states / seconds) if seconds > 0 else 0
    done = "yes" if complete else "**no**: state limit reached"
    return [
        f"**Checker** ({policy}, exhaustive)",
        "",
        "| states | transitions | seconds | states/s | complete |",
        "|---:|---:|---:|---:|:---:|",
        f"| {states} | {transitions} | {seconds:.2f} | {rate} | {done} |",
        "",
    ]


def _public(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if not k.startswith("_")}


def run(
    sections: tuple[str, ...], quick: bool, log: Any = print
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(bench.json content, details)."""
    result: dict[str, Any] = {}
    details: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {_cpus()} CPUs",
        "quick": quick,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **_git(),
    }
    if "core" in sections:
        from . import core

        log("core overhead (µs per turn, best round, interleaved) ...")
        rounds: dict[str, list[float]] = {}
        us = core.measure(number=100 if quick else 300, rounds=3 if quick else 40, per_round=rounds)
        result["core"] = {
            "fallgate_happy_us": round(us["fallgate_happy"], 2),
            "tenacity_happy_us": round(us["tenacity_happy"], 2),
            "fallgate_fault_us": round(us["fallgate_fault"], 2),
            "tenacity_fault_us": round(us["tenacity_fault"], 2),
            "bare_loop_fault_us": round(us["bare_loop_fault"], 2),
        }
        details["core_us"] = {k: round(v, 2) for k, v in us.items()}
        details["core_median_ratio_vs_tenacity"] = {
            kind: round(median_ratio(rounds, f"fallgate_{kind}", f"tenacity_{kind}"), 3)
            for kind in ("happy", "fault")
        }
    if "faults" in sections:
        from . import faults, scenarios
        from .fault_worker import SYSTEMS

        log("time to answer under faults (real SDK, real HTTP, loopback) ...")
        if quick:
            rows = faults.measure(
                [s for s in scenarios.SCENARIOS if "insufficient_quota" in s.name],
                ("fallgate", "openai SDK (max_retries=2)"),
                cap=10.0,
                log=log,
            )
        else:
            rows = faults.measure(scenarios.SCENARIOS, tuple(SYSTEMS), log=log)
        result["faults"] = [_public(r) for r in rows]
        details["faults"] = rows
        details["oracles"] = {s.name: s.oracle_why for s in scenarios.SCENARIOS}
    if "throughput" in sections:
        from . import throughput

        turns, conc, rounds = (60, 20, 1) if quick else (2000, 200, 3)
        log(f"throughput ({turns} turns, concurrency {conc}, best of {rounds}) ...")
        tp = throughput.measure(
            turns=turns, concurrency=conc, rounds=rounds, log=log, cpu_rounds=3 if quick else 45
        )
        result["throughput"] = _public(tp)
        details["throughput"] = tp
    if "checker" in sections:
        from . import checker

        log("checker (default policy) ...")
        ck = checker.measure(rounds=1 if quick else 3, quick=quick)
        result["checker"] = _public(ck)
        details["checker"] = ck
    if "otel" in sections:
        from . import otel

        log("OpenTelemetry overhead (client CPU per turn, on vs off, one process) ...")
        ot = otel.measure(quick=quick, log=log)
        result["otel"] = ot
        details["otel"] = ot
    if "fleet" in sections:
        from . import fleet

        fl = fleet.measure(quick=quick, log=log)
        result["fleet"] = _public(fl)
        if fl.get("overhead"):
            result["fleet"]["overhead"] = _public(fl["overhead"])
        details["fleet"] = fl
    if "storm" in sections:
        from . import storm

        turns, conc = (40, 20) if quick else (1000, 100)
        systems = ("fallgate", "openai SDK (max_retries=2)") if quick else storm.SYSTEMS
        log(f"retry storm (primary 503 to everything, no fallback; {turns} turns at "
            f"concurrency {conc}) ...")
        st = storm.measure(turns=turns, concurrency=conc, systems=systems, log=log)
        result["storm"] = {**st, "systems": [_public(r) for r in st["systems"]]}
        details["storm"] = st
    if "overload" in sections:
        from . import overload

        turns = 200 if quick else 1000
        log(f"overload ({turns} concurrent turns, loopback server with a small backlog) ...")
        ov = overload.measure(turns=turns, log=log)
        result["overload"] = ov
        details["overload"] = ov
        if overload.one_cpu() is not None:
            log(f"overload, saturated ({overload.SATURATE} busy loops on the clients' one CPU) ...")
            ovs = overload.measure(turns=turns, log=log, saturate=overload.SATURATE)
            result["overload_saturated"] = ovs
            details["overload_saturated"] = ovs
    if "declare" in sections:
        from . import declare

        log("declaration size (declare, compile, first turn; 10/100/1000 targets) ...")
        dc = declare.measure(declare.SIZES[:2] if quick else declare.SIZES, log=log)
        result["declare"] = dc
        details["declare"] = dc
    if "pacing" in sections:
        from . import pacing

        log("pacing: 8 workers, one Redis store, a primary's real limits (2 keys) ...")
        pc = pacing.measure(log=log, quick=quick)
        result["pacing"] = pc["rows"]
        details["pacing"] = pc
    if "silent" in sections:
        from . import silent

        log("a silent primary, a healthy fallback: who answers, and when ...")
        details["silent"] = silent.measure(log=log)
    if "recovery" in sections:
        from . import recovery

        log("a primary down, then healthy, a turn every 4 s: how soon it is back ...")
        details["recovery"] = recovery.measure(log=log)
    if "groups" in sections:
        from . import groups

        log("deployment groups (two deployments of one model, then the fast one down) ...")
        details["groups"] = groups.measure_groups(quick=quick, log=log)
    if "affinity" in sections:
        from . import groups

        log("conversation affinity (conversations over a group; one deployment fails) ...")
        details["affinity"] = groups.measure_affinity(quick=quick, log=log)
    if "hermes" in sections:
        from . import hermes, scenarios

        log("hermes-agent alone and with fallgate attached (the hermes venv) ...")
        chosen = scenarios.SCENARIOS
        if quick:
            chosen = tuple(s for s in chosen if "insufficient_quota" in s.name)
        rows = hermes.measure(chosen, log=log)
        result["hermes"] = [_public(r) for r in rows]
        details["hermes"] = rows
    return result, details


def _git() -> dict[str, Any]:
    """Which code was measured: the commit, and files changed since it (if any)."""
    import subprocess

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": head, "modified": [line[3:] for line in dirty if line.strip()]}


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def goals(result: dict[str, Any], details: dict[str, Any] | None = None) -> dict[str, bool]:
    out: dict[str, bool] = {}
    c = result.get("core")
    if c:
        out["core_happy"] = c["fallgate_happy_us"] <= c["tenacity_happy_us"]
        out["core_fault"] = c["fallgate_fault_us"] <= 0.5 * c["tenacity_fault_us"]
    rows = [r for r in result.get("faults", []) if r["system"] == "fallgate"]
    if rows:
        out["faults"] = all(
            r["answered"] and r["seconds"] <= 1.1 * r["oracle_seconds"] + 0.05 for r in rows
        )
    t = result.get("throughput")
    if t:
        out["throughput"] = t["fallgate_seconds"] <= 1.05 * t["bare_sdk_seconds"]
        inter = (details or {}).get("throughput", {}).get("_cpu_interleaved")
        if inter is not None:
            out["throughput_cpu"] = inter["cpu_ratio_median"] <= 1.05
    ov = result.get("overload")
    if ov:
        runs = [ov, *([result["overload_saturated"]] if "overload_saturated" in result else [])]
        out["overload"] = all(r["fallgate"]["answered"] >= r["bare_sdk"]["answered"] for r in runs)
    k = result.get("checker")
    if k:
        complete = (details or {}).get("checker", {}).get("_complete", True)
        out["checker"] = bool(complete) and k["seconds"] < 5.0
        if "chain_8x3_seconds" in k:
            chain_complete = (details or {}).get("checker", {}).get("_chain_complete", True)
            out["checker_chain"] = bool(chain_complete) and k["chain_8x3_seconds"] < 5.0
    fl = result.get("fleet")
    if fl:
        shared = [v for name, v in fl["stores"].items() if name != "per-process"]
        out["fleet"] = all(
            v["primary_requests_in_cooldown"] <= 1 and v["failed_turns"] == 0 for v in shared
        )
        o = fl.get("overhead")
        if o:
            out["redis_overhead"] = o.get("redis_vs_memory_ratio", o["redis_ratio"]) <= 1.05
    st = result.get("storm")
    if st:
        fg = [r for r in st["systems"] if r["system"] == "fallgate"]
        if fg:
            out["storm"] = fg[0]["requests_per_turn"] <= 1.1
    o = result.get("otel")
    if o:
        out["otel"] = o.get("over_floor_ratio", o["ratio"]) <= 1.02
        out["otel_core"] = o["core_ratio"] <= 3.0
    return out


def table(result: dict[str, Any], details: dict[str, Any] | None = None) -> str:
    """The Markdown tables (what docs/bench.md shows)."""
    lines: list[str] = []
    c = result.get("core")
    if c:
        us = (details or {}).get("core_us", {})
        lines += [
            "**Core overhead** (µs per turn, pure core, no waiting; best of rounds)",
            "",
            "| turn | fallgate core | fallgate `fsm.run` | `transitions` executor "
            "| tenacity | bare loop |",
            "|---|---:|---:|---:|---:|---:|",
            f"| happy (1 attempt) | {c['fallgate_happy_us']:.1f} "
            f"| {_f(us.get('fallgate_run_happy'))} "
            f"| {_f(us.get('transitions_happy'))} | {c['tenacity_happy_us']:.1f} "
            f"| {_f(us.get('bare_loop_happy'))} |",
            f"| faulty (timeout, timeout, recovery, 429, fallback, success: 4 attempts) "
            f"| {c['fallgate_fault_us']:.1f} | {_f(us.get('fallgate_run_fault'))} "
            f"| {_f(us.get('transitions_fault'))} | {c['tenacity_fault_us']:.1f} "
            f"| {c['bare_loop_fault_us']:.1f} |",
            "",
        ]
        med = (details or {}).get("core_median_ratio_vs_tenacity")
        if med:
            lines += [
                f"fallgate core / tenacity, median of the per-round ratios: happy "
                f"{med['happy']:.2f}x, faulty {med['fault']:.2f}x.",
                "",
            ]
    rows = result.get("faults")
    if rows:
        lines += [
            "**Time to answer under faults** (real `openai` SDK over real HTTP to the fault "
            "server; client timeout 1 s; each run capped at 30 s)",
            "",
            "| scenario | oracle s | system | seconds | requests | answered |",
            "|---|---:|---|---:|---:|:---:|",
        ]
        last = None
        for r in rows:
            sc = r["scenario"] if r["scenario"] != last else ""
            orc = f"{r['oracle_seconds']:.2f}" if sc else ""
            last = r["scenario"]
            lines.append(
                f"| {sc} | {orc} | {r['system']} | {r['seconds']:.2f} | {r['requests']} "
                f"| {'yes' if r['answered'] else '**no**'} |"
            )
        lines.append("")
    t = result.get("throughput")
    if t:
        extra = (details or {}).get("throughput", {})
        bare_mem = extra.get("_bare_sdk_peak_rss_mb_per_1k_turns")
        lines += [
            f"**Throughput** ({t['turns']} turns, concurrency {t['concurrency']}, fast fault "
            "server in its own process; best of rounds)",
            "",
            "| system | seconds | turns/s | client CPU ms/turn "
            "| peak RSS growth, MB per 1k turns |",
            "|---|---:|---:|---:|---:|",
            f"| fallgate `AsyncFallgate` | {t['fallgate_seconds']:.2f} "
            f"| {t['turns'] / t['fallgate_seconds']:.0f} "
            f"| {_f(extra.get('_fallgate_cpu_ms_per_turn'), 2)} "
            f"| {t['peak_rss_mb_per_1k_turns']:.2f} |",
            f"| bare `openai.AsyncOpenAI` | {t['bare_sdk_seconds']:.2f} "
            f"| {t['turns'] / t['bare_sdk_seconds']:.0f} "
            f"| {_f(extra.get('_bare_sdk_cpu_ms_per_turn'), 2)} | {_f(bare_mem, 2)} |",
            "",
        ]
        inter = extra.get("_cpu_interleaved")
        if inter is not None:
            lines += [
                "Client CPU per turn, fallgate / bare SDK: median of the per-round ratios "
                f"{extra['_cpu_ratio_median']:.3f}x over the rounds above; "
                f"{inter['cpu_ratio_median']:.3f}x over {inter['rounds']} interleaved rounds "
                f"of {inter['turns_per_round']} turns in one process (range "
                f"{inter['cpu_ratios'][0]:.3f}-{inter['cpu_ratios'][-1]:.3f}x).",
                "",
            ]
            if "http_client_cpu_ratio_median" in inter:
                lines += [
                    "The other embedding, a bare `openai.AsyncOpenAI` over "
                    "`fallgate.async_http_client` (what agent frameworks use), in the same "
                    f"rounds: {inter['http_client_cpu_ratio_median']:.3f}x the bare SDK's "
                    "client CPU per turn.",
                    "",
                ]
    k = result.get("checker")
    if k:
        ck_extra = (details or {}).get("checker", {})
        policy = ck_extra.get("_policy", "default_policy()")
        lines += _checker_table(
            policy,
            k["states"],
            ck_extra.get("_transitions", "-"),
            k["seconds"],
            ck_extra.get("_complete", True),
        )
        if "chain_8x3_seconds" in k:
            lines += _checker_table(
                "8 targets x 3 keys, `bench.checker.chain_policy()`",
                k["chain_8x3_states"],
                ck_extra.get("_chain_transitions", "-"),
                k["chain_8x3_seconds"],
                ck_extra.get("_chain_complete", True),
            )
    sl = (details or {}).get("silent")
    if sl:
        from . import silent

        lines += silent.table(sl)
    rc = (details or {}).get("recovery")
    if rc:
        from . import recovery

        lines += recovery.table(rc)
    if (details or {}).get("groups"):
        from .groups import groups_table

        lines += groups_table(details["groups"])  # type: ignore[index]
    if (details or {}).get("affinity"):
        from .groups import affinity_table

        lines += affinity_table(details["affinity"])  # type: ignore[index]
    dc = result.get("declare")
    if dc:
        from . import declare

        lines += [declare.table(dc)]
    o = result.get("otel")
    if o:
        from .otel import table as otel_table

        lines += otel_table(o)
    lines += _fleet_tables(result)
    ov = result.get("overload")
    if ov:
        from .overload import table as overload_table

        lines += overload_table(ov)
        if "overload_saturated" in result:
            lines += overload_table(result["overload_saturated"])
    h = result.get("hermes")
    if h:
        from .hermes import table as hermes_table

        lines += hermes_table(h)
    g = goals(result, details)
    if (details or {}).get("quick"):
        lines.append("(quick mode: reduced sizes, so the goals are not evaluated)")
    elif g:
        figures = _goal_figures(result, details)
        lines += ["**Goals**", "", "| goal | measured | met |", "|---|---:|:---:|"]
        lines += [
            f"| {GOALS[name]} | {figures.get(name, '')} | {'yes' if ok else '**no**'} |"
            for name, ok in g.items()
        ]
        lines.append("")
    return "\n".join(lines)


def _goal_figures(result: dict[str, Any], details: dict[str, Any] | None) -> dict[str, str]:
    """The ratio (or figure) each goal is judged on, as the goals table shows it."""
    out: dict[str, str] = {}
    c = result.get("core")
    if c:
        out["core_happy"] = f"{c['fallgate_happy_us'] / c['tenacity_happy_us']:.2f}x"
        out["core_fault"] = f"{c['fallgate_fault_us'] / c['tenacity_fault_us']:.2f}x"
    t = result.get("throughput")
    if t:
        out["throughput"] = f"{t['fallgate_seconds'] / t['bare_sdk_seconds']:.3f}x"
        inter = (details or {}).get("throughput", {}).get("_cpu_interleaved")
        if inter is not None:
            out["throughput_cpu"] = f"{inter['cpu_ratio_median']:.3f}x"
    k = result.get("checker")
    if k:
        out["checker"] = f"{k['seconds']:.2f} s"
        if "chain_8x3_seconds" in k:
            out["checker_chain"] = f"{k['chain_8x3_seconds']:.1f} s"
    fl = result.get("fleet")
    if fl and fl.get("overhead"):
        o = fl["overhead"]
        out["redis_overhead"] = f"{o.get('redis_vs_memory_ratio', o['redis_ratio']):.3f}x"
    st = result.get("storm")
    if st:
        fg = [r for r in st["systems"] if r["system"] == "fallgate"]
        if fg:
            out["storm"] = f"{fg[0]['requests_per_turn']:.2f}"
    o = result.get("otel")
    if o:
        out["otel"] = f"{o.get('over_floor_ratio', o['ratio']):.3f}x"
        out["otel_core"] = f"{o['core_ratio']:.2f}x (SDK floor {o.get('core_floor_ratio', 0):.2f}x)"
    return out


def _fleet_tables(result: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    fl = result.get("fleet")
    if fl:
        lines += [
            f"**Fleet health** ({fl['workers']} worker processes x {fl['turns_per_worker']} "
            f"turns; the primary answers 429 Retry-After {fl['cooldown_seconds']:g} for "
            f"{fl['cooldown_seconds']:g} s, the fallback is healthy)",
            "",
            "| health store | requests to the primary in its cooldown | answered by the "
            "fallback | failed turns |",
            "|---|---:|---:|---:|",
        ]
        total = fl["workers"] * fl["turns_per_worker"]
        for name, v in fl["stores"].items():
            label = {"per-process": "per process (in-memory)", "sqlite": "`SQLiteHealthStore`",
                     "redis": "`RedisHealthStore`"}.get(name, name)
            lines.append(
                f"| {label} | {v['primary_requests_in_cooldown']} "
                f"| {v['answered_by_fallback']}/{total} | {v['failed_turns']} |"
            )
        if fl["redis"] != "measured":
            lines.append(f"| `RedisHealthStore` | {fl['redis']} | | |")
        lines.append("")
        o = fl.get("overhead")
        if o:
            lines += [
                "**Health store overhead** (client CPU per happy turn: one attempt, real SDK "
                "over loopback HTTP; best round, one process)",
                "",
                "| system | CPU ms/turn | / bare SDK |",
                "|---|---:|---:|",
                f"| bare `openai.OpenAI` | {o['bare_sdk_cpu_ms_per_turn']:.3f} | 1.00x |",
                f"| `Fallgate`, in-memory store | {o['fallgate_memory_cpu_ms_per_turn']:.3f} "
                f"| {o['memory_ratio']:.2f}x |",
                f"| `Fallgate`, `RedisHealthStore` | {o['fallgate_redis_cpu_ms_per_turn']:.3f} "
                f"| {o['redis_ratio']:.2f}x |",
                "",
            ]
            if "redis_vs_memory_ratio" in o:
                lines += [
                    "`RedisHealthStore` / in-memory store, median of the per-round ratios: "
                    f"{o['redis_vs_memory_ratio']:.3f}x.",
                    "",
                ]
    st = result.get("storm")
    if st:
        lines += [
            f"**Retry storm** (the primary answers 503 to everything, no fallback; "
            f"{st['turns']} turns at concurrency {st['concurrency']})",
            "",
            "| system | requests to the primary | per turn | seconds |",
            "|---|---:|---:|---:|",
        ]
        for r in st["systems"]:
            lines.append(
                f"| {r['system']} | {r['requests']} | {r['requests_per_turn']:.2f} "
                f"| {r['seconds']:.1f} |"
            )
        lines.append("")
    return lines


def _f(v: Any, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a reduced run (seconds)")
    ap.add_argument(
        "--only",
        default=",".join(DEFAULT_SECTIONS),
        help=f"comma-separated sections, of {', '.join(SECTIONS)} (default: all but hermes)",
    )
    ap.add_argument("--out", default="build/bench.json")
    args = ap.parse_args(argv)
    # the fallbacks and benched keys the scenarios provoke on purpose: not news
    logging.getLogger("fallgate").setLevel(logging.ERROR)
    sections = tuple(s.strip() for s in args.only.split(",") if s.strip())
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {', '.join(bad)}; choose from {', '.join(SECTIONS)}")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    result, details = run(sections, args.quick, log)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    (out.parent / (out.stem + "-details.json")).write_text(json.dumps(details, indent=2) + "\n")
    text = table(result, details)
    (out.parent / (out.stem + ".md")).write_text(text + "\n")
    print(text)
    print(f"wrote {out} (and {out.stem}-details.json, {out.stem}.md beside it)")
    return 0
