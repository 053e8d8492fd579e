"""The dashboard's Rollouts view without a browser: the committed bundle holds the view and the calls it makes,
and the monitoring JSON it reads gives each version's drift per tensor and its data-quality counts as the monitor
holds them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nereid.frontends.dashboard.monitoring import monitoring_view
from nereid.frontends.http.access import api_category
from nereid.monitoring.monitor import Monitor, MonitorConfig
from nereid.monitoring.version_monitor import VersionMonitor

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
BUNDLE = ROOT / "src" / "nereid" / "frontends" / "dashboard" / "static" / "dashboard.js"


def test_the_bundle_holds_the_rollouts_view_and_its_calls() -> None:
    script = BUNDLE.read_text()
    assert '"rollouts","Rollouts"' in script  # the tab
    for text in ("/v2/nereid/rollouts", "/history", "/start", "/dashboard/api/monitoring", "rollout-history", "start-rollout"):
        assert text in script, text
    for action in ("pause", "resume", "abort", "promote", "undo"):
        assert f'key:"{action}"' in script, action


def test_the_rollout_api_and_the_monitoring_json_are_in_the_categories_the_page_is_restricted_by() -> None:
    assert api_category("/dashboard/api/monitoring") == "dashboard"
    assert api_category("/v2/nereid/rollouts") == "model-repository"
    assert api_category("/v2/nereid/rollouts/m/promote") == "model-repository"


def test_monitoring_view_gives_drift_per_tensor_and_quality_per_version() -> None:
    monitor = Monitor(MonitorConfig(samples_per_second=10, window_seconds=30))
    rng = np.random.default_rng(1)
    drifted = VersionMonitor("m", "1", 500, 30)
    drifted.set_reference({"in:X": rng.normal(0, 1, (2000, 1)), "out:Y": rng.normal(1, 1, (2000, 1))}, "/models/m/1/reference.npz", 0.0)
    for value in rng.normal(3, 1, 300):  # inputs three standard deviations off; outputs as the reference
        drifted.observe({"in:X": np.array([[value]]), "out:Y": np.array([[rng.normal(1, 1)]])}, 1.0)
    drifted.observe({"in:X": np.array([[np.nan]]), "out:Y": np.array([[1.0]])}, 1.0)
    collecting = VersionMonitor("m", "2", 500, 30)  # no reference yet: quality only
    collecting.observe({"in:X": np.array([[np.inf]])}, 1.0)
    monitor.versions = {("m", "2"): collecting, ("m", "1"): drifted}
    monitor.snapshot = {("m", "1"): drifted.drift(2.0)}
    view = monitoring_view(monitor)
    assert view["active"] and view["window_seconds"] == 30 and view["samples_per_second"] == 10
    first, second = view["versions"]
    assert (first["model"], first["version"], first["reference"]) == ("m", "1", "/models/m/1/reference.npz")
    tensors = {(t["direction"], t["name"]): t for t in first["tensors"]}
    assert set(tensors) == {("input", "X"), ("output", "Y")}
    assert tensors[("input", "X")]["psi"] > 0.25 and tensors[("output", "Y")]["psi"] < 0.25
    assert tensors[("input", "X")]["samples"] == 300  # the NaN counts as an issue, not as a row of the window
    assert 0 < tensors[("input", "X")]["ks"] <= 1
    assert {"tensor": "in:X", "issue": "nan", "count": 1} in first["quality"]
    assert second == {"model": "m", "version": "2", "reference": "", "tensors": [], "quality": [{"tensor": "in:X", "issue": "inf", "count": 1}]}
    assert not monitoring_view(Monitor(MonitorConfig(samples_per_second=0)))["active"]
