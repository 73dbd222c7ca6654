"""The diagrams committed under ``diagrams/``: what they show and how they are made.

``make diagrams`` (``python -m fallgate.providers.cli.gallery DIR``) writes them; the
tests regenerate them in memory and fail when a committed file is stale. Without
DIR it writes into the checkout's ``diagrams/``, and only in a checkout: an
installed fallgate has no such directory (and must not write into site-packages).

* ``overview.mmd``: the compact overview of the default policy's machine (the
  primary's phases in full, the fallbacks as one box each), embedded in README.md;
* ``turn-machine.{md,mmd,dot,svg}``: the default policy's whole machine;
* ``scenario-1.{md,dot,svg}``: Scenario 1's path, highlighted, produced by
  running the scenario on the pure core with scripted outcomes (no network);
  ``scenario-1.toml`` and ``scenario-1.trace.jsonl`` are its policy and trace,
  so ``fallgate diagram diagrams/scenario-1.toml --trace
  diagrams/scenario-1.trace.jsonl`` redraws it;
* ``overlay.{md,dot,svg}``: Scenario 1's recorded path overlaid with the path the
  same provider answers take under ``max_attempts = 1`` and ``recover_transport =
  false`` (``scenario-1-at-once.trace.jsonl``: the first timeout falls back, the
  fallback answers at once); `OVERLAY_COMMAND` redraws the DOT.

SVG needs Graphviz's ``dot``; without it the SVG files are left as they are. Written
into the checkout's ``diagrams/``, the pages that embed a diagram (`EMBEDDED`) get the
new text in their first Mermaid block.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from ...fsm import HealthStore, Policy
from ...fsm.clock import VirtualClock
from ...fsm.core.machine import declare
from ...fsm.diagram import overview
from ...fsm.diagram import render as diagram
from ...fsm.host.scripted import play
from ...fsm.policy.defaults import default_policy
from ...fsm.trace import TraceEvent, to_jsonl

#: The checkout's committed diagrams (an editable install maps this file to
#: providers/cli/gallery.py). Installed from a wheel this names a directory that does not
#: exist, inside site-packages: only read it when it exists, never write into it.
DIAGRAMS: Final = Path(__file__).resolve().parents[2] / "diagrams"

#: Scenario 1's chain: glm-5.1 -> glm-4.7, two attempts per target.
SCENARIO_1_POLICY: Final[dict[str, Any]] = {
    "max_attempts": 2,
    "primary": {
        "provider": "zai",
        "model": "glm-5.1",
        "base_url": "https://api.z.ai/api/paas/v4",
        "key_env": "ZAI_API_KEY",
    },
    "fallback_providers": [
        {
            "provider": "zai",
            "model": "glm-4.7",
            "base_url": "https://api.z.ai/api/paas/v4",
            "key_env": "ZAI_API_KEY",
        }
    ],
}

SCENARIO_1_TOML: Final = """\
# Scenario 1: chain glm-5.1 -> glm-4.7, at most 2 attempts per target.
max_attempts = 2

[primary]
provider = "zai"
model = "glm-5.1"
base_url = "https://api.z.ai/api/paas/v4"
key_env = "ZAI_API_KEY"

[[fallback_providers]]
provider = "zai"
model = "glm-4.7"
base_url = "https://api.z.ai/api/paas/v4"
key_env = "ZAI_API_KEY"
"""

SCENARIO_1_INTRO: Final = """\
Scenario 1, played on the pure core with scripted outcomes. An earlier turn
left the fallback's client unbuildable for a moment (its rebuild failed); in this
turn the primary times out twice, its client is rebuilt (transport recovery), and
then it answers 429. The 429 falls back to glm-4.7, which answers.
Calls: glm-5.1 x3, glm-4.7 x1. Highlighted: the states visited and the edges
taken, each labelled with its step number. Graphviz version:
[scenario-1.svg](scenario-1.svg).
"""

DEFAULT_INTRO: Final = """\
The turn machine of fallgate's default policy (`fsm/policy/defaults.py`): a primary
and three fallbacks, two credentials each. Every LLM call runs through exactly
this machine; the diagram is generated from the same declaration that executes
and that the model checker explores (`make diagrams` regenerates it).
The same machine drawn by Graphviz: [turn-machine.svg](turn-machine.svg).
"""


#: What the at-once path changes in Scenario 1's policy.
AT_ONCE_CHANGES: Final[dict[str, Any]] = {"max_attempts": 1, "recover_transport": False}

#: The command that draws the committed overlay (its DOT on stdout; `-o overlay.svg` for SVG).
OVERLAY_COMMAND: Final = (
    "fallgate diagram diagrams/scenario-1.toml --format dot "
    "--trace recorded=diagrams/scenario-1.trace.jsonl "
    "--trace at-once=diagrams/scenario-1-at-once.trace.jsonl"
)

OVERLAY_INTRO: Final = """\
Two paths of Scenario 1's turn on its machine: ① as recorded (two timeouts, a client
rebuild, then a 429 falls back to glm-4.7) and ❶ the path the same provider answers
take under `max_attempts = 1` and `recover_transport = false` (the first timeout
falls back, glm-4.7 answers at once). A state only the recorded path visited is
orange, one only the other visited violet, one both visited orange with a violet
border; an edge both took carries both numerals (and both colours in the Graphviz
version, [overlay.svg](overlay.svg), drawn by `fallgate diagram diagrams/scenario-1.toml
--trace recorded=diagrams/scenario-1.trace.jsonl --trace
at-once=diagrams/scenario-1-at-once.trace.jsonl -o overlay.svg`).
"""


def scenario_1_policy() -> Policy:
    return Policy.from_dict(SCENARIO_1_POLICY, source="scenario 1")


def scenario_1_at_once_trace() -> tuple[TraceEvent, ...]:
    """Scenario 1's provider answers (primary: timeout; fallback: success) played under
    `AT_ONCE_CHANGES`: the first timeout falls back and the fallback answers."""
    policy = Policy.from_dict({**SCENARIO_1_POLICY, **AT_ONCE_CHANGES}, source="at once")
    played = play(policy, ["transport", "success"], random=0.5)
    if played.models != ["glm-5.1", "glm-4.7"] or played.state != "done":
        raise AssertionError(f"the at-once path no longer falls back at once: {played.models}")
    return played.trace


def overlay_paths() -> list[diagram.TracePath]:
    return [
        diagram.TracePath("recorded", scenario_1_trace()),
        diagram.TracePath("at-once", scenario_1_at_once_trace()),
    ]


def scenario_1_trace() -> tuple[TraceEvent, ...]:
    """The trace of Scenario 1's turn, on the pure core (deterministic)."""
    policy = scenario_1_policy()
    health, clock = HealthStore(), VirtualClock()
    # The earlier turn: rate limited on the primary, the fallback's client could
    # not be built (transport faults, then its rebuild failed).
    play(
        policy,
        ["rate_limited:1", "transport", "transport"],
        health=health,
        clock=clock,
        rebuild_ok=False,
        random=0.5,
    )
    clock.advance(60)
    played = play(
        policy,
        ["transport", "transport", "rate_limited", "success"],
        health=health,
        clock=clock,
        random=0.5,
    )
    models = played.models
    if models != ["glm-5.1", "glm-5.1", "glm-5.1", "glm-4.7"] or played.state != "done":
        raise AssertionError(f"scenario 1 no longer takes the expected path: {models}")
    return played.trace


def have_dot() -> bool:
    return shutil.which("dot") is not None


def svg_of(dot_source: str, timeout: float = 30.0) -> bytes:
    """Render DOT to SVG with Graphviz's `dot` (raises FileNotFoundError without it)."""
    return graphviz(dot_source, "svg", timeout)


def graphviz(dot_source: str, fmt: str, timeout: float = 30.0) -> bytes:
    """Render DOT with Graphviz's `dot -T<fmt>` (``svg``, ``png``); raises
    FileNotFoundError without `dot`, RuntimeError when it fails."""
    exe = shutil.which("dot")
    if exe is None:
        raise FileNotFoundError("dot")
    done = subprocess.run(
        [exe, f"-T{fmt}"],
        input=dot_source.encode(),
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"dot failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def sources() -> dict[str, str]:
    """Every committed text diagram, by file name (the SVGs are drawn from the .dot files)."""
    default = declare(default_policy())
    s1 = declare(scenario_1_policy())
    trace = scenario_1_trace()
    return {
        "overview.mmd": overview.to_mermaid_overview(default),
        "turn-machine.md": diagram.to_markdown(default, intro=DEFAULT_INTRO),
        "turn-machine.mmd": diagram.to_mermaid(default),
        "turn-machine.dot": diagram.to_dot(default),
        "scenario-1.md": diagram.to_markdown(
            s1,
            trace,
            title="Scenario 1: a 429 after recovery still falls back",
            intro=SCENARIO_1_INTRO,
        ),
        "scenario-1.dot": diagram.to_dot(
            s1, trace, title="Scenario 1: a 429 after timeouts and recovery falls back"
        ),
        "scenario-1.toml": SCENARIO_1_TOML,
        "scenario-1.trace.jsonl": to_jsonl(trace),
        "scenario-1-at-once.trace.jsonl": to_jsonl(scenario_1_at_once_trace()),
        "overlay.md": diagram.to_markdown(s1, traces=overlay_paths(), intro=OVERLAY_INTRO),
        "overlay.dot": diagram.to_dot(s1, traces=overlay_paths()),
    }


#: Pages of the checkout whose first ```mermaid block is a committed diagram.
EMBEDDED: Final = {"README.md": "overview.mmd", "docs/cli.md": "turn-machine.mmd"}


def embed(root: Path, texts: dict[str, str]) -> list[Path]:
    """Put each `EMBEDDED` diagram's text into its page's first Mermaid block; the
    pages changed."""
    changed = []
    for page, name in EMBEDDED.items():
        path = root / page
        doc = path.read_text(encoding="utf-8")
        start = doc.find("```mermaid\n")
        end = doc.find("```", start + 11) if start >= 0 else -1
        if end < 0:
            continue
        new = doc[: start + 11] + texts[name] + doc[end:]
        if new != doc:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def write(out: Path) -> list[Path]:
    """Write every diagram into `out`; SVGs only when `dot` is installed."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in sources().items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
        if name.endswith(".dot") and have_dot():
            svg = out / (name[:-4] + ".svg")
            svg.write_bytes(svg_of(text))
            written.append(svg)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args and not DIAGRAMS.is_dir():
        print(
            "usage: python -m fallgate.providers.cli.gallery DIR (not in a fallgate checkout, "
            "so there is no diagrams/ to regenerate: name where to write)",
            file=sys.stderr,
        )
        return 2
    out = Path(args[0]) if args else DIAGRAMS
    written = write(out)
    if out.resolve() == DIAGRAMS.resolve():
        written += embed(DIAGRAMS.parent, sources())
    for path in written:
        print(path)
    if not have_dot():
        print(
            "note: Graphviz `dot` not found; SVGs not regenerated (apt-get install graphviz)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
