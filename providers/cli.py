"""The `fallgate` command line: demo, diagram, check, serve, providers, health.

Every failure a user can cause (a bad argument, a missing or malformed file,
an invalid policy, a missing system tool) ends with a short message on stderr
and a non-zero exit status, never a traceback. Set ``FALLGATE_DEBUG=1`` to
see the traceback of an unexpected internal error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

from ..fsm import Policy, PolicyError, diagram, overview, registry
from ..fsm.machine import declare
from ..fsm.textfile import UnreadableFile, read_text
from ..fsm.trace import TraceEvent, from_jsonl

PROG = "fallgate"

#: Exit statuses: 0 success; 1 the command ran and failed (a property is broken, a demo
#: scenario left its expected path, an output could not be written, the health store
#: cannot be reached); 2 a usage or input
#: error (a bad argument, a missing or invalid policy, trace or script file, an unsupported
#: output suffix); 3 a needed system tool (Graphviz's `dot`) is missing; 130 interrupted.
OK, FAILED, USAGE, MISSING_TOOL, INTERRUPTED = 0, 1, 2, 3, 130

EXIT_STATUS_HELP = """\
exit status:
  0    success
  1    the command ran and failed: a property is broken (check), a scenario
       took an unexpected path (demo), an output could not be written, the
       health store cannot be reached (health)
  2    usage or input error: a bad argument; a missing, unreadable or invalid
       policy, trace or script file; an unsupported output file suffix; a bad
       store URL or an unknown target to reset (health)
  3    a needed system tool is missing (Graphviz's `dot` for SVG and PNG)
  130  interrupted (Ctrl-C)"""

FORMATS = ("mermaid", "markdown", "dot", "svg", "png")
#: Output file suffix -> format; any other suffix is refused (it would get the wrong bytes).
SUFFIX_FORMAT = {
    ".mmd": "mermaid",
    ".mermaid": "mermaid",
    ".md": "markdown",
    ".dot": "dot",
    ".gv": "dot",
    ".svg": "svg",
    ".png": "png",
}
#: What each format is, for messages.
FORMAT_WORDS = {
    "mermaid": "Mermaid",
    "markdown": "Mermaid in Markdown",
    "dot": "Graphviz DOT",
    "svg": "SVG, needs Graphviz",
    "png": "PNG, needs Graphviz",
}


def supported_suffixes() -> str:
    """``.mmd/.mermaid (Mermaid), .md (Mermaid in Markdown), ...`` for messages."""
    by_format: dict[str, list[str]] = {}
    for suffix, fmt in SUFFIX_FORMAT.items():
        by_format.setdefault(fmt, []).append(suffix)
    return ", ".join(f"{'/'.join(sfx)} ({FORMAT_WORDS[f]})" for f, sfx in by_format.items())


def graphviz_hint(fmt: str) -> str:
    """One line: the format needs Graphviz's `dot`, and how to get it (or do without)."""
    return (
        f"{fmt.upper()} output needs Graphviz's `dot`, which is not installed: install it "
        "(Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz) "
        "or use --format mermaid|dot"
    )



class CliError(Exception):
    """A user-facing failure: printed as one message, exit status `code`."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line plus a pointer to --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -- policy and trace loading -------------------------------------------------------------------


def default_policy() -> Policy:
    """The policy used when no file is given (the checker's, if it defines one)."""
    try:
        checker = importlib.import_module("fallgate.fsm.checker")
    except ImportError:
        checker = None
    make = getattr(checker, "default_policy", None)
    if callable(make):
        policy = make()
        if isinstance(policy, Policy):
            return policy
    from ..fsm.defaults import default_policy as builtin

    return builtin()


def load_policy(path: str | None) -> Policy:
    if path is None:
        return default_policy()
    p = Path(path)
    if not p.exists():
        raise CliError(f"policy file not found: {path}", USAGE)
    if p.is_dir():
        raise CliError(f"policy path is a directory, not a TOML file: {path}", USAGE)
    try:
        return Policy.from_toml(p)
    except PolicyError as e:
        raise CliError(str(e), USAGE) from None


#: The largest trace file read (bytes): a turn's trace is a few kB.
MAX_TRACE_BYTES = 16 << 20


def load_trace(path: str) -> list[TraceEvent]:
    if not Path(path).exists():
        raise CliError(f"trace file not found: {path}", USAGE)
    try:
        text = read_text(path, MAX_TRACE_BYTES)
    except UnreadableFile as e:
        raise CliError(f"cannot read trace file {path}: {e.reason}", USAGE) from None
    try:
        events = from_jsonl(text)
    except (ValueError, TypeError) as e:
        raise CliError(f"{path}: {e}", USAGE) from None
    except RecursionError:
        raise CliError(f"{path}: nested too deeply to be a trace", USAGE) from None
    if not events:
        raise CliError(
            f"{path}: the trace is empty (expected JSON lines, one per transition)", USAGE
        )
    return events


# -- subcommands --------------------------------------------------------------------------------


def output_format(fmt: str | None, output: str | None) -> str:
    """The format to write: the output file's suffix, else --format, else Mermaid.

    Writing to a file, the suffix decides and must be one we write (a .png gets PNG
    bytes, never Mermaid text); --format, when also given, must agree with it.
    """
    if not output or output == "-":
        return fmt or "mermaid"
    suffix = Path(output).suffix.lower()
    implied = SUFFIX_FORMAT.get(suffix)
    if implied is None:
        what = f"suffix {suffix}" if suffix else "no suffix"
        raise CliError(
            f"cannot write a diagram to {output} ({what}): the output file's suffix "
            f"must be one of {supported_suffixes()}",
            USAGE,
        )
    if fmt is not None and fmt != implied:
        raise CliError(
            f"--format {fmt} does not match {output} ({suffix} is {implied}): "
            "drop --format or change the suffix",
            USAGE,
        )
    return implied


def cmd_diagram(args: argparse.Namespace) -> int:
    fmt = output_format(args.format, args.output)
    if args.overview and fmt not in ("mermaid", "markdown"):
        raise CliError(
            f"--overview is drawn in Mermaid only (--format mermaid|markdown, .mmd, .md), "
            f"not {fmt}",
            USAGE,
        )
    if args.overview and args.trace:
        raise CliError("--trace highlights a path on the whole machine: drop --overview", USAGE)
    policy = load_policy(args.policy)
    trace = load_trace(args.trace) if args.trace else None
    decl = declare(policy)
    try:
        if args.overview:
            text = overview.to_mermaid_overview(decl)
            out: str | bytes = text if fmt == "mermaid" else f"```mermaid\n{text}```\n"
        elif fmt == "mermaid":
            out = diagram.to_mermaid(decl, trace)
        elif fmt == "markdown":
            out = diagram.to_markdown(decl, trace)
        else:
            source = diagram.to_dot(decl, trace)
            if fmt == "dot":
                out = source
            else:
                from .gallery import graphviz, have_dot

                if not have_dot():
                    raise CliError(graphviz_hint(fmt), MISSING_TOOL)
                try:
                    out = graphviz(source, fmt)
                except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                    raise CliError(f"Graphviz could not draw the diagram: {e}") from None
    except diagram.DiagramError as e:
        raise CliError(f"{args.trace}: {e}", USAGE) from None
    _emit(out, args.output)
    return OK


def _emit(out: str | bytes, path: str | None) -> None:
    data = out.encode() if isinstance(out, str) else out
    if path is None or path == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    p = Path(path)
    try:
        if p.parent and not p.parent.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror or e}") from None
    print(f"wrote {path}", file=sys.stderr)


def check_main(path: str | None, as_json: bool, turns: int = 1) -> int:
    """Model-check a policy file (None: the default policy) and print the report: 0
    when every property holds, 1 when one is broken (or the search was cut short), 2
    when the policy is invalid (one line on stderr). `turns` >= 2 also explores that
    many concurrent turns on one shared health store, every interleaving."""
    from ..fsm.checker import check_policy
    from ..fsm.checker.fleet import check_fleet

    try:
        policy = default_policy() if path is None else Policy.from_toml(path)
    except PolicyError as e:
        text = "; ".join(x.strip() for x in str(e).splitlines())
        print(f"{PROG} check: {text}", file=sys.stderr)
        return USAGE
    report = check_policy(policy)
    fleet = check_fleet(policy, turns=turns) if turns >= 2 else None
    if as_json:
        data = report.to_json()
        if fleet is not None:
            data["fleet"] = fleet.to_json()
        print(json.dumps(data))
    else:
        print(f"{PROG} check: {path or 'the default policy'}")
        print(report.text())
        if fleet is not None:
            print(fleet.text())
    ok = report.ok and (fleet is None or fleet.ok)
    return OK if ok else FAILED


def cmd_check(args: argparse.Namespace) -> int:
    if args.policy is not None:
        load_policy(args.policy)  # clear errors for a missing or invalid file, first
    if not 1 <= args.turns <= 4:
        print(f"{PROG} check: --turns must be 1..4, got {args.turns}", file=sys.stderr)
        return USAGE
    return check_main(args.policy, args.json, args.turns)


def cmd_serve(args: argparse.Namespace) -> int:
    script = Path(args.script)
    if not script.exists():
        raise CliError(f"script file not found: {args.script}", USAGE)
    if script.is_dir():
        raise CliError(f"script path is a directory, not a JSON/TOML file: {args.script}", USAGE)
    from .fault_server import serve_main

    try:
        return int(serve_main(str(script), args.host, args.port))
    except ValueError as e:  # the fault server's ScriptError is a ValueError with file/line
        raise CliError(str(e), USAGE) from None
    except OSError as e:
        raise CliError(f"cannot serve on {args.host}:{args.port}: {e.strerror or e}") from None


def providers_report(extra: dict[str, registry.Provider] | None = None) -> list[dict[str, Any]]:
    """The registry (and a policy's own entries) as rows: endpoint, key variables and
    whether each is set in this environment. A variable's value is never read out."""
    rows = []
    for name in registry.known(extra):
        p = registry.lookup(name, extra)
        assert p is not None
        row = p.as_dict()
        row["source"] = "policy" if extra and name in extra else "built-in"
        row["key_envs"] = [
            {"name": k, "set": bool(os.environ.get(k, "").strip())} for k in p.key_envs
        ]
        rows.append(row)
    return rows


def cmd_providers(args: argparse.Namespace) -> int:
    extra = dict(load_policy(args.policy).providers) if args.policy else None
    rows = providers_report(extra)
    if args.json:
        print(json.dumps({"providers": rows}, indent=2))
        return OK
    table = [("provider", "base_url", "key variables")]
    for r in rows:
        keys = ", ".join(f"{k['name']} ({'set' if k['set'] else 'not set'})" for k in r["key_envs"])
        name = r["name"] + (" *" if r["source"] == "policy" else "")
        table.append((name, r["base_url"] or "-", keys or "none (keyless)"))
    widths = [max(len(row[i]) for row in table) for i in range(2)]
    for row in table:
        print(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}")
    if extra:
        print(f"* from {args.policy}")
    return OK


def cmd_demo(args: argparse.Namespace) -> int:
    demo = importlib.import_module("fallgate.providers.demo")
    return int(demo.demo_main(as_json=args.json, out=Path(args.out), diagrams=not args.no_diagrams))


def cmd_health(args: argparse.Namespace) -> int:
    from ..fsm.store import StoreUnavailable
    from . import health_report
    from .stores import open_backend

    try:
        backend = open_backend(args.store, create=False)
    except ValueError as e:
        raise CliError(str(e), USAGE) from None
    except ImportError as e:
        raise CliError(str(e), MISSING_TOOL) from None
    except StoreUnavailable as e:
        raise CliError(f"cannot reach the health store: {e}", FAILED) from None
    try:
        data = health_report.report(backend)
        if args.reset is not None:
            chosen = health_report.matching(data, args.reset)
            if not chosen or (args.reset != "all" and len(chosen) > 1):
                known = ", ".join(t["target"] for t in data["targets"]) or "none"
                why = "names more than one backend" if chosen else "is not in the store"
                raise CliError(
                    f"--reset {args.reset!r} {why} (targets: {known}; give MODEL@BASE_URL, "
                    "or all)",
                    USAGE,
                )
            deleted = sum(
                health_report.reset(backend, t["base_url"], t["model"]) for t in chosen
            )
            names = ", ".join(t["target"] for t in chosen)
            if args.json:
                print(json.dumps({"store": backend.url, "reset": names, "deleted": deleted}))
            else:
                print(f"reset {names}: {deleted} record(s) deleted from {backend.url}")
            return OK
    except StoreUnavailable as e:
        raise CliError(f"cannot reach the health store: {e}", FAILED) from None
    finally:
        backend.close()
    print(json.dumps(data, indent=2) if args.json else health_report.render(data))
    return OK


# -- the parser ---------------------------------------------------------------------------------


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
            "  fallgate check policy.toml\n"
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
            "highlighted, its steps numbered. Mermaid and DOT need nothing installed;\n"
            "SVG and PNG need Graphviz's `dot`.\n\n"
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
        metavar="TRACE.jsonl",
        help="a turn's trace as JSON lines (fallgate.fsm.trace.to_jsonl(result.trace)) "
        "to highlight",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(run=cmd_diagram)

    p = sub.add_parser(
        "check",
        help="model-check a policy: every reachable state, the ten properties",
        formatter_class=fmt,
        description=(
            "Explores every reachable (state, counters) pair of POLICY's machine\n"
            "(default: the built-in default policy) and checks ten properties on every\n"
            "edge: the fallback gate never closes for good while a fallback is\n"
            "eligible; every turn terminates within a bound; no ping-pong back up the\n"
            "chain; waits are honest (capped, within the deadline, never before a\n"
            "Retry-After); non-retryable means not retried; credential rotation is\n"
            "bounded; a turn starts clean; a committed stream is never replayed; no\n"
            "secret ever leaks; what executes is what is declared. Prints the states\n"
            "explored and each property held, or the shortest outcome sequence that\n"
            "breaks one. With --turns N (2..4) it also runs N concurrent turns on one\n"
            "shared health store, every interleaving, and checks the fleet properties:\n"
            "one half-open probe in flight per target, no retry beyond the retry\n"
            "budget, no target unprobeable beyond its bound (nor lost for good).\n"
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
        help="also explore N (2..4) concurrent turns on one shared health store",
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `fallgate` console script; returns the exit status."""
    parser = build_parser()
    try:
        args: Any = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors
        return int(e.code or 0) if not isinstance(e.code, str) else USAGE
    try:
        return int(args.run(args))
    except CliError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        return OK
    except Exception as e:  # the last line of defence: no tracebacks
        if os.environ.get("FALLGATE_DEBUG"):
            traceback.print_exc()
        print(
            f"{PROG}: internal error: {type(e).__name__}: {e} "
            "(set FALLGATE_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return FAILED


if __name__ == "__main__":
    sys.exit(main())
