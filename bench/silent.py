"""A silent primary: who answers, and when, against the turn's deadline.

`python -m bench --only silent` (or `python -m bench.silent`) prints the table. The primary
accepts the request and never answers (the most common real outage shape); the fallback
is healthy. Each row is one sync turn, non-streamed and streamed, over real HTTP to the
fault server on loopback: who answered (or the failure), the seconds it took, how far
past the deadline it ended, and the requests each target got. The knobs are the issue's
rows (attempt_timeout / deadline) and the policy's defaults scaled down 40 times (60 s /
120 s -> 1.5 s / 3 s, every other bound and the backoff likewise), so the row runs in
seconds.
"""

from __future__ import annotations

import time
from typing import Any

from fallgate.fsm.policy.model import Target

from fallgate import Fallgate, Policy, TurnFailed
from fallgate.testing import FaultServer

MESSAGES = [{"role": "user", "content": "hi"}]
SCALE = 40


def _scaled_defaults() -> dict[str, Any]:
    """The policy's own defaults (whatever they are on this branch), scaled down."""
    import attrs

    d = {f.name: f.default for f in attrs.fields(Policy) if f.init}
    names = (
        "attempt_timeout",
        "deadline",
        "connect_timeout",
        "first_byte_timeout",
        "first_event_timeout",
        "stream_idle_timeout",
    )
    knobs: dict[str, Any] = {n: float(d[n]) / SCALE for n in names if n in d}
    knobs["backoff"] = {"initial": 0.5 / SCALE, "cap": 8 / SCALE}
    return knobs


_DEFAULTS = _scaled_defaults()
#: The rows: a label and the policy knobs.
ROWS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("1 s / 2.5 s", {"attempt_timeout": 1, "deadline": 2.5}),
    ("1 s / 3 s", {"attempt_timeout": 1, "deadline": 3}),
    ("1 s / 4 s", {"attempt_timeout": 1, "deadline": 4}),
    (
        f"defaults / {SCALE} ({_DEFAULTS['attempt_timeout']:g} s / {_DEFAULTS['deadline']:g} s)",
        _DEFAULTS,
    ),
)


def _backoff(knobs: dict[str, Any]) -> dict[str, Any]:
    from fallgate.fsm.policy.model import Backoff

    out = dict(knobs)
    if "backoff" in out:
        out["backoff"] = Backoff(**out["backoff"])
    return out


def one(knobs: dict[str, Any], *, stream: bool) -> dict[str, Any]:
    """One turn against a silent primary and a healthy fallback."""
    script = {
        "models": {
            "silent": [{"kind": "timeout", "seconds": 30}] * 9,
            "fast": [{"kind": "answer", "text": "fast"}],
        }
    }
    with FaultServer(script) as srv:
        targets = [Target("fault", m, srv.base_url, keyless=True) for m in ("silent", "fast")]
        policy = Policy(targets, **_backoff(knobs))
        with Fallgate(policy) as gate:
            t0 = time.monotonic()
            try:
                if stream:
                    with gate.chat.completions.create(messages=MESSAGES, stream=True) as s:
                        for _ in s:
                            pass
                        ends = [e.source for e in s.trace if e.event == "success"]
                        who = ends[-1] if ends else "?"
                else:
                    who = gate.run(messages=MESSAGES).target
                result = f"answered by {who}"
            except TurnFailed as e:
                result = "TurnFailed: " + str(e).splitlines()[0].split("; ")[-1]
            took = time.monotonic() - t0
        return {
            "result": result,
            "seconds": took,
            "past_deadline": took - float(knobs["deadline"]),
            "primary": srv.count("silent"),
            "fallback": srv.count("fast"),
        }


def measure(log: Any = print) -> list[dict[str, Any]]:
    rows = []
    for label, knobs in ROWS:
        for stream in (False, True):
            log(f"silent primary: {label}, {'stream' if stream else 'plain'} ...")
            rows.append({"knobs": label, "stream": stream, **one(knobs, stream=stream)})
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "**A silent primary, a healthy fallback** (sync; attempt_timeout / deadline)",
        "",
        "| knobs | call | result | seconds | past the deadline | primary requests "
        "| fallback requests |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['knobs']} | {'stream' if r['stream'] else 'plain'} | {r['result']} "
            f"| {r['seconds']:.2f} | {r['past_deadline'] * 1000:+.0f} ms | {r['primary']} "
            f"| {r['fallback']} |"
        )
    lines.append("")
    return lines


def main() -> None:
    print("\n".join(table(measure(log=lambda m: None))))


if __name__ == "__main__":
    main()
