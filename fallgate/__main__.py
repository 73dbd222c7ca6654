"""`python -m fallgate`: the `fallgate` command, for where the console script is not on
PATH (a venv not activated, an embedded interpreter)."""

from __future__ import annotations

import sys

from .providers.cli import main

if __name__ == "__main__":
    sys.exit(main())
