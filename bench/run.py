"""Run every benchmark, print the table, write build/bench.json.

    python -m bench                 # the full run (several minutes; `make bench`)
    python -m bench --quick         # seconds: the smoke test's mode
    python -m bench --only core,checker
    python -m bench --only hermes   # hermes-agent alone / with fallgate (make bench-hermes)
    python -m bench --only overload # 1,000 concurrent turns, a server whose accept queue overflows
    python -m bench --only declare  # declaration size for 10, 100, 1,000 targets

bench.json holds exactly the keys of issue 6 (and ``hermes`` when that section runs:
it needs the hermes venv, so it is not in the default run); everything else (fsm.run and the
`transitions` executor, per-model request counts, each round) goes to
build/bench-details.json, and the Markdown tables to build/bench.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from .timing import median_ratio

SECTIONS = ("core", "faults", "throughput", "checker", "otel", "hermes", "declare", "overload")
#: What runs without --only (hermes needs its own venv: `make bench-hermes`; overload
#: saturates the machine for a minute: `--only overload`).
DEFAULT_SECTIONS = ("core", "faults", "throughput", "checker", "otel")

GOALS = {
    "core_happy": "fallgate happy turn <= tenacity happy path",
    "core_fault": "fallgate faulty turn <= 0.5 x tenacity (same attempts)",
    "faults": "every scenario within 1.1 x oracle + 50 ms",
    "throughput": "fallgate wall time <= 1.05 x bare SDK",
    "throughput_cpu": "fallgate client CPU per turn <= 1.05 x bare SDK (median, interleaved)",
    "overload": "under overload fallgate answers at least as many turns as the bare SDK",
    "checker": "default policy checked (completely) in < 5 s",
    "otel": "OpenTelemetry on <= 1.05 x off (chat turn, client CPU)",
}


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
            turns=turns, concurrency=conc, rounds=rounds, log=log, cpu_rounds=3 if quick else 21
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
    if "overload" in sections:
        from . import overload

        turns = 200 if quick else 1000
        log(f"overload ({turns} concurrent turns, loopback server with a small backlog) ...")
        ov = overload.measure(turns=turns, log=log)
        result["overload"] = ov
        details["overload"] = ov
    if "declare" in sections:
        from . import declare

        log("declaration size (declare, compile, first turn; 10/100/1000 targets) ...")
        dc = declare.measure(declare.SIZES[:2] if quick else declare.SIZES, log=log)
        result["declare"] = dc
        details["declare"] = dc
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
        out["overload"] = ov["fallgate"]["answered"] >= ov["bare_sdk"]["answered"]
    k = result.get("checker")
    if k:
        complete = (details or {}).get("checker", {}).get("_complete", True)
        out["checker"] = bool(complete) and k["seconds"] < 5.0
    o = result.get("otel")
    if o:
        out["otel"] = o["ratio"] <= 1.05
    return out


def table(result: dict[str, Any], details: dict[str, Any] | None = None) -> str:
    """The Markdown tables (what docs/bench.md and the README show)."""
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
    k = result.get("checker")
    if k:
        ck_extra = (details or {}).get("checker", {})
        lines += [
            f"**Checker** ({ck_extra.get('_policy', 'default_policy()')}, exhaustive)",
            "",
            "| states | transitions | seconds | states/s | complete |",
            "|---:|---:|---:|---:|:---:|",
            f"| {k['states']} | {ck_extra.get('_transitions', '-')} | {k['seconds']:.2f} "
            f"| {k['states_per_second']} "
            f"| {'yes' if ck_extra.get('_complete', True) else '**no**: state limit reached'} |",
            "",
        ]
    dc = result.get("declare")
    if dc:
        from . import declare

        lines += [declare.table(dc)]
    o = result.get("otel")
    if o:
        from .otel import table as otel_table

        lines += otel_table(o)
    ov = result.get("overload")
    if ov:
        from .overload import table as overload_table

        lines += overload_table(ov)
    h = result.get("hermes")
    if h:
        from .hermes import table as hermes_table

        lines += hermes_table(h)
    g = goals(result, details)
    if (details or {}).get("quick"):
        lines.append("(quick mode: reduced sizes, so the goals are not evaluated)")
    elif g:
        lines += ["**Goals**", "", "| goal | met |", "|---|:---:|"]
        lines += [f"| {GOALS[name]} | {'yes' if ok else '**no**'} |" for name, ok in g.items()]
        lines.append("")
    return "\n".join(lines)


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
