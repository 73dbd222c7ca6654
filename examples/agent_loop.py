"""A small agent loop through fallgate: one tool, streamed answers, a fallback chain.

    export OPENAI_API_KEY=... OPENROUTER_API_KEY=... GROQ_API_KEY=...
    python examples/agent_loop.py "What is the weather in Paris?"

    # Every target of the chain sent to one OpenAI-compatible server instead, e.g.
    # fallgate's fault server (`fallgate serve --script faults.toml --port 8080`):
    python examples/agent_loop.py --base-url http://127.0.0.1:8080/v1 "..."

The chain (a primary and two fallbacks) and every retry, timeout and fallback
rule come from examples/policy.toml (`--policy` for another file). The loop is
the one you would write with the plain `openai` SDK: `fallgate.Fallgate` has the
same `chat.completions.create`, and each call through it is one fallgate *turn*
that may try several targets before an answer comes back.

The conversation goes to stdout; fallgate's transitions (which target was
tried, what went wrong, where the turn went next) go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fallgate

POLICY = Path(__file__).resolve().parent / "policy.toml"

SYSTEM = "You are a helpful assistant. Use the get_weather tool for weather questions."

# -- the tool ------------------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "e.g. Paris"}},
                "required": ["city"],
            },
        },
    }
]


def get_weather(city: str) -> dict[str, Any]:
    """A stand-in for a real weather API."""
    return {"city": city, "forecast": "sunny", "temperature_c": 21}


TOOL_FUNCTIONS: dict[str, Callable[..., Any]] = {"get_weather": get_weather}


def run_tool(name: str, arguments: str) -> Any:
    """Call one tool; a bad call is reported back to the model, not raised."""
    function = TOOL_FUNCTIONS.get(name)
    if function is None:
        return {"error": f"no tool named {name!r}"}
    try:
        return function(**json.loads(arguments or "{}"))
    except (json.JSONDecodeError, TypeError) as e:
        return {"error": f"bad arguments for {name}: {e}"}


# -- the policy ----------------------------------------------------------------------------------


def load_policy(path: Path, base_url: str | None) -> fallgate.Policy:
    """The policy file; with `base_url`, the same policy with every target sent there.

    Keys always come from the environment variables the file names: fallgate
    reads them at each request and never prints them."""
    if base_url is None:
        # Validated on load: a bad field raises PolicyError naming the file and line.
        return fallgate.Policy.from_toml(path)
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    for target in [
        data.get("primary"),
        *data.get("targets", ()),
        *data.get("fallback_providers", ()),
    ]:
        if isinstance(target, dict):
            target["base_url"] = base_url
    return fallgate.Policy.from_dict(data, source=f"{path} (base_url={base_url})")


def show_transition(ev: Any) -> None:
    """fallgate calls this on every move of a turn's state machine, with a `TraceEvent`:
    where the turn was, what happened, where it went, and what it does next.

    `ev.credential` is the key's id (``env:OPENAI_API_KEY``), never the key."""
    if ev.action == "Attempt":
        then = f"call {ev.model} with key {ev.credential}"
    elif ev.action == "Wait":
        then = f"wait {ev.wait or 0:.1f}s"
    elif ev.action == "Rebuild":
        then = f"rebuild {ev.target}'s client"
    else:  # Finish, Fail
        then = ev.action.lower()
    why = f" ({ev.detail})" if ev.detail else ""
    print(f"  [fallgate] {ev.source} --{ev.event}--> {ev.dest}: {then}{why}", file=sys.stderr)


# -- one model call, streamed --------------------------------------------------------------------


def stream_reply(client: fallgate.Fallgate, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Ask the model, printing its text as it arrives; the assistant message it wrote
    (text and tool calls), ready to append to the conversation."""
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    # One fallgate turn. Before the first chunk reaches us, any failure (a 429, a
    # 5xx, a timeout, a dropped connection) is handled by the policy: rotate to the
    # primary's second key, fall back to the next provider, or wait out a short
    # Retry-After. We never see those failures; we see chunks from whichever target
    # answered. `model=` is not passed: fallgate sends each target's own model.
    with client.chat.completions.create(messages=messages, tools=TOOLS, stream=True) as stream:
        for chunk in stream:  # the SDK's own ChatCompletionChunk objects
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            if delta.content:
                print(delta.content, end="", flush=True)
                text.append(delta.content)
            # Tool calls arrive in pieces: the id and name first, then the arguments.
            for piece in delta.tool_calls or ():
                call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = piece.id or call["id"]
                if piece.function is not None:
                    call["name"] += piece.function.name or ""
                    call["arguments"] += piece.function.arguments or ""
        # The stream ended well: the turn is done, and its result says who answered.
        result = stream.result
    if text:
        print()
    if result is not None:
        print(f"[answered by {result.target} ({result.model}) after {result.attempts} attempt(s)]")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for _, c in sorted(calls.items())
        ]
    return message


# -- the loop ------------------------------------------------------------------------------------


def agent(client: fallgate.Fallgate, question: str, max_steps: int) -> int:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    print(f"> {question}")
    for _ in range(max_steps):
        try:
            message = stream_reply(client, messages)
        except fallgate.TurnFailed as e:
            # Every target of the chain failed (or the deadline ran out). `e` says why
            # each one did not answer; a stream that broke after text reached us is
            # never replayed elsewhere: e.partial is exactly what we already printed.
            print(f"\n[no answer] {e}", file=sys.stderr)
            return 1
        messages.append(message)
        if "tool_calls" not in message:
            return 0  # a final answer
        for call in message["tool_calls"]:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            result = run_tool(name, arguments)
            print(f"[tool] {name}({arguments}) -> {json.dumps(result)}")
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
            )
        # The next call is a new turn. It starts at the first target that is not
        # cooling down: if the primary answered 429 with a Retry-After, its keys stay
        # benched until then (in the client's health store) and this turn starts
        # further down the chain, without a wasted request.
    print(f"[gave up after {max_steps} model calls]", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("question", nargs="?", default="What is the weather in Paris?")
    parser.add_argument("--policy", type=Path, default=POLICY, help="policy file (TOML)")
    parser.add_argument(
        "--base-url",
        help="send every target of the chain to this OpenAI-compatible base URL "
        "(e.g. a local fault server), keeping each target's model and key variable",
    )
    parser.add_argument("--max-steps", type=int, default=5, help="model calls at most")
    args = parser.parse_args(argv)
    try:
        policy = load_policy(args.policy, args.base_url)
    except fallgate.PolicyError as e:
        print(e, file=sys.stderr)
        return 2
    # One client for the whole conversation: its health store remembers cooldowns
    # between turns; it builds one openai client per (target, key), with the SDK's
    # own retries off (fallgate decides every retry).
    with fallgate.Fallgate(policy, on_transition=show_transition) as client:
        return agent(client, args.question, args.max_steps)


if __name__ == "__main__":
    sys.exit(main())
