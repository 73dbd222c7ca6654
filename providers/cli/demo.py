"""`fallgate demo`: the regression scenarios, real `openai` SDK, embedded fault server.

Starts the embedded fault server on loopback, plays each scenario's script
through `providers.Fallgate` (real HTTP, real timeouts, real sleeps — kept
short by the demo policies), prints every turn's path as a table and writes
its diagram with the path highlighted. Everything it starts it stops: the
server, its threads and every client are closed before it returns.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import attrs
import openai

from ...fsm import Policy, Target, TurnFailed
from ...fsm.core.machine import declare
from ...fsm.diagram import render as diagram
from ...fsm.trace import TraceEvent
from ..openai.client import Fallgate
from ..testing.fault_server import FaultServer
from .common import CliError

MSG = [{"role": "user", "content": "Say hello."}]

#: Demo policies keep every real wait short so the whole demo takes a few seconds; an
#: attempt's 1 s bound leaves a busy machine's answers their time.
FAST: dict[str, Any] = {
    "attempt_timeout": 1.0,
    "backoff": {"initial": 0.05, "multiplier": 2.0, "cap": 0.2},
}


@attrs.frozen
class Scenario:
    """One scripted turn: the chain, what each model does, what should happen."""

    name: str
    title: str
    chain: tuple[tuple[str, int | None], ...]  # (model, context_length)
    script: dict[str, list[dict[str, Any]]]
    expect_state: str
    expect_calls: tuple[str, ...]  # models, in call order
    settings: dict[str, Any] = attrs.field(factory=dict)
    stream: bool = False
    prefixed: tuple[str, ...] = ()  # models that take an assistant prefix (continue a stream)
    earlier: bool = False  # scenario 1: an earlier turn whose fallback client could not be built

    def policy(self, base_url: str) -> Policy:
        targets = [
            {
                "provider": "fault-server",
                "model": model,
                "base_url": base_url,
                "api_key": f"sk-demo-{model}-0000",
                **({"context_length": ctx} if ctx else {}),
                **({"assistant_prefix": True} if model in self.prefixed else {}),
            }
            for model, ctx in self.chain
        ]
        data = {"targets": targets, **FAST, **self.settings}
        return Policy.from_dict(data, source=f"demo scenario {self.name}")


_CTX_ERROR = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens; "
        "your messages resulted in 9120 tokens.",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
}

#: The whole reply of the continued stream: its first 16 characters came before the break.
CONTINUED = "Once upon a time there was a gate that never closed."

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="scenario-1",
        title="Scenario 1: a 429 after two timeouts and a client rebuild still falls back",
        chain=(("glm-5.1", None), ("glm-4.7", None)),
        script={
            "glm-5.1": [
                {"kind": "timeout", "seconds": 5},
                {"kind": "timeout", "seconds": 5},
                {"kind": "status", "status": 429},
            ],
            "glm-4.7": [{"kind": "answer", "text": "Hello from glm-4.7."}],
        },
        expect_state="done",
        expect_calls=("glm-5.1", "glm-5.1", "glm-5.1", "glm-4.7"),
        settings={"max_attempts": 2},
        earlier=True,
    ),
    Scenario(
        name="retry-after",
        title="Scenario 2: 429 with Retry-After: 171 on the primary; the fallback answers now",
        chain=(("gpt-4.1", None), ("glm-4.7", None)),
        script={
            "gpt-4.1": [{"kind": "status", "status": 429, "headers": {"retry-after": "171"}}],
            "glm-4.7": [{"kind": "answer", "text": "Hello without waiting 171 s."}],
        },
        expect_state="done",
        expect_calls=("gpt-4.1", "glm-4.7"),
    ),
    Scenario(
        name="overloaded",
        title="Scenario 4: 503 on the primary (scripted 3x, 3 attempts allowed); the free fallback "
        "answers at once",
        chain=(("gpt-4.1", None), ("glm-4.7", None)),
        script={
            "gpt-4.1": [{"kind": "status", "status": 503}] * 3,
            "glm-4.7": [{"kind": "answer", "text": "Hello from the fallback."}],
        },
        expect_state="done",
        expect_calls=("gpt-4.1", "glm-4.7"),
        settings={"max_attempts": 3},
    ),
    Scenario(
        name="context-too-long",
        title="Scenario 6: context too long on the 8k primary; skips the 4k fallback, 128k answers",
        chain=(("small-8k", 8192), ("tiny-4k", 4096), ("large-128k", 131072)),
        script={
            "small-8k": [{"kind": "status", "status": 400, "body": _CTX_ERROR}],
            "tiny-4k": [{"kind": "answer", "text": "(never asked)"}],
            "large-128k": [{"kind": "answer", "text": "Hello from the 128k model."}],
        },
        expect_state="done",
        expect_calls=("small-8k", "large-128k"),
    ),
    Scenario(
        name="silent-primary",
        title="A silent primary (accepts the request, never answers): the fallback gets its time",
        chain=(("gpt-4.1", None), ("glm-4.7", None)),
        script={
            "gpt-4.1": [{"kind": "timeout", "seconds": 5}] * 3,
            "glm-4.7": [{"kind": "answer", "text": "Hello in time from the fallback."}],
        },
        expect_state="done",
        expect_calls=("gpt-4.1", "glm-4.7"),
        # a retry (backoff <= 0.2 s, then 1 s) would leave the fallback less than its
        # 1 s attempt before the deadline: the time reserve falls back after one
        settings={"max_attempts": 3, "deadline": 3.0},
    ),
    Scenario(
        name="stream-broken",
        title="Scenario 7: a stream breaks after three chunks were delivered; no replay",
        chain=(("gpt-4.1", None), ("glm-4.7", None)),
        script={
            "gpt-4.1": [
                {"kind": "stream", "chunks": ["Once ", "upon ", "a time"], "then": "error"}
            ],
            "glm-4.7": [{"kind": "answer", "text": "(never asked: the stream was committed)"}],
        },
        expect_state="failed",
        expect_calls=("gpt-4.1",),
        stream=True,
    ),
    Scenario(
        name="stream-continued",
        title="Scenario 8: a stream breaks after three chunks; a fallback that takes an "
        "assistant prefix continues it from where it broke",
        chain=(("gpt-4.1", None), ("mistral-large", None)),
        script={
            "gpt-4.1": [
                {"kind": "stream", "chunks": ["Once ", "upon ", "a time"], "then": "error"}
            ],
            "mistral-large": [{"kind": "continue", "text": CONTINUED}],
        },
        expect_state="done",
        expect_calls=("gpt-4.1", "mistral-large"),
        stream=True,
        prefixed=("mistral-large",),
    ),
)


@attrs.frozen
class Outcome:
    """What one scenario's turn did."""

    scenario: Scenario
    final_state: str
    calls: tuple[tuple[str, str], ...]  # (target, model) per attempt
    elapsed: float
    trace: tuple[TraceEvent, ...]
    requests: dict[str, int]  # requests the fault server received, per model
    answer: str = ""
    partial: str | None = None
    failure: str = ""
    earlier: str = ""
    policy: Policy | None = attrs.field(default=None, repr=False, eq=False)

    @property
    def ok(self) -> bool:
        s = self.scenario
        models = tuple(m for _, m in self.calls)
        served = tuple(m for m in s.expect_calls)
        counted = {m: served.count(m) for m in set(served)}
        return self.final_state == s.expect_state and models == served and self.requests == counted

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.scenario.name,
            "title": self.scenario.title,
            "final_state": self.final_state,
            "calls": [list(c) for c in self.calls],
            "elapsed": round(self.elapsed, 3),
            "ok": self.ok,
        }


def _calls(trace: Sequence[TraceEvent]) -> tuple[tuple[str, str], ...]:
    return tuple(
        (e.target, e.model)
        for e in trace
        if e.action == "Attempt" and e.target is not None and e.model is not None
    )


def _factory(broken: set[str]) -> Callable[[Target, str], openai.OpenAI]:
    """The real client factory, except for models whose client 'cannot be built' now."""

    def build(t: Target, key: str) -> openai.OpenAI:
        if t.model in broken:
            raise OSError(
                "could not create the HTTP client (simulated: file descriptors exhausted)"
            )
        return openai.OpenAI(base_url=t.base_url, api_key=key, max_retries=0, timeout=5.0)

    return build


def run_scenario(server: FaultServer, s: Scenario) -> Outcome:
    policy = s.policy(server.base_url)
    broken: set[str] = set()
    earlier = ""
    with Fallgate(policy, client_factory=_factory(broken)) as gate:
        if s.earlier:
            # An earlier turn: the primary drops, and the eager fallback's client
            # cannot be built. That must leave nothing behind for the next turn.
            broken.add(s.chain[1][0])
            server.script({"models": {s.chain[0][0]: [{"kind": "drop"}] * 3}})
            try:
                gate.run(messages=MSG)
                earlier = "an earlier turn unexpectedly succeeded"
            except TurnFailed as e:
                built = "could not be built" in e.reasons.get("fallback_1", "")
                earlier = (
                    f"an earlier turn ended {e.state}"
                    + (" (fallback_1's client could not be built)" if built else "")
                    + "; nothing of it carries over into this turn:"
                )
            broken.clear()
        server.script({"models": s.script})
        t0 = time.perf_counter()
        answer, partial, failure = "", None, ""
        try:
            if s.stream:
                parts: list[str] = []
                stream = gate.chat.completions.create(messages=MSG, stream=True)
                with stream:
                    for chunk in stream:
                        for choice in chunk.choices:
                            parts.append(choice.delta.content or "")
                answer = "".join(parts)
                trace: tuple[TraceEvent, ...] = tuple(stream.trace)
                state = stream.state
            else:
                result = gate.run(messages=MSG)
                answer = result.value.choices[0].message.content or ""
                trace, state = result.trace, result.state
        except TurnFailed as e:
            trace, state, partial = e.trace, e.state, e.partial
            failure = e.summary
        elapsed = time.perf_counter() - t0
    return Outcome(
        s,
        state,
        _calls(trace),
        elapsed,
        trace,
        dict(server.counts),
        answer,
        partial,
        failure,
        earlier,
        policy,
    )


def run_all(scenarios: Sequence[Scenario] = SCENARIOS) -> list[Outcome]:
    """Run every scenario against one embedded fault server; stops it before returning."""
    out = []
    with FaultServer() as server:
        for s in scenarios:
            out.append(run_scenario(server, s))
    return out


# -- printing -----------------------------------------------------------------------------------


def _fmt_wait(w: float | None) -> str:
    if w is None:
        return ""
    return f"{w * 1000:.0f}ms" if w < 1 else f"{w:.2f}s"


def _observed(e: TraceEvent, width: int = 48) -> str:
    """What the last call produced, from the trace's detail, shortened for the table."""
    text = e.detail
    if e.action == "Wait" and "; " in text:
        text = text.rsplit("; ", 1)[0]  # the wait's reason: the table shows the wait
    for prefix in (f"{e.source} ended with {e.event}", e.event):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    text = text.lstrip(":, ").replace("scripted ", "")
    m = re.match(r"^\((HTTP \d+)\)([^:]*)(?:: (.*))?$", text)
    if m:
        status, extra, rest = m.group(1), m.group(2), m.group(3) or ""
        text = status + extra + ("" if rest in ("", status) else f": {rest}")
    return text if len(text) <= width else text[: width - 3] + "..."


def _next(e: TraceEvent) -> str:
    target = f"{e.target} ({e.model})" if e.target else ""
    if e.action == "Attempt":
        return f"call {target}"
    if e.action == "Wait":
        if not e.wait:
            return "no sleep: the failed attempt already took the backoff"
        return f"sleep {_fmt_wait(e.wait)}"
    if e.action == "Rebuild":
        return f"rebuild {e.target}'s client"
    return {"Finish": "return the answer", "Fail": "raise TurnFailed"}.get(e.action, e.action)


def table(trace: Sequence[TraceEvent]) -> list[str]:
    """The path as a readable table: step, elapsed, event, new state, wait, what comes next."""
    rows = [("#", "elapsed", "event", "observed", "-> state", "wait", "next")]
    for e in trace:
        rows.append(
            (
                str(e.seq),
                f"{e.time:.3f}s",
                e.event,
                _observed(e),
                e.dest,
                _fmt_wait(e.wait),
                _next(e),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {0, 1, 5}
    lines = []
    for r in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("   " + "  ".join(cells).rstrip())
    return lines


def _calls_text(calls: Sequence[tuple[str, str]]) -> str:
    counts: dict[str, int] = {}
    for _, m in calls:
        counts[m] = counts.get(m, 0) + 1
    return ", ".join(f"{m} x{n}" for m, n in counts.items())


def report(o: Outcome, files: Sequence[Path], stream: TextIO) -> None:
    s = o.scenario
    p = o.policy
    mark = "ok" if o.ok else "UNEXPECTED"
    print(f"== {s.title}", file=stream)
    if p is not None:
        chain = " -> ".join(
            f"{t.name} {t.model}" + (f" [{t.context_length // 1024}k]" if t.context_length else "")
            for t in p.targets
        )
        most = p.max_attempts
        print(f"   chain: {chain}; max {most} attempt{'s' * (most != 1)} per target", file=stream)
    if o.earlier:
        print(f"   {o.earlier}", file=stream)
    for line in table(o.trace):
        print(line, file=stream)
    if o.final_state == "done":
        how = f"answered {o.answer!r}"
    elif o.partial is not None:
        k = len(o.partial)
        chars = f"{k} character{'' if k == 1 else 's'}"
        how = f"the caller keeps the {chars} delivered: {o.partial!r}"
    else:
        how = o.failure
    n = sum(o.requests.values())
    print(f"   => {o.final_state} after {o.elapsed:.2f}s: {how}", file=stream)
    called = {m for _, m in o.calls}
    skipped = [t.model for t in p.targets if t.model not in called] if p is not None else []
    print(
        f"   calls: {_calls_text(o.calls)}"
        + (f" (never called: {', '.join(skipped)})" if skipped else "")
        + f"; the server saw {n} request{'s' if n != 1 else ''} [{mark}]",
        file=stream,
    )
    if files:
        print(f"   diagram: {', '.join(str(f) for f in files)}", file=stream)
    print(file=stream)


#: Printed after the demo when Graphviz's `dot` is missing (the diagrams are Mermaid only).
NO_DOT_HINT = (
    "No SVG diagrams: Graphviz's `dot` is not installed. To get them: "
    "apt-get install graphviz (macOS: brew install graphviz), then make diagrams."
)


def write_diagram(o: Outcome, out: Path) -> list[Path]:
    """The path of one scenario as Markdown (Mermaid) and, with Graphviz, SVG."""
    assert o.policy is not None
    decl = declare(o.policy)
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{o.scenario.name}.md"
    md.write_text(diagram.to_markdown(decl, o.trace, title=o.scenario.title), encoding="utf-8")
    files = [md]
    if shutil.which("dot"):
        from .gallery import svg_of

        svg = out / f"{o.scenario.name}.svg"
        try:
            svg.write_bytes(svg_of(diagram.to_dot(decl, o.trace, title=o.scenario.title)))
            files.append(svg)
        except (RuntimeError, OSError):
            pass
    return files


def demo_main(as_json: bool = False, out: Path = Path("build/demo"), diagrams: bool = True) -> int:
    """`fallgate demo`; 0 when every scenario took its expected path."""
    t0 = time.perf_counter()
    if diagrams:  # before the scenarios run: a bad --out is said at once, nothing lost
        try:
            out.mkdir(parents=True, exist_ok=True)
            probe = out / ".fallgate-demo-write-check"
            probe.write_bytes(b"")  # an existing directory may still not take files
            probe.unlink()
        except OSError as e:
            raise CliError(
                f"cannot write the diagrams to {out}: {e.strerror or e} (give --out a "
                "directory, or --no-diagrams)"
            ) from None
    # the demo prints each turn's path itself: the WARNINGs it would log say it again
    quiet = logging.getLogger("fallgate")
    level, quiet.level = quiet.level, logging.ERROR
    try:
        outcomes = run_all()
    finally:
        quiet.level = level
    written: dict[str, list[Path]] = {}
    for o in outcomes:
        try:
            written[o.scenario.name] = write_diagram(o, out) if diagrams else []
        except OSError as e:  # the directory went away or filled up: the report still shows
            print(
                f"fallgate: cannot write {o.scenario.name}'s diagram: {e.strerror or e}",
                file=sys.stderr,
            )
            written[o.scenario.name] = []
    if as_json:
        rows = ",\n".join(f"    {json.dumps(o.as_json())}" for o in outcomes)
        print(f'{{"scenarios": [\n{rows}\n]}}')
    else:
        print(
            "fallgate demo: each turn runs through fallgate with the real openai SDK over\n"
            "real HTTP against a scripted fault server on 127.0.0.1 (no API keys, no internet).\n"
        )
        for o in outcomes:
            report(o, written[o.scenario.name], sys.stdout)
        good = sum(o.ok for o in outcomes)
        print(
            f"{good}/{len(outcomes)} scenarios took their expected path "
            f"in {time.perf_counter() - t0:.1f}s."
        )
        if diagrams and not shutil.which("dot"):
            print(NO_DOT_HINT)
    return 0 if all(o.ok for o in outcomes) else 1
