"""Write a tiny host distribution whose top-level packages are `fsm` and `providers`.

    python tests/embed/host_dist.py DIR

An agent that embeds fallgate may well have packages of its own named like the
directories of fallgate's repository (hermes-agent ships a top-level
``providers``). ``make test-embed`` installs this project beside the fallgate
wheel; ``check_embed.py`` then checks that ``import fsm`` / ``import providers``
still give the host's modules (``HOST = "host-fsm"`` / ``"host-providers"``).
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "fallgate-embed-host"

PYPROJECT = f"""\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{NAME}"
version = "0.0.1"
description = "A host application with top-level fsm and providers packages"

[tool.setuptools]
packages = ["fsm", "providers"]
"""


def write(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(PYPROJECT, encoding="utf-8")
    for name in ("fsm", "providers"):
        pkg = root / name
        pkg.mkdir(exist_ok=True)
        (pkg / "__init__.py").write_text(
            f'"""The host application\'s own `{name}` package."""\n\nHOST = "host-{name}"\n',
            encoding="utf-8",
        )
    return root


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: host_dist.py DIR", file=sys.stderr)
        sys.exit(2)
    print(write(Path(sys.argv[1])))
