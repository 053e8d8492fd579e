"""The classification extension's refusals, in Triton's words."""

from __future__ import annotations

import numpy as np
import pytest

from nereid.core.classification import MAX_CLASSIFICATION_ELEMENTS, classify
from nereid.core.errors import NereidError
from nereid.core.types import OutputTensor


def _output(data: np.ndarray, datatype: str) -> OutputTensor:
    return OutputTensor("OUTPUT0", datatype, data.shape, data)


def test_top_k_of_each_batch_item() -> None:
    result = classify(_output(np.array([[0.1, 0.9, 0.5]], dtype=np.float32), "FP32"), 2, ["a", "b", "c"], batching=True)
    assert result.data.tolist() == [[b"0.900000:1:b", b"0.500000:2:c"]]


def test_bytes_outputs_and_outputs_over_a_million_elements_are_refused() -> None:
    with pytest.raises(NereidError, match="class result not available for output due to unsupported type 'BYTES'"):
        classify(_output(np.array([b"x"], dtype=np.object_), "BYTES"), 1, [], batching=False)
    big = np.ones((1, MAX_CLASSIFICATION_ELEMENTS + 1), dtype=np.float32)
    with pytest.raises(NereidError, match="classification output tensor too large"):
        classify(_output(big, "FP32"), 1, [], batching=True)
