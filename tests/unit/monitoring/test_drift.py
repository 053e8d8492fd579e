"""Drift statistics and a version's windows: a shifted input raises the drift over its threshold within one window;
inputs from the reference distribution stay under it (the false-alarm rate measured over many windows)."""

from __future__ import annotations

import numpy as np

from nereid.monitoring.drift import build_profile, ks_statistic, psi
from nereid.monitoring.version_monitor import VersionMonitor

THRESHOLD = 0.25  # the usual reading of PSI: above it, a large shift


def test_psi_is_zero_for_the_same_distribution_and_grows_with_a_shift() -> None:
    counts = np.array([10, 20, 30, 40])
    assert psi(counts, counts * 3) < 1e-9
    assert psi(counts, np.array([40, 30, 20, 10])) > 0.5
    assert ks_statistic(counts, counts) == 0.0 and ks_statistic(counts, np.array([40, 30, 20, 10])) > 0.2


def test_numeric_features_are_profiled_per_feature_on_the_references_deciles() -> None:
    rng = np.random.default_rng(0)
    samples = np.stack([rng.normal(0, 1, 5000), rng.uniform(10, 20, 5000)], axis=1).astype(np.float32)
    profile = build_profile("in:X", samples)
    assert len(profile.features) == 2 and all(f.kind == "numeric" for f in profile.features)
    assert all(len(f.edges) == 9 and f.counts.sum() == 5000 for f in profile.features)
    assert profile.features[1].low >= 10 and profile.features[1].high <= 20


def test_integers_with_few_values_and_bytes_are_categories() -> None:
    ints = build_profile("in:C", np.array([1, 2, 2, 3, 3, 3] * 10, dtype=np.int32))
    assert ints.features[0].kind == "categorical" and ints.features[0].categories == [1, 2, 3]
    words = build_profile("in:W", np.array([b"a", b"b", b"a"], dtype=np.object_))
    assert words.features[0].kind == "categorical" and sorted(words.features[0].categories) == [b"a", b"b"]
    assert list(words.features[0].bin_counts(np.array([b"a", b"zzz"], dtype=object))) == [1, 0, 1]  # unseen -> other


def _monitor(rng: np.random.Generator) -> VersionMonitor:
    monitor = VersionMonitor("m", "1", reference_rows=1, window_seconds=60)
    monitor.set_reference({"in:X": rng.normal(0, 1, (5000, 4)).astype(np.float32)}, "test", now=0.0)
    return monitor


def test_a_shifted_input_raises_the_drift_over_its_threshold_within_one_window() -> None:
    rng = np.random.default_rng(1)
    monitor = _monitor(rng)
    for second in range(60):  # one window, 8 rows a second, the mean moved by one standard deviation
        monitor.observe({"in:X": rng.normal(1, 1, (8, 4)).astype(np.float32)}, now=float(second))
    drift = monitor.drift(now=59.0)["in:X"]
    assert drift.psi > THRESHOLD and drift.ks > 0.2 and drift.samples == 480


def test_inputs_from_the_reference_distribution_rarely_raise_a_false_alarm() -> None:
    rng = np.random.default_rng(2)
    monitor = _monitor(rng)
    alarms, windows = 0, 200
    for window in range(windows):
        start = window * 60.0
        for second in range(60):
            monitor.observe({"in:X": rng.normal(0, 1, (8, 4)).astype(np.float32)}, now=start + second)
        alarms += monitor.drift(now=start + 59.0)["in:X"].psi > THRESHOLD
    assert alarms / windows <= 0.01  # measured: 0 of 200; the worst feature's PSI over 480 rows: median 0.030, max 0.057


def test_data_quality_counts_nan_inf_out_of_range_and_bad_bytes() -> None:
    monitor = VersionMonitor("m", "1", reference_rows=1, window_seconds=60)
    monitor.set_reference({"in:X": np.linspace(0, 1, 100, dtype=np.float32).reshape(-1, 1)}, "test", 0.0)
    monitor.observe({"in:X": np.array([[np.nan], [np.inf], [2.0], [0.5]], np.float32)}, now=1.0)
    monitor.observe({"in:S": np.array([b"", b"\xff\xfe", b"ok"], dtype=np.object_)}, now=1.0)
    assert monitor.quality == {
        ("in:X", "nan"): 1, ("in:X", "inf"): 1, ("in:X", "out_of_range"): 1,
        ("in:S", "empty_bytes"): 1, ("in:S", "malformed_bytes"): 1,
    }  # fmt: skip


def test_without_a_file_the_first_requests_become_the_reference() -> None:
    rng = np.random.default_rng(3)
    monitor = VersionMonitor("m", "1", reference_rows=50, window_seconds=60)
    for i in range(50):
        assert not monitor.profiles
        monitor.observe({"in:X": rng.normal(0, 1, (4, 2)).astype(np.float32)}, now=float(i))
    assert set(monitor.profiles) == {"in:X"} and monitor.profiles["in:X"].features[0].counts.sum() == 200
    assert monitor.reference_source == "the first 50 sampled requests"
