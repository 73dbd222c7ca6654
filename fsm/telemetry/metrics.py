"""fallgate's OpenTelemetry metrics: the counters, histograms and the cooldown gauge.

Made once per meter provider (enabling twice registers nothing twice). Counts are
kept in process and reported when a reader collects (`_Tally`), because the SDK's
per-measurement work was most of what metrics cost a turn; `fsm.telemetry.spans` feeds
them, `fsm.telemetry.otel` switches them on.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any, Final

from ..host import observe
from .gauge import STORES

SCOPE = "fallgate"
#: Histogram buckets in seconds (those of the GenAI client duration metric).
_BUCKETS: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                   40.96, 81.92)  # fmt: skip


def version() -> str:
    try:
        from importlib.metadata import version

        return version("fallgate")
    except Exception:  # pragma: no cover - not installed as a distribution
        return "0"


class _Tally:
    """A counter kept in process and reported when a reader collects (an observable
    counter): a turn pays a dict update, not the SDK's per-measurement work (building
    a Measurement, cleaning and hashing its attributes), which over a one-attempt
    turn was most of the metrics' cost. Totals are cumulative, as a counter's are."""

    __slots__ = ("_attributes", "_counts", "_lock", "_names")

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names
        self._counts: dict[tuple[Any, ...], int] = {}
        self._attributes: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def add(self, key: tuple[Any, ...]) -> None:
        """Count one for these attribute values (in `names` order; None: left out)."""
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def observe(self, options: Any) -> Iterator[Any]:
        from opentelemetry.metrics import Observation

        with self._lock:
            counts = list(self._counts.items())
        for key, n in counts:
            attributes = self._attributes.get(key)
            if attributes is None:
                attributes = self._attributes[key] = {
                    name: v for name, v in zip(self._names, key, strict=True) if v is not None
                }
            yield Observation(n, attributes)


class _Metrics:
    """The metric instruments of one meter (made once per meter provider)."""

    def __init__(self, meter: Any) -> None:
        self.attempts = _Tally(
            ("fallgate.target", "gen_ai.provider.name", "gen_ai.request.model", "fallgate.outcome")
        )
        self.fallbacks = _Tally(("fallgate.from_target", "fallgate.to_target", "fallgate.event"))
        self.turns = _Tally(("fallgate.state", "gen_ai.operation.name"))
        meter.create_observable_counter(
            "fallgate.attempts",
            callbacks=[self.attempts.observe],
            unit="{attempt}",
            description="Attempts, by target and outcome",
        )
        meter.create_observable_counter(
            "fallgate.fallbacks",
            callbacks=[self.fallbacks.observe],
            unit="{fallback}",
            description="Moves of a turn from one target of its chain to another",
        )
        meter.create_observable_counter(
            "fallgate.turns",
            callbacks=[self.turns.observe],
            unit="{turn}",
            description="Turns ended, by end state",
        )
        self.waits = _histogram(
            meter, "fallgate.wait.duration", "Waits a turn asked for (backoff, Retry-After)"
        )
        self.turn_duration = _histogram(
            meter, "fallgate.turn.duration", "Turn duration on the turn's clock"
        )
        meter.create_observable_gauge(
            "fallgate.cooldowns.active",
            callbacks=[self._cooldowns],
            unit="{cooldown}",
            description="Active cooldowns in the health stores in use, per target",
        )

    def _cooldowns(self, options: Any) -> Iterator[Any]:
        active = observe.ACTIVE  # the instruments in force when a reader collects
        if getattr(active, "metrics", None) is not self:
            return
        from opentelemetry.metrics import Observation

        for attributes, n in STORES.cooldowns().items():
            yield Observation(n, dict(attributes))


def _histogram(meter: Any, name: str, description: str) -> Any:
    try:
        return meter.create_histogram(
            name,
            unit="s",
            description=description,
            explicit_bucket_boundaries_advisory=list(_BUCKETS),
        )
    except TypeError:  # pragma: no cover - opentelemetry-api < 1.23
        return meter.create_histogram(name, unit="s", description=description)


_METRICS: weakref.WeakKeyDictionary[Any, _Metrics] = weakref.WeakKeyDictionary()
_GLOBAL_METRICS: list[_Metrics] = []
_metrics_lock = threading.Lock()


def metrics_for(meter_provider: Any) -> _Metrics:
    """One set of instruments per meter provider: enabling twice registers nothing twice."""
    from opentelemetry import metrics

    with _metrics_lock:
        if meter_provider is None:
            if not _GLOBAL_METRICS:
                _GLOBAL_METRICS.append(_Metrics(metrics.get_meter(SCOPE, version())))
            return _GLOBAL_METRICS[0]
        found = _METRICS.get(meter_provider)
        if found is None:
            meter = metrics.get_meter(SCOPE, version(), meter_provider=meter_provider)
            found = _METRICS[meter_provider] = _Metrics(meter)
        return found
