"""What `fallgate health` shows: the shared health of a fleet, read from its store.

Per backend a turn reaches (base URL + model): the breaker (closed, open, half-open with
or without a probe out), seconds left of the open span and of the probe lease, failures
counted in the breaker's window, retry-budget tokens, the round-robin cursor; per
credential (by id: ``env:NAME`` or a fingerprint, never the key), its cooldown. The
records are `fsm.health.records`'s; this module only reads them, and `reset` deletes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...fsm.health import records as fleet
from ...fsm.health.backend import Backend, Record, Records


def _num(r: Mapping[str, Any], field: str, default: float = 0.0) -> float:
    v = r.get(field)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else default


def _left(until: float, now: float) -> float:
    return round(max(0.0, until - now), 3)


def target_name(base_url: str, model: str) -> str:
    """How a backend is named on the command line: ``MODEL@BASE_URL``."""
    return f"{model}@{base_url}"


def breaker_state(r: Record, now: float) -> str:
    if _num(r, "until") > now:
        return "open"
    if _num(r, "opens") > 0:
        return "half-open (probing)" if _num(r, "lease") > now else "half-open"
    return "closed"


def report(backend: Backend) -> dict[str, Any]:
    """Every backend and credential the store knows, as plain data (``--json``)."""
    records, now = backend.scan()
    targets: dict[tuple[str, str], dict[str, Any]] = {}

    def row(base_url: str, model: str) -> dict[str, Any]:
        return targets.setdefault(
            (base_url, model),
            {
                "target": target_name(base_url, model),
                "base_url": base_url,
                "model": model,
                "breaker": "closed",
                "open_seconds_left": 0.0,
                "probe_seconds_left": 0.0,
                "opens": 0,
                "failures": 0,
                "budget_tokens": None,
                "round_robin": None,
                "credentials": [],
            },
        )

    other = 0
    for key, record in sorted(records.items()):
        parsed = fleet.parse_key(key)
        if parsed is None or record is None:
            other += 1
            continue
        (base_url, model), cred = parsed
        out = row(base_url, model)
        if cred is not None:
            until = _num(record, "until")
            out["credentials"].append(
                {
                    "id": cred,
                    "cooling": until > now,
                    "seconds_left": _left(until, now),
                }
            )
            continue
        out["breaker"] = breaker_state(record, now)
        out["open_seconds_left"] = _left(_num(record, "until"), now)
        out["probe_seconds_left"] = _left(_num(record, "lease"), now)
        out["opens"] = int(_num(record, "opens"))
        out["failures"] = int(_num(record, "fails"))
        if "tokens" in record:
            out["budget_tokens"] = round(_num(record, "tokens"), 3)
        if "rr" in record:
            out["round_robin"] = int(_num(record, "rr"))
    return {
        "store": backend.url,
        "targets": [targets[k] for k in sorted(targets)],
        "other_records": other,
    }


def render(data: dict[str, Any]) -> str:
    """The report as a table for a terminal."""
    lines = [f"store: {data['store']}"]
    if not data["targets"]:
        lines.append("no health recorded (every backend closed, every key usable)")
        return "\n".join(lines)
    head = ("target", "breaker", "s left", "failures", "opens", "budget", "rr")
    rows = [head]
    for t in data["targets"]:
        left = t["open_seconds_left"] or t["probe_seconds_left"]
        rows.append(
            (
                t["target"],
                t["breaker"],
                f"{left:.1f}" if left else "-",
                str(t["failures"]),
                str(t["opens"]),
                "full" if t["budget_tokens"] is None else f"{t['budget_tokens']:g}",
                "-" if t["round_robin"] is None else str(t["round_robin"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        lines.append("  ".join(f"{c:<{w}}" for c, w in zip(r, widths, strict=True)).rstrip())
    creds = [(t["target"], c) for t in data["targets"] for c in t["credentials"]]
    if creds:
        lines.append("")
        lines.append("credentials (by id, never the key):")
        for target, c in creds:
            state = f"cooling, {c['seconds_left']:.1f} s left" if c["cooling"] else "usable"
            lines.append(f"  {target}  {c['id']}: {state}")
    if data["other_records"]:
        lines.append(f"({data['other_records']} other record(s) not shown)")
    return "\n".join(lines)


def matching(data: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The targets `name` designates: ``MODEL@BASE_URL`` exactly, or a model name that
    only one stored backend serves; ``all`` for every one."""
    targets: list[dict[str, Any]] = data["targets"]
    if name == "all":
        return targets
    exact = [t for t in targets if t["target"] == name]
    return exact or [t for t in targets if t["model"] == name]


def target_key(base_url: str, model: str) -> str:
    """The record key of a backend."""
    return fleet.target_key((base_url, model))


def reset(backend: Backend, base_url: str, model: str) -> int:
    """Forget one backend's record and its credentials'; returns how many records went.
    (The target record is deleted by its exact key: a prefix would also hit another
    model whose name extends this one's.)"""
    key = fleet.target_key((base_url, model))
    seen: list[bool] = [False]

    def forget(records: Records, now: float) -> Records:
        seen[0] = records.get(key) is not None  # the last (committed) run's view
        return {key: None}

    backend.transact([key], forget, ttl=1.0)
    creds = fleet.credential_key((base_url, model), "")  # every key of this backend
    return int(seen[0]) + backend.delete(creds)
