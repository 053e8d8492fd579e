"""Custom metric families that Python models create with pb_utils.MetricFamily, kept in the server process.

Workers send their operations over their channel; a registry (one per Server, its Python backend's) holds the values
and hands them to the metrics endpoint as Prometheus families. A family lives while any instance that created it is
loaded. Everything here runs on the server's event loop thread.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric

from nereid.core.errors import NereidError, Status

__all__ = ["CustomMetrics"]

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_KINDS = ("counter", "gauge", "histogram")
COUNTER, GAUGE, HISTOGRAM = 0, 1, 2

LabelKey = tuple[tuple[str, str], ...]


class _Series:
    __slots__ = ("labels", "value", "bounds", "counts", "sum", "count")

    def __init__(self, key: LabelKey, bounds: tuple[float, ...] | None) -> None:
        self.labels = dict(key)
        self.value = 0.0
        self.bounds = bounds or ()
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        self.count = 0


class _Family:
    __slots__ = ("name", "description", "kind", "owners", "series")

    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.owners: set[str] = set()
        self.series: dict[LabelKey, _Series] = {}


def _le(bound: float) -> str:
    return format(bound, "g")


class CustomMetrics:
    """The custom metric families of one Server's Python models, with their owners (the instances that created
    them) and their series."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}

    def create_family(self, owner: str, name: str, description: str, kind: int) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise NereidError.invalid(f"invalid metric family name '{name}': use letters, digits, '_' and ':'")
        if kind not in (COUNTER, GAUGE, HISTOGRAM):
            raise NereidError.invalid(f"metric family '{name}': unknown kind {kind}")
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _Family(name, description, kind)
        elif family.kind != kind:
            raise NereidError(
                Status.ALREADY_EXISTS,
                f"metric family '{name}' already exists as a {_KINDS[family.kind]}, not a {_KINDS[kind]}",
            )
        family.owners.add(owner)

    def apply(self, ops: Any) -> None:
        """Apply operations from a worker: ("m", family, labels, buckets) creates a series; "i", "s", "o" with a
        value increment, set and observe it."""
        families = self._families
        for op, name, key, value in ops:
            family = families.get(name)
            if family is None:
                continue
            series = family.series.get(key)
            if series is None:
                series = family.series[key] = _Series(key, value if op == "m" else None)
            if op == "i":
                series.value += value
            elif op == "s":
                series.value = value
            elif op == "o":
                index = bisect.bisect_left(series.bounds, value)
                if index < len(series.counts):
                    series.counts[index] += 1
                series.sum += value
                series.count += 1

    def value(self, name: str, key: LabelKey) -> float:
        family = self._families.get(name)
        if family is None:
            raise NereidError.not_found(f"metric family '{name}' does not exist")
        series = family.series.get(tuple((str(k), str(v)) for k, v in key))
        return series.value if series is not None else 0.0

    def release(self, owner: str) -> None:
        """An instance unloaded: drop the families no loaded instance uses any more."""
        for name in list(self._families):
            family = self._families[name]
            family.owners.discard(owner)
            if not family.owners:
                del self._families[name]

    def collect(self) -> Iterator[Metric]:
        for family in list(self._families.values()):
            metric = Metric(family.name, family.description, _KINDS[family.kind])
            for series in family.series.values():
                if family.kind != HISTOGRAM:
                    metric.add_sample(family.name, series.labels, series.value)
                    continue
                cumulative = 0
                for bound, count in zip(series.bounds, series.counts, strict=True):
                    cumulative += count
                    metric.add_sample(family.name + "_bucket", {**series.labels, "le": _le(bound)}, cumulative)
                metric.add_sample(family.name + "_bucket", {**series.labels, "le": "+Inf"}, series.count)
                metric.add_sample(family.name + "_count", series.labels, series.count)
                metric.add_sample(family.name + "_sum", series.labels, series.sum)
            yield metric
