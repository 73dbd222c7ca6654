"""`fallgate providers` and `fallgate health`: what a deployment has to work with.

`providers` lists the provider registry and which key variables are set (never a
value); `health` reads (or resets) the health a fleet shares in a store.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ...fsm.catalogue import registry
from .common import FAILED, MISSING_TOOL, OK, USAGE, CliError
from .inputs import load_policy


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


def cmd_health(args: argparse.Namespace) -> int:
    from ...fsm.health.backend import StoreUnavailable
    from ..stores import open_backend
    from . import health_report

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
                    f"--reset {args.reset!r} {why} (targets: {known}; give MODEL@BASE_URL, or all)",
                    USAGE,
                )
            deleted = sum(health_report.reset(backend, t["base_url"], t["model"]) for t in chosen)
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
