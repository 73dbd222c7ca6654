"""The `fallgate` command line: demo, diagram, check, serve, providers.

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
import sys
import traceback
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

from ..fsm import Policy, PolicyError, diagram, registry
from ..fsm.machine import declare
from ..fsm.trace import TraceEvent, from_jsonl

PROG = "fallgate"

#: Exit statuses.
OK, FAILED, USAGE, MISSING_TOOL, INTERRUPTED = 0, 1, 2, 3, 130

FORMATS = ("mermaid", "dot", "svg", "markdown")
_SUFFIX_FORMAT = {
    ".mmd": "mermaid",
    ".mermaid": "mermaid",
    ".dot": "dot",
    ".gv": "dot",
    ".svg": "svg",
    ".md": "markdown",
}
GRAPHVIZ_HINT = (
    "SVG output needs Graphviz's `dot`, which is not installed: install it "
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
        raise CliError(f"policy file not found: {path}")
    if p.is_dir():
        raise CliError(f"policy path is a directory, not a TOML file: {path}")
    try:
        return Policy.from_toml(p)
    except PolicyError as e:
        raise CliError(str(e)) from None


def load_trace(path: str) -> list[TraceEvent]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"trace file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"cannot read trace file {path}: {e}") from None
    try:
        events = from_jsonl(text)
    except (ValueError, TypeError) as e:
        raise CliError(f"{path}: {e}") from None
    if not events:
        raise CliError(f"{path}: the trace is empty (expected JSON lines, one per transition)")
    return events


# -- subcommands --------------------------------------------------------------------------------


def cmd_diagram(args: argparse.Namespace) -> int:
    fmt = args.format
    if fmt is None:
        suffix = Path(args.output).suffix.lower() if args.output else ""
        fmt = _SUFFIX_FORMAT.get(suffix, "mermaid")
    policy = load_policy(args.policy)
    trace = load_trace(args.trace) if args.trace else None
    decl = declare(policy)
    try:
        if fmt == "mermaid":
            out: str | bytes = diagram.to_mermaid(decl, trace)
        elif fmt == "markdown":
            out = diagram.to_markdown(decl, trace)
        else:
            source = diagram.to_dot(decl, trace)
            if fmt == "dot":
                out = source
            else:
                from .gallery import have_dot, svg_of

                if not have_dot():
                    raise CliError(GRAPHVIZ_HINT, MISSING_TOOL)
                try:
                    out = svg_of(source)
                except (RuntimeError, OSError) as e:
                    raise CliError(f"Graphviz could not draw the diagram: {e}") from None
    except diagram.DiagramError as e:
        raise CliError(f"{args.trace}: {e}") from None
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


def check_main(path: str | None, as_json: bool) -> int:
    """Model-check a policy file (None: the default policy) and print the report: 0
    when every property holds, 1 when one is broken (or the search was cut short), 2
    when the policy is invalid (one line on stderr)."""
    from ..fsm.checker import check_policy

    try:
        policy = default_policy() if path is None else Policy.from_toml(path)
    except PolicyError as e:
        text = "; ".join(x.strip() for x in str(e).splitlines())
        print(f"{PROG} check: {text}", file=sys.stderr)
        return 2
    report = check_policy(policy)
    if as_json:
        print(json.dumps(report.to_json()))
    else:
        print(f"{PROG} check: {path or 'the default policy'}")
        print(report.text())
    return OK if report.ok else FAILED


def cmd_check(args: argparse.Namespace) -> int:
    if args.policy is not None:
        load_policy(args.policy)  # clear errors for a missing or invalid file, first
    return check_main(args.policy, args.json)


def cmd_serve(args: argparse.Namespace) -> int:
    script = Path(args.script)
    if not script.exists():
        raise CliError(f"script file not found: {args.script}")
    if script.is_dir():
        raise CliError(f"script path is a directory, not a JSON/TOML file: {args.script}")
    try:
        from .fault_server import serve_main
    except ImportError as e:
        raise CliError(f"the fault server is not available in this installation ({e})") from None
    try:
        return int(serve_main(str(script), args.host, args.port))
    except ValueError as e:  # the fault server's ScriptError is a ValueError with file/line
        raise CliError(str(e)) from None
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
            "  fallgate serve --script faults.toml --port 8080\n\n"
            "Run `fallgate COMMAND --help` for the options of each command."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser(
        "demo",
        help="run SPEC scenarios against an embedded fault server and show each turn's path",
        formatter_class=fmt,
        description=(
            "Starts the embedded fault server on 127.0.0.1 (a random free port), runs\n"
            "SPEC scenario 1 and more (Retry-After on the primary, a stream broken after\n"
            "delivery, context too long, ...) through fallgate with the real `openai`\n"
            "SDK over real HTTP, prints every turn's path (state, event, wait, target,\n"
            "elapsed) and writes each path's diagram. Needs no API key and no network\n"
            "beyond loopback; finishes in a few seconds and leaves nothing running."
        ),
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
        help="draw a policy's turn machine (Mermaid, DOT or SVG), optionally with a turn's path",
        formatter_class=fmt,
        description=(
            "Draws the turn machine declared for POLICY (default: the built-in default\n"
            "policy): one box per target of the chain with its phase states, guards on\n"
            "the edges. With --trace, the path a turn took is highlighted, its steps\n"
            "numbered. Mermaid and DOT need nothing installed; SVG needs Graphviz."
        ),
    )
    p.add_argument("policy", nargs="?", metavar="POLICY.toml", help="policy file (TOML)")
    p.add_argument(
        "--format",
        "-f",
        choices=FORMATS,
        help="output format (default: from -o's suffix, else mermaid); markdown is "
        "Mermaid inside a Markdown page that renders on GitHub",
    )
    p.add_argument(
        "--trace",
        metavar="TRACE.jsonl",
        help="a turn's trace as JSON lines (fsm.to_jsonl(result.trace)) to highlight",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(run=cmd_diagram)

    p = sub.add_parser(
        "check",
        help="model-check a policy: every reachable state, every SPEC property",
        formatter_class=fmt,
        description=(
            "Explores every reachable (state, counters) pair of POLICY's machine\n"
            "(default: the built-in default policy) and checks the properties of\n"
            "SPEC section 5. Prints the states explored and each property held, or\n"
            "the shortest outcome sequence that breaks one. Exit status 0 when all\n"
            "hold, 1 when one is broken or the policy is invalid."
        ),
    )
    p.add_argument("policy", nargs="?", metavar="POLICY.toml", help="policy file (TOML)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
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
