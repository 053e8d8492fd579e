"""How far a shadow's answer is from the primary's, per output tensor: the top class's mismatch rate for
classification-shaped outputs, mean absolute and relative differences for numbers, exact equality for BYTES.
Runs off the request path (the monitor's thread); pure numpy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nereid.core.types import InferenceResponse

__all__ = ["OutputComparison", "compare_responses", "divergence"]


@dataclass(frozen=True, slots=True)
class OutputComparison:
    """One output of one request, compared. `mismatch` is the gated figure: the share of rows whose top class
    differs (classification-shaped), the mean relative difference (other numbers), or the share of unequal
    elements (BYTES); a missing or reshaped output counts as 1."""

    name: str
    kind: str  # "top_class", "numeric", "bytes" or "missing"
    mismatch: float
    mean_abs_diff: float = 0.0
    mean_rel_diff: float = 0.0


def _classification_shaped(array: np.ndarray) -> bool:
    return array.dtype.kind == "f" and array.ndim >= 2 and array.shape[-1] >= 2


def _compare(name: str, primary: np.ndarray, shadow: np.ndarray) -> OutputComparison:
    if primary.shape != shadow.shape:
        return OutputComparison(name, "missing", 1.0)
    if primary.dtype == shadow.dtype and np.array_equal(primary, shadow):  # the usual answer, told apart cheaply
        kind = "bytes" if primary.dtype.kind in "OSU" else "top_class" if _classification_shaped(primary) else "numeric"
        return OutputComparison(name, kind, 0.0)
    if primary.dtype.kind in "OSU" or shadow.dtype.kind in "OSU":
        equal = np.array([a == b for a, b in zip(primary.ravel(), shadow.ravel())], dtype=bool)
        return OutputComparison(name, "bytes", float(1.0 - equal.mean()) if equal.size else 0.0)
    a = primary.astype(np.float64, copy=False)
    b = shadow.astype(np.float64, copy=False)
    diff = np.abs(a - b)
    finite = np.isfinite(diff)
    mean_abs = float(diff[finite].mean()) if finite.any() else 0.0
    scale = np.maximum(np.abs(a), np.abs(b))
    rel = np.divide(diff, scale, out=np.zeros_like(diff), where=(scale > 0) & finite)
    mean_rel = float(rel.mean()) if rel.size else 0.0
    if _classification_shaped(primary):
        rows_a = a.reshape(-1, a.shape[-1]).argmax(axis=1)
        rows_b = b.reshape(-1, b.shape[-1]).argmax(axis=1)
        return OutputComparison(name, "top_class", float((rows_a != rows_b).mean()), mean_abs, mean_rel)
    return OutputComparison(name, "numeric", mean_rel, mean_abs, mean_rel)


def compare_responses(primary: InferenceResponse, shadow: InferenceResponse) -> list[OutputComparison]:
    """Each of the primary's outputs against the shadow's output of the same name."""
    theirs = {output.name: output.data for output in shadow.outputs}
    compared = []
    for output in primary.outputs:
        other = theirs.get(output.name)
        if other is None:
            compared.append(OutputComparison(output.name, "missing", 1.0))
        else:
            compared.append(_compare(output.name, np.asarray(output.data), np.asarray(other)))
    return compared


def divergence(comparisons: list[OutputComparison]) -> float:
    """One request's divergence: the worst of its outputs' (0 when the shadow answered alike)."""
    return max((c.mismatch for c in comparisons), default=0.0)
