"""Triton's classification extension: replace an output by its top-k entries as "value:index[:label]" strings."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nereid.core.errors import NereidError
from nereid.core.types import OutputTensor

__all__ = ["MAX_CLASSIFICATION_ELEMENTS", "classify", "read_labels"]


MAX_CLASSIFICATION_ELEMENTS = 1_000_000


def read_labels(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def _format(value: object, is_float: bool) -> str:
    return f"{value:f}" if is_float else str(value)


def classify(output: OutputTensor, k: int, labels: list[str], batching: bool) -> OutputTensor:
    """Top-k per batch item (or of the whole tensor for non-batching models), as a BYTES tensor."""
    if output.datatype == "BYTES":
        raise NereidError.invalid(f"class result not available for output due to unsupported type '{output.datatype}'")
    if k < 1:
        raise NereidError.invalid(f"classification count for output '{output.name}' must be >= 1")
    data = output.data
    if data.size > MAX_CLASSIFICATION_ELEMENTS:  # Triton's bound on the work one request may ask for
        raise NereidError.invalid("classification output tensor too large")
    rows = data.reshape(data.shape[0], -1) if batching and data.ndim > 0 else data.reshape(1, -1)
    k = min(k, rows.shape[1])
    is_float = data.dtype.kind == "f"
    result = np.empty((rows.shape[0], k), dtype=object)
    for r, row in enumerate(rows):
        order = np.argsort(-row, kind="stable")[:k]
        for c, index in enumerate(order):
            text = f"{_format(row[index].item(), is_float)}:{index}"
            if index < len(labels):
                text += f":{labels[index]}"
            result[r, c] = text.encode()
    shape = result.shape if batching else (k,)
    return OutputTensor(output.name, "BYTES", shape, result.reshape(shape))
