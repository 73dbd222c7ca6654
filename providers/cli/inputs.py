"""Reading what a command is given: a policy file, a trace file, one turn of a trace.

Every way a file can be missing, unreadable or malformed becomes a `CliError` that
names the file (and line), so commands never show a traceback for bad input. Shared
by diagram, replay, check and providers.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from ...fsm import Policy, PolicyError
from ...fsm.policy.textfile import UnreadableFile, read_text
from ...fsm.trace import TraceError, TraceEvent, from_jsonl, read_turns
from .common import USAGE, CliError


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
    from ...fsm.policy.defaults import default_policy as builtin

    return builtin()


def check_path(path: str, what: str, kind: str) -> Path:
    """`path` as a `Path`, or a CliError that says why no `what` file (a policy, a trace,
    a script) is there: empty, not found, a loop of symbolic links, a directory..."""
    if not path:
        raise CliError(f"{what} path is empty", USAGE)
    if "\0" in path:
        raise CliError(f"{what} path holds a NUL character: {path!r}", USAGE)
    p = Path(path)
    try:
        p.stat()
    except FileNotFoundError:
        raise CliError(f"{what} file not found: {path}", USAGE) from None
    except OSError as e:
        raise CliError(f"cannot read {what} file {path}: {e.strerror or e}", USAGE) from None
    if p.is_dir():
        raise CliError(f"{what} path is a directory, not a {kind} file: {path}", USAGE)
    return p


def load_policy(path: str | None) -> Policy:
    if path is None:
        return default_policy()
    p = check_path(path, "policy", "TOML")
    try:
        return Policy.from_toml(p)
    except PolicyError as e:
        raise CliError(str(e), USAGE) from None


#: The largest trace file read (bytes): a turn's trace is a few kB.
MAX_TRACE_BYTES = 16 << 20


def read_trace_file(path: str) -> str:
    """A trace file's text (bounded, UTF-8), or a CliError naming the file."""
    check_path(path, "trace", "JSONL")
    try:
        return read_text(path, MAX_TRACE_BYTES)
    except UnreadableFile as e:
        where = f"{path}:{e.line}" if e.line else path
        raise CliError(f"cannot read trace file {where}: {e.reason}", USAGE) from None


def load_trace(path: str, turn: str | None = None) -> list[TraceEvent]:
    """The transitions of one turn of a trace file: turn `turn`, else the first. A file
    without turn lines (one turn, as `to_jsonl` writes it) is that turn whatever `turn`
    says, so a recording and a single path can be drawn together with --turn."""
    text = read_trace_file(path)
    try:
        if turn is not None and all(t.header is None for t in read_turns(text)):
            turn = None
        events = from_jsonl(text, turn)
    except TraceError as e:
        where = f"{path}:{e.line}" if e.line else path
        raise CliError(f"{where}: {e.message}", USAGE) from None
    except (ValueError, TypeError) as e:
        raise CliError(f"{path}: {e}", USAGE) from None
    except RecursionError:
        raise CliError(f"{path}: nested too deeply to be a trace", USAGE) from None
    if not events:
        raise CliError(
            f"{path}: the trace is empty (expected JSON lines, one per transition)", USAGE
        )
    return events


def transition_lines(path: str, turn: str | None = None) -> list[int]:
    """The file line of each transition of the turn `load_trace` read (turn `turn`,
    else the file's first), in order, so a step the diagram refuses can be named by
    its line. Turn lines (``"v"``) are skipped; a file of many turns may interleave them."""
    rows: list[tuple[int, str, bool]] = []  # (line, turn id, is a turn line)
    for n, line in enumerate(read_text(path, MAX_TRACE_BYTES).splitlines(), 1):
        obj = json.loads(line) if line.strip() else None
        if isinstance(obj, dict):
            rows.append((n, str(obj.get("turn") or "-"), "v" in obj))
    if not any(head for _, _, head in rows):
        turn = None  # one turn without turn lines: load_trace drew it whole
    chosen = turn if turn is not None else (rows[0][1] if rows else "-")
    return [n for n, key, head in rows if key == chosen and not head]
