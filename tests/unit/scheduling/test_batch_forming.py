"""The rules both batchers form batches by: the preferred-batch-size cut and the equal-shapes key."""

from __future__ import annotations

import numpy as np

from nereid.core.types import InferenceRequest, InputTensor
from nereid.scheduling.batch_forming import BatchSizes, shape_key


def _request(*shapes: tuple[str, tuple[int, ...]]) -> InferenceRequest:
    inputs = [InputTensor(name, "FP32", shape, np.zeros(shape, np.float32)) for name, shape in shapes]
    return InferenceRequest("m", "", inputs)


def test_the_cut_is_the_largest_preferred_size_the_queue_fills_below_max_batch_size() -> None:
    sizes = BatchSizes(8, [4, 2, 0, 16])  # 0 and sizes over max_batch_size never apply
    assert sizes.preferred == [2, 4] and sizes.target == 4
    assert [sizes.cut(n) for n in (1, 2, 3, 4, 7, 8, 20)] == [8, 2, 2, 4, 4, 8, 8]


def test_without_preferred_sizes_the_cut_and_target_are_max_batch_size() -> None:
    sizes = BatchSizes(6)
    assert sizes.target == 6 and sizes.cut(1) == 6 and sizes.cut(100) == 6


def test_shapes_match_by_input_name_whatever_order_the_inputs_came_in() -> None:
    a = _request(("X", (1, 3)), ("Y", (1, 5)))
    b = _request(("Y", (4, 5)), ("X", (2, 3)))  # other batch sizes, same non-batch dims
    assert shape_key(a, frozenset()) == shape_key(b, frozenset())
    assert shape_key(a, frozenset()) != shape_key(_request(("X", (1, 3)), ("Y", (1, 6))), frozenset())
    assert shape_key(a, frozenset()) != shape_key(_request(("X", (1, 3))), frozenset())  # an optional input missing


def test_ragged_inputs_never_keep_requests_apart() -> None:
    a = _request(("X", (1, 3)), ("R", (1, 7)))
    b = _request(("X", (1, 3)), ("R", (1, 2)))
    assert shape_key(a, frozenset({"R"})) == shape_key(b, frozenset({"R"}))
    assert shape_key(a, frozenset()) != shape_key(b, frozenset())
