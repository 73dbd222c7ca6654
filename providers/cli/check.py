"""`fallgate check`: model-check a policy (and, with --turns, a fleet of turns).

`check_main` is also the programmatic entry the tests call with a path.
"""

from __future__ import annotations

import argparse
import json
import sys

from ...fsm import Policy, PolicyError
from .common import FAILED, OK, PROG, USAGE
from .inputs import default_policy, load_policy


def check_main(
    path: str | None, as_json: bool, turns: int = 1, progress_after: float | None = None
) -> int:
    """Model-check a policy file (None: the default policy) and print the report: 0
    when every property holds, 1 when one is broken (or the search was cut short), 2
    when the policy is invalid (one line on stderr). `turns` >= 2 also explores that
    many concurrent turns on one shared health store, every interleaving. A check that
    runs past `progress_after` seconds (default 2) says how far it got on stderr, so
    the report on stdout stays as it is."""
    from ...fsm.checker import check_policy
    from ...fsm.checker.interleave import check_fleet
    from ...fsm.checker.progress import AFTER, Progress

    try:
        policy = default_policy() if path is None else Policy.from_toml(path)
    except PolicyError as e:
        text = "; ".join(x.strip() for x in str(e).splitlines())
        print(f"{PROG} check: {text}", file=sys.stderr)
        return USAGE
    from ...fsm.core.reserve import reserve_warnings
    from ...fsm.policy.targets import identical_warnings

    def say(line: str) -> None:
        print(f"{PROG} check: {line}", file=sys.stderr, flush=True)

    after = AFTER if progress_after is None else progress_after
    report = check_policy(policy, progress=Progress(say, after=after))
    fleet = check_fleet(policy, turns=turns) if turns >= 2 else None
    warnings = reserve_warnings(policy) + identical_warnings(policy.targets)
    if as_json:
        data = report.to_json()
        data["warnings"] = warnings
        if fleet is not None:
            data["fleet"] = fleet.to_json()
        print(json.dumps(data))
    else:
        print(f"{PROG} check: {path or 'the default policy'}")
        for w in warnings:
            print(f"warning: {w}")
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
