"""The `fallgate` command line: demo, diagram, check, replay, serve, providers, health.

Every failure a user can cause (a bad argument, a missing or malformed file,
an invalid policy, a missing system tool) ends with a short message on stderr
and a non-zero exit status, never a traceback. Set ``FALLGATE_DEBUG=1`` to
see the traceback of an unexpected internal error.

A package so that no file holds every command: `parser` declares the options and
help, one module per command family runs them (`diagram`, `replay`, `check`,
`serve` for serve and demo, `fleet` for providers and health), `inputs` reads
policy and trace files, `common` holds the exit statuses; `main` is here.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from ...fsm.printable import printable
from .check import check_main
from .common import FAILED, INTERRUPTED, OK, PROG, USAGE, CliError
from .parser import build_parser

__all__ = ["build_parser", "check_main", "main"]


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
        print(printable(f"{PROG}: {e}"), file=sys.stderr)
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
