"""`fallgate replay`: recorded turns fed to another policy, what changed reported.

The command only parses ``--assume`` rules and maps the engine's errors to file:line
messages; the replay itself is `fallgate.fsm.replay.player`.
"""

from __future__ import annotations

import argparse
import json

from ...fsm.printable import printable
from .common import OK, USAGE, CliError
from .inputs import load_policy, read_trace_file


def cmd_replay(args: argparse.Namespace) -> int:
    from ...fsm.replay.player import Assume, ReplayError, replay

    text = read_trace_file(args.trace)
    policy = load_policy(args.policy)
    rules: dict[str, Assume] = {}
    default = Assume("recorded")
    for item in args.assume:
        name, eq, rule = item.rpartition("=")
        try:
            parsed = Assume.parse(rule)
        except ValueError as e:
            raise CliError(f"--assume {item}: {e}", USAGE) from None
        if eq:
            rules[name] = parsed
        else:
            default = parsed
    try:
        report = replay(text, policy, seed=args.seed, assume=rules, default=default)
    except ReplayError as e:
        where = f"{args.trace}:{e.line}" if e.line else args.trace
        raise CliError(f"{where}: {e.message}", USAGE) from None
    except ValueError as e:  # an --assume naming no target of the policy
        raise CliError(str(e), USAGE) from None
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        # trace ids and model names are the recording's text: no control character reaches
        # the terminal (an ESC sequence in one would clear it)
        print(
            printable(
                f"replayed {len(report.turns)} turns of {args.trace} under {args.policy} "
                f"(seed {args.seed})\n"
            )
        )
        print(printable(report.text()), end="")
    return OK
