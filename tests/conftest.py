"""Shared test configuration: Hypothesis profiles.

* ``ci`` (the default): a meaningful budget that keeps the whole suite in minutes —
  property tests get 200 examples; the stateful turn fuzzer 200 runs of up to 60 steps.
  Derandomized: every run of the suite tries the same examples, so a red run is a
  change's doing, never the draw's (a fresh clone has no example database to replay).
* ``fuzz`` (``make fuzz``): 5000 random examples / runs of up to 200 steps, no deadline:
  where new counterexamples are looked for (each found one becomes an ``@example``).
* ``dev``: 20 examples, for quick local iterations.

Select one with ``HYPOTHESIS_PROFILE=fuzz`` (or pytest's ``--hypothesis-profile``).

Every test also starts with an empty process-wide default health store.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from fallgate.fsm.health.store import DEFAULT
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=200,
    stateful_step_count=60,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz",
    max_examples=5000,
    stateful_step_count=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=20, stateful_step_count=30, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _fresh_default_health() -> Iterator[None]:
    """Turns given no ``health=`` share `fsm.health.store.DEFAULT` (by design); start and
    end every test with it empty, so no test sees another's cooldowns."""
    DEFAULT.clear()
    yield
    DEFAULT.clear()
