"""The `fallgate` argument parser: every command's options, help text and handler.

Almost all of it is help text; the handlers live in one module per command family
(diagram, replay, check, serve/demo, providers/health).
"""

from __future__ import annotations

import argparse
from importlib import metadata
from typing import NoReturn

from .check import cmd_check
from .common import EXIT_STATUS_HELP, PROG, USAGE
from .deployment import cmd_health, cmd_providers
from .diagram import FORMATS, cmd_diagram
from .replay import cmd_replay
from .serve import cmd_demo, cmd_serve


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line plus a pointer to --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    try:
        return metadata.version("fallgate")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a checkout
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog=PROG,
        formatter_class=fmt,
        description=(
            "fallgate runs every LLM API call as a declared finite-state machine:\n"
            "retries, timeouts, transport recovery, rate limits, credential rotation\n"
            "and a chain of fallback providers. The same declaration is executed,\n"
            "drawn (diagram) and model-checked (check)."
        ),
        epilog=(
            "examples:\n"
            "  fallgate demo                          # scripted faults, real HTTP, ~2 s\n"
            "  fallgate diagram policy.toml -o machine.svg\n"
            "  fallgate diagram --trace turn.jsonl    # highlight the path of a turn\n"
            "  fallgate diagram p.toml --trace recorded=a.jsonl --trace replayed=b.jsonl\n"
            "  fallgate check policy.toml\n"
            "  fallgate replay turns.jsonl --policy new.toml   # what-if: a new policy, old turns\n"
            "  fallgate providers                     # known providers, which keys are set\n"
            "  fallgate serve --script faults.toml --port 8080\n"
            "  fallgate health --store redis://127.0.0.1:6379/0   # a fleet's shared health\n\n"
            "Run `fallgate COMMAND --help` for the options of each command.\n\n"
            f"{EXIT_STATUS_HELP}"
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser(
        "demo",
        help="play the regression scenarios in docs/design.md against an embedded fault "
        "server and show each turn's path",
        formatter_class=fmt,
        description=(
            "Starts the embedded fault server on 127.0.0.1 (a random free port) and plays\n"
            "the regression scenarios in docs/design.md (1: a 429 after two timeouts and\n"
            "a client rebuild still falls back; 2: Retry-After on the primary; 4: 503 on\n"
            "the primary; 6: context too long; 7: a stream broken after delivery) through\n"
            "fallgate with the real `openai` SDK over real HTTP. Prints every turn's path\n"
            "(state, event, wait, target, elapsed) and writes each path's diagram. Needs\n"
            "no API key and no network beyond loopback; finishes in a few seconds and\n"
            "leaves nothing running."
        ),
        epilog="exit status: 0 when every scenario took its expected path, 1 when one did "
        "not;\n2 for a bad argument, 130 when interrupted.",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print the results as JSON: {"scenarios": [{"name", "final_state", '
        '"calls": [[target, model], ...], "elapsed"}, ...]}',
    )
    p.add_argument(
        "--out",
        default="build/demo",
        metavar="DIR",
        help="where to write each path's diagram (Mermaid .md; .svg when Graphviz is "
        "installed) (default: %(default)s)",
    )
    p.add_argument("--no-diagrams", action="store_true", help="do not write diagrams")
    p.set_defaults(run=cmd_demo)

    p = sub.add_parser(
        "diagram",
        help="draw a policy's turn machine (Mermaid, DOT, SVG or PNG), optionally with a "
        "turn's path",
        formatter_class=fmt,
        description=(
            "Draws the turn machine declared for POLICY (default: the built-in default\n"
            "policy): one box per target of the chain with its phase states, guards on\n"
            "the edges. --overview draws the compact form instead (the primary's phases,\n"
            "each fallback as one box). With --trace, the path a turn took is\n"
            "highlighted, its steps numbered; with --trace twice, two paths of a turn\n"
            "(e.g. recorded and replayed) are overlaid in two colours, what both took\n"
            "in both. Mermaid and DOT need nothing installed; SVG and PNG need\n"
            "Graphviz's `dot`.\n\n"
            "With -o FILE the suffix decides the format: .mmd/.mermaid (Mermaid), .md\n"
            "(Mermaid in Markdown), .dot/.gv (DOT), .svg (SVG), .png (PNG); any other\n"
            "suffix is refused."
        ),
        epilog=EXIT_STATUS_HELP,
    )
    p.add_argument("policy", nargs="?", metavar="POLICY.toml", help="policy file (TOML)")
    p.add_argument(
        "--format",
        "-f",
        choices=FORMATS,
        help="output format (default: from -o's suffix, else mermaid); markdown is "
        "Mermaid inside a Markdown page that renders on GitHub; svg and png need Graphviz",
    )
    p.add_argument(
        "--overview",
        action="store_true",
        help="the compact overview (Mermaid only): the primary's phases in full, every "
        "other target as one box in chain order",
    )
    p.add_argument(
        "--trace",
        action="append",
        metavar="[LABEL=]TRACE.jsonl",
        help="a turn's trace as JSON lines (fallgate.fsm.trace.to_jsonl(result.trace)) "
        "to highlight; give it twice to overlay two paths of a turn (recorded and "
        "replayed), each in its colour, the legend naming each by LABEL or file name",
    )
    p.add_argument(
        "--turn",
        metavar="ID",
        help="the turn of a --trace file that holds several (recorded with "
        "fallgate.record_traces) to highlight, in each --trace file with turn lines "
        "(default: each file's first)",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(run=cmd_diagram)

    p = sub.add_parser(
        "replay",
        help="replay recorded turns under another policy: time, requests and ends compared",
        formatter_class=fmt,
        description=(
            "Feeds what the providers answered in TRACES.jsonl (turns recorded with\n"
            "fallgate.record_traces, trace format 1) to the core of POLICY on a virtual\n"
            "clock, turn by turn in start order with one health store carried across\n"
            "turns, and reports per turn and in total: time to answer, requests per\n"
            "backend, end state, waits, and the difference from the recording. A request\n"
            "on the recorded path gets its recorded answer; off it, the backend's latest\n"
            "recorded answer at or before that time; with none, the --assume rule. Every\n"
            "answer that was not the recorded one is listed as an assumption. Replaying\n"
            "under the recording policy reproduces the recording. (docs/cli.md)"
        ),
        epilog=(
            "examples:\n"
            "  fallgate replay turns.jsonl --policy new.toml\n"
            "  fallgate replay turns.jsonl --policy new.toml --assume fallback_1=success:0.4\n"
            "  fallgate replay turns.jsonl --policy new.toml --assume unknown --json\n\n"
            "exit status:\n"
            "  0    replayed\n"
            "  2    usage or input error: a missing, unreadable or invalid trace or policy,\n"
            "       a trace older than format 1, a policy matching no recorded target,\n"
            "       a bad --assume\n"
            "  130  interrupted (Ctrl-C)"
        ),
    )
    p.add_argument("trace", metavar="TRACES.jsonl", help="recorded turns (trace format 1)")
    p.add_argument(
        "--policy", required=True, metavar="POLICY.toml", help="the policy to replay them under"
    )
    p.add_argument(
        "--assume",
        action="append",
        default=[],
        metavar="[TARGET=]RULE",
        help="what to assume for a request the recording cannot answer: recorded (the "
        "default: the backend's recorded mix and median latency), unknown (stop the turn), "
        "or KIND:SECONDS[:RETRY_AFTER] (success:0.4); TARGET is a target's name "
        "(fallback_1), model, model@base_url or provider; without TARGET, for all others",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the jitter and mix draws")
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"seed", "recorded": {"seconds", "requests", "ends"}, "replayed": '
        '{"seconds", "requests", "ends", "assumptions"}, "turns": [...]}',
    )
    p.set_defaults(run=cmd_replay)

    p = sub.add_parser(
        "check",
        help="model-check a policy: every reachable state, every property",
        formatter_class=fmt,
        description=(
            "Explores every reachable (state, counters, time left) configuration of\n"
            "POLICY's machine (default: the built-in default policy) and checks the\n"
            "checker's properties on every edge (the fallback gate never closes for\n"
            "good, nor does the clock close it; every turn terminates; waits are\n"
            "honest; ...). Prints the states explored and each property by name, held\n"
            "or broken with the shortest outcome sequence that breaks it. With --turns\n"
            "N (2..4) it also runs N concurrent turns on one shared health store, every\n"
            "interleaving, and checks the fleet properties (one half-open probe in\n"
            "flight per target, the retry budget, every open breaker probed in time).\n"
            "(docs/design.md states each property and how it is checked.)"
        ),
        epilog=(
            "exit status:\n"
            "  0    every property holds\n"
            "  1    a property is broken (or the search was cut short)\n"
            "  2    usage or input error: a bad argument, a missing or invalid policy\n"
            "  130  interrupted (Ctrl-C)"
        ),
    )
    p.add_argument("policy", nargs="?", metavar="POLICY.toml", help="policy file (TOML)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--turns",
        type=int,
        default=1,
        metavar="N",
        help="also explore N (2..4) concurrent turns on one shared health store "
        "(1, the default: one turn alone)",
    )
    p.set_defaults(run=cmd_check)

    p = sub.add_parser(
        "serve",
        help="run the fault-injecting OpenAI-compatible server for a script",
        formatter_class=fmt,
        description=(
            "Runs the fault server standalone: an OpenAI-compatible HTTP server\n"
            "(chat completions, streaming and not) that answers each model's requests\n"
            "with that model's next scripted step (answer, status, timeout, drop,\n"
            "stream ... then error|cut). Point any OpenAI client at\n"
            "http://HOST:PORT/v1. Stop it with Ctrl-C."
        ),
    )
    p.add_argument("--script", required=True, metavar="FILE", help="the script (JSON or TOML file)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default: %(default)s; loopback only)",
    )
    p.add_argument(
        "--port", type=_port, default=8080, help="port to listen on (default: %(default)s)"
    )
    p.set_defaults(run=cmd_serve)

    p = sub.add_parser(
        "providers",
        help="list the known providers: base_url, key variables, whether each is set",
        formatter_class=fmt,
        description=(
            "Lists the provider registry a policy's targets resolve against: each\n"
            "provider's default base_url and the environment variables its keys are\n"
            "read from, and whether each variable is set here (never its value).\n"
            "With POLICY.toml, its [providers.<name>] entries are included (marked *)."
        ),
    )
    p.add_argument("policy", nargs="?", metavar="POLICY.toml", help="policy file (TOML)")
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"providers": [{"name", "base_url", "key_envs": [{"name", "set"}], '
        '"keyless", "error_codes", "status_kinds", "errors_in_2xx", "notes", "docs", '
        '"source"}, ...]}',
    )
    p.set_defaults(run=cmd_providers)

    p = sub.add_parser(
        "health",
        help="show (or reset) the health a fleet shares: breakers, budgets, cooldowns",
        formatter_class=fmt,
        description=(
            "Reads a shared health store (SQLite file or Redis) and shows, per backend\n"
            "(MODEL@BASE_URL): the breaker (closed, open, half-open, probing), seconds\n"
            "left, failures in the window, retry-budget tokens and the round-robin\n"
            "cursor; per credential (by id: env:NAME or a fingerprint, never the key)\n"
            "its cooldown. --reset forgets one backend's health (its breaker, budget\n"
            "and its keys' cooldowns), so the next turn tries it at once."
        ),
        epilog=(
            "exit status:\n"
            "  0    shown (or reset)\n"
            "  1    the store cannot be reached\n"
            "  2    usage or input error: a bad store URL, an unknown --reset target\n"
            "  3    the redis package is missing (pip install 'fallgate[redis]')\n"
            "  130  interrupted (Ctrl-C)"
        ),
    )
    p.add_argument(
        "--store",
        required=True,
        metavar="URL",
        help="sqlite:///relative/path.db, sqlite:////absolute/path.db, or "
        "redis://[:password@]host[:port][/db] (rediss://, unix:// too)",
    )
    p.add_argument(
        "--reset",
        metavar="TARGET",
        help="forget the health of TARGET: MODEL@BASE_URL as listed, a model name only "
        "one stored backend serves, or all",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"store", "targets": [{"target", "base_url", "model", "breaker", '
        '"open_seconds_left", "probe_seconds_left", "opens", "failures", "budget_tokens", '
        '"round_robin", "credentials": [{"id", "cooling", "seconds_left"}]}], '
        '"other_records"}',
    )
    p.set_defaults(run=cmd_health)
    return parser


def _port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"port must be between 0 and 65535, not {n}")
    return n
