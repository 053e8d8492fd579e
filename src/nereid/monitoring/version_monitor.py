"""What one model version's traffic looks like against its reference: sliding windows of binned counts per
input and output tensor (drift), and data-quality counters. Bounded state; fed by the monitor's thread only."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nereid.monitoring.drift import MAX_FEATURES, Profile, build_profile, ks_statistic, psi

__all__ = ["VersionMonitor", "TensorDrift", "QUALITY_ISSUES"]

QUALITY_ISSUES = ("nan", "inf", "out_of_range", "empty_bytes", "malformed_bytes")
# The values of one tensor kept to build its reference from traffic (bounded memory per version).
_REFERENCE_VALUES = 50_000


@dataclass(slots=True)
class TensorDrift:
    """A tensor's drift now: the worst PSI and KS statistic over its features, and which feature."""

    psi: float
    ks: float
    feature: int
    samples: int


class _SlidingCounts:
    """Binned counts of one tensor's features over the last `slices` time slices (the window)."""

    __slots__ = ("profile", "keep", "slices", "current", "started", "slice_seconds")

    def __init__(self, profile: Profile, keep: int, slice_seconds: float, now: float) -> None:
        self.profile = profile
        self.keep = keep  # slices in the window, the current one included
        self.slice_seconds = slice_seconds
        self.slices: list[list[np.ndarray]] = []
        self.current = [np.zeros_like(f.counts) for f in profile.features]
        self.started = now

    def add(self, array: np.ndarray, now: float) -> None:
        self._rotate(now)
        for counts, feature, values in zip(self.current, self.profile.features, self.profile.split(array)):
            counts += feature.bin_counts(values)

    def _rotate(self, now: float) -> None:
        if now - self.started > self.slice_seconds * self.keep:  # a long quiet spell: start afresh
            self.slices, self.started = [], now
            self.current = [np.zeros_like(f.counts) for f in self.profile.features]
            return
        while now - self.started >= self.slice_seconds:
            self.slices = [*self.slices, self.current][-(self.keep - 1) :] if self.keep > 1 else []
            self.current = [np.zeros_like(f.counts) for f in self.profile.features]
            self.started += self.slice_seconds

    def drift(self, now: float) -> TensorDrift:
        self._rotate(now)
        worst = TensorDrift(0.0, 0.0, 0, 0)
        for index, feature in enumerate(self.profile.features):
            window = sum((s[index] for s in self.slices), self.current[index].copy())
            n = int(window.sum())
            if not n:
                continue
            value = psi(feature.counts, window)
            ks = ks_statistic(feature.counts, window) if feature.kind == "numeric" else 0.0
            if value >= worst.psi:
                worst = TensorDrift(value, max(ks, worst.ks), index, n)
            else:
                worst.ks = max(ks, worst.ks)
        return worst


@dataclass(slots=True)
class VersionMonitor:
    """One version: reference profiles (from a file, or built from its first requests), windows and quality counts."""

    model: str
    version: str
    reference_rows: int  # how many rows of traffic make the reference when no file gives one
    window_seconds: float
    profiles: dict[str, Profile] = field(default_factory=dict)  # tensor name -> profile ("in:X" / "out:Y")
    windows: dict[str, _SlidingCounts] = field(default_factory=dict)
    quality: dict[tuple[str, str], int] = field(default_factory=dict)  # (tensor, issue) -> count
    _collecting: dict[str, list[np.ndarray]] = field(default_factory=dict)
    _collected_rows: int = 0
    _collected_values: dict[str, int] = field(default_factory=dict)
    reference_source: str = ""

    def set_reference(self, arrays: dict[str, np.ndarray], source: str, now: float) -> None:
        """Reference profiles from samples of each tensor (keys "in:NAME" / "out:NAME")."""
        self.use_profiles({name: build_profile(name, array) for name, array in arrays.items() if array.size}, source, now)

    def use_profiles(self, profiles: dict[str, Profile], source: str, now: float) -> None:
        """These reference profiles from now on, with fresh windows (six slices of the window's length)."""
        self.profiles = profiles
        self.windows = {name: _SlidingCounts(p, 6, self.window_seconds / 6, now) for name, p in profiles.items()}
        self.reference_source = source
        self._collecting.clear()
        self._collected_values.clear()

    def observe_many(self, samples: list[dict[str, np.ndarray]], now: float) -> None:
        """Sampled requests' inputs and outputs, taken together: when their tensors agree in names and in shape past
        the first axis, each tensor is stacked and costs one pass (the usual case: one client, one model)."""
        stacked = _stacked(samples) if self.profiles else None  # a reference is made of exactly its N requests
        if stacked is not None:
            self.observe(stacked, now, requests=len(samples))
            return
        for tensors in samples:
            self.observe(tensors, now)

    def observe(self, tensors: dict[str, np.ndarray], now: float, requests: int = 1) -> None:
        """One sampled request's inputs and outputs (or `requests` of them stacked)."""
        for name, array in tensors.items():
            self._check_quality(name, array)
        if not self.profiles:
            self._collect(tensors, now, requests)
            return
        for name, array in tensors.items():
            window = self.windows.get(name)
            if window is not None:
                window.add(array, now)

    def drift(self, now: float) -> dict[str, TensorDrift]:
        return {name: window.drift(now) for name, window in self.windows.items()}

    def _collect(self, tensors: dict[str, np.ndarray], now: float, requests: int) -> None:
        for name, array in tensors.items():
            parts = self._collecting.setdefault(name, [])
            if self._collected_values.get(name, 0) < _REFERENCE_VALUES:
                if array.ndim >= 2:  # the features a profile looks at, as [rows, features]
                    array = array.reshape(-1, array.shape[-1])[:, :MAX_FEATURES]
                parts.append(np.array(array, copy=True))
                self._collected_values[name] = self._collected_values.get(name, 0) + array.size
        self._collected_rows += requests
        if self._collected_rows >= self.reference_rows:
            arrays = {name: np.concatenate([a.reshape(-1, *a.shape[1:]) if a.ndim else a.reshape(1) for a in parts])
                      for name, parts in self._collecting.items()}  # fmt: skip
            self.set_reference(arrays, f"the first {self._collected_rows} sampled requests", now)

    def _check_quality(self, name: str, array: np.ndarray) -> None:
        counts = self.quality
        if array.dtype.kind == "f":
            nan = int(np.isnan(array).sum())
            inf = int(np.isinf(array).sum())
            if nan:
                counts[(name, "nan")] = counts.get((name, "nan"), 0) + nan
            if inf:
                counts[(name, "inf")] = counts.get((name, "inf"), 0) + inf
        if array.dtype.kind in "OSU":
            empty = malformed = 0
            for value in array.ravel().tolist():
                if isinstance(value, bytes):
                    if not value:
                        empty += 1
                    else:
                        try:
                            value.decode("utf-8")
                        except UnicodeDecodeError:
                            malformed += 1
            if empty:
                counts[(name, "empty_bytes")] = counts.get((name, "empty_bytes"), 0) + empty
            if malformed:
                counts[(name, "malformed_bytes")] = counts.get((name, "malformed_bytes"), 0) + malformed
            return
        profile = self.profiles.get(name)
        if profile is None or array.dtype.kind not in "fiu":
            return
        outside = 0
        for feature, values in zip(profile.features, profile.split(array)):
            if feature.kind == "numeric" and values.size:
                finite = values[np.isfinite(values)]
                outside += int(((finite < feature.low) | (finite > feature.high)).sum())
        if outside:
            counts[(name, "out_of_range")] = counts.get((name, "out_of_range"), 0) + outside


def _stacked(samples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray] | None:
    """The samples' tensors stacked along the first axis; None when they do not agree (names, dtype, shape)."""
    if len(samples) == 1:
        return samples[0]
    first = samples[0]
    if any(tensors.keys() != first.keys() for tensors in samples):
        return None
    stacked = {}
    for name, head in first.items():
        arrays = [tensors[name] for tensors in samples]
        if head.ndim == 0 or any(a.ndim != head.ndim or a.shape[1:] != head.shape[1:] or a.dtype != head.dtype for a in arrays):
            return None
        stacked[name] = np.concatenate(arrays)
    return stacked
