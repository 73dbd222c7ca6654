"""`python -m fallgate.providers.cli`: the `fallgate` console script without installing it."""

import sys

from . import main

sys.exit(main())
