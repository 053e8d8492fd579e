"""Drift statistics of one tensor's values against a reference profile, over bounded binned counts: the population
stability index (PSI) over the reference's quantile bins for numbers (per feature for [batch, features] tensors),
PSI over categories for integers with few values and for BYTES, and the two-sample Kolmogorov-Smirnov statistic
from the same bins. numpy only: each statistic is a few lines over counts, so no further dependency is needed."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Profile", "FeatureProfile", "build_profile", "psi", "ks_statistic", "BINS", "MAX_FEATURES"]

BINS = 10  # quantile bins of a numeric feature: deciles of the reference
MAX_FEATURES = 64  # a wider tensor is profiled over its first 64 features (bounded state)
MAX_CATEGORIES = 32  # integers with at most this many distinct reference values are categories
_EPSILON = 1e-4  # a bin the reference or the window never saw still counts this share (PSI stays finite)


def psi(expected: np.ndarray, actual: np.ndarray) -> float:
    """The population stability index of two distributions over the same bins (counts or shares): 0 alike, above
    0.1 a shift worth a look, above 0.25 a large one (the usual reading)."""
    e = expected / max(expected.sum(), 1)
    a = actual / max(actual.sum(), 1)
    e = np.clip(e, _EPSILON, None)
    a = np.clip(a, _EPSILON, None)
    return float(np.sum((a - e) * np.log(a / e)))


def ks_statistic(expected: np.ndarray, actual: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic over ordered bins: the largest gap between the cumulative shares."""
    e = np.cumsum(expected) / max(expected.sum(), 1)
    a = np.cumsum(actual) / max(actual.sum(), 1)
    return float(np.max(np.abs(e - a))) if e.size else 0.0


@dataclass(slots=True)
class FeatureProfile:
    """One feature of a tensor: numeric (bin edges between the reference's quantiles) or categorical (the
    reference's values); the reference's counts per bin, with a last bin for what falls outside the categories."""

    kind: str  # "numeric" or "categorical"
    edges: np.ndarray = field(default_factory=lambda: np.empty(0))
    categories: list[object] = field(default_factory=list)
    counts: np.ndarray = field(default_factory=lambda: np.empty(0))
    low: float = 0.0
    high: float = 0.0

    def bin_counts(self, values: np.ndarray) -> np.ndarray:
        """How many of `values` fall in each of the profile's bins."""
        if self.kind == "numeric":
            finite = values[np.isfinite(values)]
            return np.bincount(np.searchsorted(self.edges, finite, side="right"), minlength=len(self.edges) + 1)
        index = {c: i for i, c in enumerate(self.categories)}
        out = np.zeros(len(self.categories) + 1, dtype=np.int64)
        for value in values.tolist():
            out[index.get(value, len(self.categories))] += 1
        return out


@dataclass(slots=True)
class Profile:
    """A tensor's reference profile: one FeatureProfile per feature (one for a tensor without a feature axis)."""

    name: str
    features: list[FeatureProfile]

    def split(self, array: np.ndarray) -> list[np.ndarray]:
        """A batch of this tensor as the values of each profiled feature."""
        return _features(array, len(self.features))


def _features(array: np.ndarray, limit: int) -> list[np.ndarray]:
    if array.dtype.kind in "OSU":
        return [np.asarray(array.ravel().tolist(), dtype=object)]
    if array.ndim >= 2 and array.shape[-1] > 1:
        flat = array.reshape(-1, array.shape[-1])
        return [flat[:, i] for i in range(min(flat.shape[1], limit))]
    return [array.ravel()]


def build_profile(name: str, samples: np.ndarray) -> Profile:
    """The profile of a tensor from reference samples ([rows, ...] as served)."""
    features = []
    for values in _features(samples, MAX_FEATURES):
        if values.dtype.kind in "OSU" or (values.dtype.kind in "iub" and len(np.unique(values)) <= MAX_CATEGORIES):
            categories, counts = np.unique(values.astype(object) if values.dtype.kind in "OSU" else values, return_counts=True)
            profile = FeatureProfile("categorical", categories=categories.tolist(), counts=np.append(counts, 0))
        else:
            floats = values.astype(np.float64, copy=False)
            floats = floats[np.isfinite(floats)]
            edges = np.unique(np.quantile(floats, np.linspace(0, 1, BINS + 1)[1:-1])) if floats.size else np.empty(0)
            profile = FeatureProfile("numeric", edges=edges)
            profile.counts = profile.bin_counts(floats)
            profile.low, profile.high = (float(floats.min()), float(floats.max())) if floats.size else (0.0, 0.0)
        features.append(profile)
    return Profile(name, features)
