"""A shadow's answer against the primary's, per output tensor."""

from __future__ import annotations

import numpy as np

from nereid.core.types import InferenceResponse, OutputTensor
from nereid.rollouts.compare import compare_responses, divergence


def _response(**outputs: np.ndarray) -> InferenceResponse:
    return InferenceResponse("m", "1", outputs=[OutputTensor(n, "FP32", a.shape, a) for n, a in outputs.items()])


def test_identical_answers_do_not_diverge_and_keep_their_kind() -> None:
    scores = np.array([[0.1, 0.9], [0.8, 0.2]], np.float32)
    words = np.array([b"cat", b"dog"], dtype=np.object_)
    numbers = np.array([1.0, np.nan])
    primary, shadow = _response(P=scores, S=words, N=numbers), _response(P=scores.copy(), S=words.copy(), N=numbers.copy())
    compared = compare_responses(primary, shadow)
    assert {c.name: c.kind for c in compared} == {"P": "top_class", "S": "bytes", "N": "numeric"}
    assert divergence(compared) == 0.0


def test_classification_shaped_outputs_count_rows_whose_top_class_changed() -> None:
    primary = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], np.float32)
    shadow = np.array([[0.2, 0.8], [0.1, 0.9], [0.3, 0.7], [0.6, 0.4]], np.float32)  # row 1's top class moved
    (compared,) = compare_responses(_response(P=primary), _response(P=shadow))
    assert compared.kind == "top_class" and compared.mismatch == 0.25
    assert compared.mean_abs_diff > 0


def test_numbers_give_mean_absolute_and_relative_differences() -> None:
    (compared,) = compare_responses(_response(Y=np.array([1.0, 2.0, 4.0])), _response(Y=np.array([1.0, 2.2, 4.0])))
    assert compared.kind == "numeric"
    assert np.isclose(compared.mean_abs_diff, 0.2 / 3)
    assert np.isclose(compared.mean_rel_diff, (0.2 / 2.2) / 3)


def test_bytes_are_compared_for_equality() -> None:
    primary = np.array([b"cat", b"dog"], dtype=np.object_)
    shadow = np.array([b"cat", b"cow"], dtype=np.object_)
    (compared,) = compare_responses(_response(S=primary), _response(S=shadow))
    assert compared.kind == "bytes" and compared.mismatch == 0.5


def test_a_missing_or_reshaped_output_diverges_fully() -> None:
    primary = _response(A=np.zeros(2), B=np.zeros(3))
    shadow = _response(A=np.zeros(4))
    kinds = {c.name: (c.kind, c.mismatch) for c in compare_responses(primary, shadow)}
    assert kinds == {"A": ("missing", 1.0), "B": ("missing", 1.0)}
