"""`fallgate serve` and `fallgate demo`: the commands that run the embedded fault server.

Both import their engine lazily (the fault server, the demo scenarios), so
`fallgate --help` and the other commands stay fast.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from .common import USAGE, CliError
from .inputs import check_path


def cmd_serve(args: argparse.Namespace) -> int:
    script = check_path(args.script, "script", "JSON/TOML")
    from ..testing.fault_server import serve_main

    try:
        return int(serve_main(str(script), args.host, args.port))
    except ValueError as e:  # the fault server's ScriptError is a ValueError with file/line
        raise CliError(str(e), USAGE) from None
    except OSError as e:
        raise CliError(f"cannot serve on {args.host}:{args.port}: {e.strerror or e}") from None


def cmd_demo(args: argparse.Namespace) -> int:
    demo = importlib.import_module("fallgate.providers.cli.demo")
    return int(demo.demo_main(as_json=args.json, out=Path(args.out), diagrams=not args.no_diagrams))
