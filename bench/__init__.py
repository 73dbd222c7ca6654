"""fallgate's benchmarks (docs/bench.md): `python -m bench` or `make bench`.

Not part of the installed distribution: measured in one run, reported as
ratios of systems timed in the same process, written to build/bench.json.
"""
