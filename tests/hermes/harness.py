"""A real hermes-agent `AIAgent`, offline, against fallgate's fault server.

Used by `check_hermes.py` (CI: `make test-hermes`) and by the bench's hermes
worker (`bench/hermes_worker.py`). Runs only in the hermes venv
(build/hermes-venv: hermes-agent plus the fallgate wheel), never in .venv.

- ``HERMES_HOME`` is a fresh temporary folder (no user config, sessions or memory);
- hermes' own timeouts are short and documented knobs (``HERMES_STREAM_READ_TIMEOUT``,
  ``HERMES_API_TIMEOUT``): the fault server's ``timeout`` step hangs, and on a
  loopback URL hermes would otherwise wait its local-server timeout (1800 s);
- the agent gets one tool, ``get_weather`` (registered in hermes' tool registry,
  and ``run_agent.get_tool_definitions`` patched to offer only it), so a model that
  answers a tool call makes the agent run it and call the model again;
- `FallbackSpy` counts calls of hermes' own ``try_activate_fallback`` (the function
  behind ``AIAgent._try_activate_fallback``) and how many switched the provider.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time
from typing import Any

PRIMARY = "glm-5.1"
FALLBACK = "glm-4.7"
WARMUP = "warmup"  # a model no scenario scripts: the server's default answer
PRIMARY_KEY = "sk-hermes-primary"
FALLBACK_KEY = "sk-hermes-fallback"

TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

#: Every call of the tool, as the agent made it.
TOOL_CALLS: list[dict[str, Any]] = []


def set_up(timeout: float = 1.0) -> None:
    """Process-wide, before hermes is imported: a fresh HERMES_HOME, short timeouts."""
    home = tempfile.mkdtemp(prefix="hermes-home-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    os.environ["HERMES_HOME"] = home
    os.environ["HERMES_STREAM_READ_TIMEOUT"] = str(timeout)
    os.environ["HERMES_API_TIMEOUT"] = str(timeout)

    import run_agent
    from tools.registry import registry

    def get_weather(args: dict[str, Any], **_: Any) -> str:
        TOOL_CALLS.append(dict(args))
        return json.dumps({"city": args.get("city"), "forecast": "sunny, 21 C"})

    registry.register(
        name="get_weather",
        toolset="fallgate_check",
        schema=TOOL["function"],
        handler=get_weather,
    )
    run_agent.get_tool_definitions = lambda *a, **k: [TOOL]


def make_agent(base_url: str, *, model: str = PRIMARY, fallback: bool = True) -> Any:
    """The issue's agent: provider zai, glm-5.1, glm-4.7 as ``fallback_model``."""
    import run_agent

    chain = (
        [{"provider": "zai", "model": FALLBACK, "base_url": base_url, "api_key": FALLBACK_KEY}]
        if fallback
        else None
    )
    return run_agent.AIAgent(
        api_key=PRIMARY_KEY,
        base_url=base_url,
        provider="zai",
        model=model,
        quiet_mode=True,
        skip_context_files=True,
        skip_memory=True,
        fallback_model=chain,
    )


def warm(base_url: str) -> None:
    """One conversation on an unscripted model: hermes' first one pays ~2 s of lazy
    imports and set-up that are no part of any turn."""
    agent = make_agent(base_url, model=WARMUP, fallback=False)
    agent.run_conversation("Say hi.")
    agent.close()


class FallbackSpy:
    """Counts hermes' own fallback: calls of ``try_activate_fallback`` and switches."""

    def __init__(self) -> None:
        import agent.chat_completion_helpers as helpers

        self.calls = 0
        self.switches = 0
        original = helpers.try_activate_fallback

        def spy(agent: Any, reason: Any = None) -> bool:
            self.calls += 1
            switched = bool(original(agent, reason))
            self.switches += switched
            return switched

        helpers.try_activate_fallback = spy


def converse(agent: Any, text: str) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    result = agent.run_conversation(text)
    return result, time.perf_counter() - t0
