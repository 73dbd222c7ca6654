"""fallgate inside the real hermes-agent (CI: `make test-hermes`, in build/hermes-venv).

Runs whole conversations of hermes-agent's `AIAgent` offline against fallgate's
fault server, with `fallgate.providers.integrations.hermes.attach(agent)`:

1. the original sequence, streamed (hermes' default path): glm-5.1 answers
   timeout, timeout (a 0.5 s attempt timeout), then 429; glm-4.7 (the agent's
   ``fallback_model``) first answers a tool call, the agent runs the tool, then
   glm-4.7 answers. The conversation ends with glm-4.7's answer; glm-5.1 was
   called 3 times (timeout, timeout, a rebuilt client, 429 -> fallback) and
   glm-4.7 twice (the second model call of the conversation starts at glm-4.7:
   the rate-limited primary is cooling); hermes' own fallback never ran;
2. the same, non-streamed (``agent._disable_streaming``);
3. every target fails (503, then quota): the conversation fails with fallgate's
   reasons in hermes' final message, after exactly one fallgate turn (hermes did
   not retry it, and its fallback refused);
4. hermes' interrupt (``agent.interrupt()`` from another thread) while glm-5.1
   hangs: hermes returns at once, and the turn ends `aborted` without another
   request (no retry, no fallback after the interrupt);
5. control: the same script as 1 with hermes alone (not attached): hermes' own
   fallback fires, which is what 1 checks did not happen.

Prints one line per check and ``check_hermes: N passed, M failed``; exits 1 on
any failure. Run it with the hermes venv's python (``-P``: the repository's
folders must not shadow hermes' top-level packages).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
from harness import FALLBACK, FALLBACK_KEY, PRIMARY, PRIMARY_KEY

ANSWER = "Sunny in Paris, 21 C (glm-4.7)."
ATTEMPT_TIMEOUT = 0.5
QUOTA = {
    "kind": "status",
    "status": 429,
    "body": {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing.",
            "type": "insufficient_quota",
            "code": "insufficient_quota",
        }
    },
}
ORIGINAL = {
    "models": {
        PRIMARY: [
            {"kind": "timeout", "seconds": 5},
            {"kind": "timeout", "seconds": 5},
            {"kind": "status", "status": 429},
        ]
        + [{"kind": "status", "status": 429}] * 5,
        FALLBACK: [
            {
                "kind": "tool_calls",
                "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
            },
            {"kind": "answer", "text": ANSWER},
        ],
    }
}
ALL_FAIL = {
    "models": {
        PRIMARY: [{"kind": "status", "status": 503}] * 9,
        FALLBACK: [QUOTA] * 9,
    }
}
#: The fallgate path of each model call of the original sequence's conversation.
PATHS = [
    [
        "primary",
        "primary_transport_backoff",
        "primary",
        "primary_recovering",
        "primary",
        "fallback_1",
        "done",
    ],
    ["fallback_1", "done"],
]


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


def steps(srv: Any, model: str) -> list[str]:
    return [r.kind for r in srv.requests if r.model == model]


def paths(events: list[Any]) -> list[list[str]]:
    out: list[list[str]] = []
    for e in events:
        if e.source == "idle":
            out.append([])
        out[-1].append(e.dest)
    return out


def attached(srv: Any, stream: bool) -> tuple[Any, Any, list[Any]]:
    from fallgate.providers.integrations.hermes import attach

    agent = harness.make_agent(srv.base_url)
    if not stream:
        agent._disable_streaming = True
    events: list[Any] = []
    att = attach(
        agent,
        {"max_attempts": 2, "attempt_timeout": ATTEMPT_TIMEOUT},
        on_transition=events.append,
    )
    return agent, att, events


def original_sequence(srv: Any, spy: Any, stream: bool) -> str:
    srv.script(ORIGINAL)
    harness.TOOL_CALLS.clear()
    calls_before = spy.calls
    agent, att, events = attached(srv, stream)
    result, seconds = harness.converse(agent, "What is the weather in Paris?")

    expect(not result.get("failed"), f"conversation failed: {result.get('final_response')!r}")
    expect(result.get("final_response") == ANSWER, f"final answer {result.get('final_response')!r}")
    expect(srv.counts == {PRIMARY: 3, FALLBACK: 2}, f"requests per model {srv.counts}")
    expect(steps(srv, PRIMARY) == ["timeout", "timeout", "status"], f"{steps(srv, PRIMARY)}")
    expect(steps(srv, FALLBACK) == ["tool_calls", "answer"], f"{steps(srv, FALLBACK)}")
    expect(all(r.stream is stream for r in srv.requests), "streamed or not as hermes asked")
    keys = {r.model: {x.api_key for x in srv.requests if x.model == r.model} for r in srv.requests}
    expect(keys == {PRIMARY: {PRIMARY_KEY}, FALLBACK: {FALLBACK_KEY}}, f"keys per model {keys}")
    # a real tool round: the agent ran the tool and sent its result to glm-4.7
    expect(harness.TOOL_CALLS == [{"city": "Paris"}], f"tool calls {harness.TOOL_CALLS}")
    second = [r for r in srv.requests if r.model == FALLBACK][1].body
    tool_msgs = [m for m in second.get("messages", []) if m.get("role") == "tool"]
    expect(
        len(tool_msgs) == 1 and "sunny" in str(tool_msgs[0].get("content")),
        f"tool result sent back: {tool_msgs}",
    )
    expect(any(t["function"]["name"] == "get_weather" for t in second.get("tools", [])), "tools")
    # fallgate's path, and hermes' own fallback never ran
    expect(paths(events) == PATHS, f"fallgate paths {paths(events)}")
    expect(spy.calls == calls_before, f"hermes' try_activate_fallback ran {spy.calls}x")
    expect(att.fallback_refusals == 0, f"hermes asked for its fallback {att.fallback_refusals}x")
    expect(not agent._fallback_activated, "hermes marked a fallback active")
    expect((agent.provider, agent.model) == ("zai", PRIMARY), f"agent now {agent.model}")
    att.detach()
    return (
        f"{seconds:.2f}s, requests {dict(srv.counts)}, tool ran once, paths "
        f"{' | '.join(' -> '.join(p) for p in paths(events))}"
    )


def all_targets_fail(srv: Any, spy: Any) -> str:
    srv.script(ALL_FAIL)
    calls_before = spy.calls
    agent, att, events = attached(srv, stream=True)
    result, seconds = harness.converse(agent, "Say hello.")
    final = str(result.get("final_response") or "")
    expect(bool(result.get("failed")), f"conversation did not fail: {result!r:.300}")
    expect("fallgate turn failed" in final, f"fallgate's reasons not in {final!r:.400}")
    expect("primary" in final and "fallback_1" in final, f"per-target reasons: {final!r:.400}")
    # one fallgate turn (503 falls back at once, quota is never retried): hermes
    # neither retried it nor switched provider
    expect(srv.counts == {PRIMARY: 1, FALLBACK: 1}, f"requests per model {srv.counts}")
    expect(len(paths(events)) == 1, f"fallgate turns {paths(events)}")
    expect(spy.calls == calls_before, f"hermes' try_activate_fallback ran {spy.calls}x")
    expect(att.fallback_refusals >= 1, "hermes did not even ask for its fallback")
    att.detach()
    return f"{seconds:.2f}s, requests {dict(srv.counts)}, hermes says: {final.splitlines()[0]!r}"


def interrupted(srv: Any, spy: Any) -> str:
    """hermes' interrupt (``agent.interrupt()`` from another thread) cancels the turn:
    after the attempt in flight, fallgate neither retries nor falls back."""
    srv.script({"models": {PRIMARY: [{"kind": "timeout", "seconds": 5}] * 3}})
    from fallgate.providers.integrations.hermes import attach

    agent = harness.make_agent(srv.base_url)
    events: list[Any] = []
    att = attach(agent, {"max_attempts": 2, "attempt_timeout": 1.5}, on_transition=events.append)
    timer = threading.Timer(0.5, agent.interrupt)
    timer.start()
    result, seconds = harness.converse(agent, "Say hello.")
    timer.join()
    time.sleep(2.0)  # the attempt in flight times out (1.5 s); nothing may follow it
    expect(bool(result.get("interrupted")), f"not interrupted: {result!r:.300}")
    expect(seconds < 1.4, f"hermes returned after {seconds:.2f}s, not at the interrupt")
    expect(srv.counts == {PRIMARY: 1}, f"requests after the interrupt: {srv.counts}")
    expect(events and events[-1].dest == "aborted", f"turn ended {events[-1:]}")
    att.detach()
    return f"{seconds:.2f}s to return, requests {dict(srv.counts)}, turn ended aborted"


def hermes_alone(srv: Any, spy: Any) -> str:
    srv.script(ORIGINAL)
    harness.TOOL_CALLS.clear()
    switches_before = spy.switches
    agent = harness.make_agent(srv.base_url)
    result, seconds = harness.converse(agent, "What is the weather in Paris?")
    expect(spy.switches > switches_before, "hermes' own fallback did not fire")
    expect(agent.model == FALLBACK, f"hermes' model after its fallback: {agent.model}")
    expect(result.get("final_response") == ANSWER, f"{result.get('final_response')!r}")
    return f"{seconds:.2f}s, requests {dict(srv.counts)}, hermes' fallback switched"


def main() -> int:
    t0 = time.monotonic()
    harness.set_up(timeout=1.0)
    from fallgate.testing import FaultServer

    spy = harness.FallbackSpy()
    checks: list[tuple[str, Callable[[Any], str]]] = [
        ("original sequence, streamed", lambda s: original_sequence(s, spy, stream=True)),
        ("original sequence, not streamed", lambda s: original_sequence(s, spy, stream=False)),
        ("every target fails", lambda s: all_targets_fail(s, spy)),
        ("an interrupt cancels the turn", lambda s: interrupted(s, spy)),
        ("control: hermes alone falls back itself", lambda s: hermes_alone(s, spy)),
    ]
    passed = failed = 0
    with FaultServer({"models": {}}) as srv:
        harness.warm(srv.base_url)
        for name, check in checks:
            try:
                detail = check(srv)
            except Exception as e:
                failed += 1
                print(f"FAIL {name}: {e}", flush=True)
                traceback.print_exc()
            else:
                passed += 1
                print(f"ok   {name}: {detail}", flush=True)
    print(f"({time.monotonic() - t0:.1f} s)")
    print(f"check_hermes: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
