"""`python -m bench --quick` runs every benchmark end to end and writes every key.

This is not a timed test: no ratio is asserted (the machines are noisy), only
that each benchmark really ran (requests reached the fault server, turns were
answered, the checker explored states) and that build/bench.json has exactly
the keys issue 6 promises.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the whole benchmark harness in quick mode: a minute and a half

ROOT = Path(__file__).resolve().parents[1]

KEYS = {
    "core": {
        "fallgate_happy_us",
        "tenacity_happy_us",
        "fallgate_fault_us",
        "tenacity_fault_us",
        "bare_loop_fault_us",
    },
    "throughput": {
        "turns",
        "concurrency",
        "fallgate_seconds",
        "bare_sdk_seconds",
        "peak_rss_mb_per_1k_turns",
    },
    "checker": {
        "states",
        "seconds",
        "states_per_second",
        "chain_8x3_states",
        "chain_8x3_seconds",
    },
    "otel": {
        "off_cpu_ms_per_turn",
        "on_cpu_ms_per_turn",
        "ratio",
        "floor_cpu_ms_per_turn",
        "floor_ratio",
        "over_floor_ratio",
        "bare_floor_cpu_ms_per_turn",
        "bare_floor_ratio",
        "over_bare_floor_ratio",
        "core_off_us_per_turn",
        "core_on_us_per_turn",
        "core_ratio",
        "core_ratio_median",
        "core_floor_us_per_turn",
        "core_floor_ratio",
        "core_over_floor_ratio",
    },
}
FAULT_KEYS = {"scenario", "system", "seconds", "requests", "answered", "oracle_seconds"}


@pytest.mark.timeout(300)  # seven sections, a dozen processes: ~2 min on a busy 2-core machine
def test_quick_bench_writes_every_key_of_bench_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())

    assert set(data) == {
        "core", "faults", "throughput", "checker", "otel", "fleet", "storm", "pacing",
    }  # fmt: skip
    for section, keys in KEYS.items():
        assert set(data[section]) == keys, section
    for key in KEYS["core"]:
        assert data["core"][key] > 0, key

    assert data["faults"], "no fault scenario ran"
    for row in data["faults"]:
        assert set(row) == FAULT_KEYS
        assert row["requests"] >= 1, row  # the server really saw the SDK's requests
        assert row["seconds"] > 0
    quota = {r["system"]: r for r in data["faults"]}
    # quota on the primary: fallgate falls back and answers without retrying the primary
    assert quota["fallgate"]["answered"] is True
    assert quota["fallgate"]["requests"] == 2

    tp = data["throughput"]
    assert tp["turns"] > 0 and tp["concurrency"] > 0
    assert tp["fallgate_seconds"] > 0 and tp["bare_sdk_seconds"] > 0

    ck = data["checker"]
    assert ck["states"] > 0 and ck["states_per_second"] > 0

    ot = data["otel"]
    assert all(v > 0 for v in ot.values()), ot

    fl = data["fleet"]
    assert set(fl["stores"]) >= {"per-process", "sqlite"}
    for store in fl["stores"].values():
        # every turn answered by the fallback, the primary reached at least once
        assert store["answered_by_fallback"] == fl["workers"] * fl["turns_per_worker"]
        assert store["primary_requests_in_cooldown"] >= 1
    assert fl["stores"]["per-process"]["primary_requests_in_cooldown"] == fl["workers"]
    if fl["overhead"] is not None:
        assert all(v > 0 for v in fl["overhead"].values()), fl["overhead"]

    st = data["storm"]
    assert {r["system"] for r in st["systems"]} == {"fallgate", "openai SDK (max_retries=2)"}
    sdk = next(r for r in st["systems"] if r["system"] != "fallgate")
    assert sdk["requests"] == 3 * st["turns"]  # the SDK's own 2 retries on every turn

    if data["pacing"]:  # (empty where redis-server is not installed)
        (paced,) = data["pacing"]
        assert paced["system"] == "fallgate+pacing" and paced["failed"] == 0, paced
        assert paced["answered"] > 0 and paced["requests"] >= paced["answered"], paced

    # the tables printed for docs/bench.md name every section
    for heading in (
        "Core overhead",
        "Time to answer under faults",
        "Throughput",
        "Checker",
        "OpenTelemetry overhead",
        "Fleet health",
        "Retry storm",
    ):
        assert heading in proc.stdout
    details = json.loads((tmp_path / "bench-details.json").read_text())
    assert details["quick"] is True
