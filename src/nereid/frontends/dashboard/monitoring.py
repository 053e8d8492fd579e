"""The monitoring figures the Rollouts view shows: per model version, each tensor's drift (the worst PSI and KS
statistic over its features, as the `nereid_*_drift_*` metrics give them) and the data-quality counts of
`nereid_data_quality_issues_total`. Read from the monitor's own snapshot, never computed here; the metrics port
is another origin, which the page's Content-Security-Policy does not reach, so the page reads them here."""

from __future__ import annotations

from typing import Any

from nereid.monitoring.monitor import Monitor

__all__ = ["monitoring_view"]


def monitoring_view(monitor: Monitor) -> dict[str, Any]:
    """{"active", "window_seconds", "samples_per_second", "sampled", "dropped", "versions": [...]}: one entry per model
    version the monitor has seen, with its reference's source, its tensors' drift and its quality issues."""
    snapshot = monitor.snapshot  # replaced whole by the monitor's thread: one consistent reading
    seen = list(monitor.versions.items())  # a copy: the thread may add a version meanwhile
    versions: list[dict[str, Any]] = []
    for (model, version), version_monitor in sorted(seen):
        tensors = []
        for name, drift in sorted(snapshot.get((model, version), {}).items()):
            direction, _, tensor = name.partition(":")
            tensors.append({
                "direction": "input" if direction == "in" else "output", "name": tensor, "psi": round(drift.psi, 6),
                "ks": round(drift.ks, 6), "feature": drift.feature, "samples": drift.samples,
            })  # fmt: skip
        quality = [
            {"tensor": tensor, "issue": issue, "count": count}
            for (tensor, issue), count in sorted(list(version_monitor.quality.items()))
        ]
        versions.append({
            "model": model, "version": version, "reference": version_monitor.reference_source, "tensors": tensors,
            "quality": quality,
        })  # fmt: skip
    return {
        "active": monitor.active,
        "window_seconds": monitor.config.window_seconds,
        "samples_per_second": monitor.config.samples_per_second,
        "sampled": monitor.sampled,
        "dropped": monitor.dropped,
        "versions": versions,
    }
