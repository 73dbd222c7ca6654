"""`fallgate diagram`: a policy's machine in Mermaid, DOT, SVG or PNG, with up to two paths.

Holds what only drawing needs: the output suffix -> format rules, the --trace
``LABEL=FILE`` values, naming a refused trace step by its file and line, and
writing the bytes to stdout or a file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ...fsm.core.machine import declare
from ...fsm.diagram import overview
from ...fsm.diagram import render as diagram
from ...fsm.policy.checks import name_problem
from ...fsm.policy.textfile import UnreadableFile
from .common import MISSING_TOOL, OK, USAGE, CliError
from .inputs import load_policy, load_trace, transition_lines

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


#: A --trace value: ``FILE`` (the legend names it by its file name) or ``LABEL=FILE``.
def trace_paths(values: Sequence[str]) -> list[tuple[str, str]]:
    """(label, file) per --trace: the label is the file's name, or the full path given
    when two names collide, or the LABEL of ``LABEL=FILE`` (when no file is named
    like the whole value)."""
    pairs = []
    for value in values:
        label, sep, file = value.partition("=")
        if sep and file and "/" not in label and not Path(value).exists():
            problem = name_problem(label)
            if problem is not None:
                raise CliError(f"--trace {value!r}: its LABEL {problem}", USAGE)
            pairs.append((label, file))
        else:
            pairs.append(("", value))
    names = [Path(f).name for _, f in pairs]
    out: list[tuple[str, str]] = []
    for (label, file), name in zip(pairs, names, strict=True):
        same_name = {f for (_, f), n in zip(pairs, names, strict=True) if n == name}
        label = label or (name if len(same_name) == 1 else file)
        unique, k = label, 2
        while unique in (x for x, _ in out):  # the same file twice: "t.jsonl (2)"
            unique, k = f"{label} ({k})", k + 1
        out.append((unique, file))
    return out


def diagram_error(e: diagram.DiagramError, file: str, turn: str | None = None) -> str:
    """A step the diagram refuses, named by its file, line and sequence number."""
    if e.step is None:
        return f"{file}: {e.reason}"
    try:
        lines = transition_lines(file, turn)
    except (OSError, ValueError, UnreadableFile, RecursionError):
        lines = []
    where = f"{file}:{lines[e.step - 1]}" if e.step <= len(lines) else file
    seq = f" (seq {e.seq})" if e.seq is not None else ""
    return f"{where}: trace step {e.step}{seq}: {e.reason}"


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
    if args.trace and len(args.trace) > diagram.MAX_PATHS:
        raise CliError(
            f"--trace given {len(args.trace)} times: a diagram overlays at most "
            f"{diagram.MAX_PATHS} paths (each needs a colour and numerals of its own to stay "
            "readable); draw the others in a second diagram",
            USAGE,
        )
    policy = load_policy(args.policy)
    if args.turn and not args.trace:
        raise CliError("--turn picks a turn of a --trace file: give --trace too", USAGE)
    given = trace_paths(args.trace or ())
    files = {label: file for label, file in given}
    traces = [diagram.TracePath(label, load_trace(file, args.turn)) for label, file in given]
    decl = declare(policy)
    try:
        if args.overview:
            text = overview.to_mermaid_overview(decl)
            out: str | bytes = text if fmt == "mermaid" else f"```mermaid\n{text}```\n"
        elif fmt == "mermaid":
            out = diagram.to_mermaid(decl, traces=traces or None)
        elif fmt == "markdown":
            out = diagram.to_markdown(decl, traces=traces or None)
        else:
            source = diagram.to_dot(decl, traces=traces or None)
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
        file = files.get(e.path or "", given[0][1] if given else "")
        raise CliError(diagram_error(e, file, args.turn), USAGE) from None
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
