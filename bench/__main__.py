"""`python -m bench [--quick] [--only core,faults,...] [--out build/bench.json]`."""

from bench.run import main

raise SystemExit(main())
