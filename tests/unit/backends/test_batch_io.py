"""Each batch-input kind and the batch-output scatter, computed as Triton's model_config.proto and ragged-batching
guide describe them, on batches built by hand."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from nereid.backends.batch_io import BatchIO, batch_input_array
from nereid.backends.batching import split_outputs
from nereid.config.model_config import mc
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InputTensor

K = mc.BatchInput.Kind
I32 = np.dtype(np.int32)
F32 = np.dtype(np.float32)
RAGGED = [(1, 3), (1, 4), (1, 5)]  # the ragged-batching guide's three requests


def test_element_count_gives_each_requests_element_count() -> None:
    out = batch_input_array(K.BATCH_ELEMENT_COUNT, F32, RAGGED)
    assert out.dtype == F32 and out.tolist() == [3.0, 4.0, 5.0]
    # The whole request counts, batch dimension included.
    assert batch_input_array(K.BATCH_ELEMENT_COUNT, I32, [(2, 3), (1, 1)]).tolist() == [6, 1]


def test_accumulated_element_count_gives_where_each_request_ends() -> None:
    out = batch_input_array(K.BATCH_ACCUMULATED_ELEMENT_COUNT, I32, RAGGED)
    assert out.dtype == I32 and out.tolist() == [3, 7, 12]
    assert batch_input_array(K.BATCH_ACCUMULATED_ELEMENT_COUNT, F32, [(1, 2), (1, 2)]).tolist() == [2.0, 4.0]


def test_accumulated_element_count_with_zero_has_one_more_leading_zero() -> None:
    out = batch_input_array(K.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, I32, RAGGED)
    assert out.shape == (4,) and out.tolist() == [0, 3, 7, 12]
    assert batch_input_array(K.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, F32, [(1, 2)]).tolist() == [0.0, 2.0]


def test_max_element_count_as_shape_carries_the_largest_count_in_its_shape() -> None:
    out = batch_input_array(K.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE, I32, RAGGED)
    assert out.shape == (5,) and out.dtype == I32
    assert batch_input_array(K.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE, F32, [(2, 4), (1, 7)]).shape == (8,)


def test_batch_item_shape_has_a_row_per_batch_item() -> None:
    # model_config.proto's example: a batch-2 request of [3, 1] items and a batch-1 request of [2, 2] items.
    out = batch_input_array(K.BATCH_ITEM_SHAPE, I32, [(2, 3, 1), (1, 2, 2)])
    assert out.shape == (3, 2) and out.tolist() == [[3, 1], [3, 1], [2, 2]]
    flat = batch_input_array(K.BATCH_ITEM_SHAPE_FLATTEN, F32, [(2, 3, 1), (1, 2, 2)])
    assert flat.shape == (6,) and flat.dtype == F32 and flat.tolist() == [3, 1, 3, 1, 2, 2]
    assert batch_input_array(K.BATCH_ITEM_SHAPE, I32, RAGGED).tolist() == [[3], [4], [5]]


_CONFIG = """
name: "m"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true },
        { name: "DENSE" data_type: TYPE_FP32 dims: [ 2 ] } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: [ "END", "END_AGAIN" ] data_type: TYPE_INT32
                source_input: "INPUT" } ]
batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUT" source_input: "INPUT" } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "PLAIN" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def _request(length: int, rows: int = 1) -> InferenceRequest:
    data = np.arange(rows * length, dtype=np.float32).reshape(rows, length) + 100 * length
    dense = np.ones((rows, 2), dtype=np.float32)
    return InferenceRequest(
        "m", "1", [InputTensor("INPUT", "FP32", data.shape, data), InputTensor("DENSE", "FP32", dense.shape, dense)],
        batch_size=rows,
    )


def _batch_io() -> BatchIO:
    config = text_format.Parse(_CONFIG, mc.ModelConfig())
    batch_io = BatchIO.from_config(config)
    assert batch_io is not None
    return batch_io


def test_a_config_without_ragged_inputs_or_batch_io_builds_nothing() -> None:
    plain = text_format.Parse('name: "m" input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] } ]', mc.ModelConfig())
    assert BatchIO.from_config(plain) is None


def test_the_feed_gets_ragged_inputs_flat_and_the_batch_input_under_every_target_name() -> None:
    requests = [_request(3), _request(2, rows=2)]
    feed: dict[str, np.ndarray] = {"DENSE": np.ones((3, 2), dtype=np.float32)}
    _batch_io().complete_feed(feed, requests)
    assert feed["INPUT"].shape == (7,)
    np.testing.assert_array_equal(feed["INPUT"], np.concatenate([r.inputs[0].data.reshape(-1) for r in requests]))
    assert feed["END"].tolist() == [3, 7] and feed["END_AGAIN"].tolist() == [3, 7]
    assert feed["DENSE"].shape == (3, 2)  # left to ordinary batching


def test_a_batch_output_is_scattered_by_each_requests_source_input_shape() -> None:
    requests = [_request(3), _request(2, rows=2)]
    out = np.arange(7, dtype=np.float32)
    plain = np.array([[10.0], [20.0], [30.0]], dtype=np.float32)
    names = ["OUT", "PLAIN"]
    responses = split_outputs(requests, names, [out, plain], {"OUT": "FP32", "PLAIN": "FP32"}, True)
    _batch_io().scatter(requests, responses, names, [out, plain])
    first, second = ({t.name: t for t in r.outputs} for r in responses)
    assert first["OUT"].shape == (1, 3) and first["OUT"].data.tolist() == [[0, 1, 2]]
    assert second["OUT"].shape == (2, 2) and second["OUT"].data.tolist() == [[3, 4], [5, 6]]
    # Outputs that are not batch outputs keep the ordinary split by batch size.
    assert first["PLAIN"].data.tolist() == [[10.0]] and second["PLAIN"].data.tolist() == [[20.0], [30.0]]


def test_a_batch_output_too_small_for_the_batch_is_an_error_naming_it() -> None:
    requests = [_request(3), _request(4)]
    out = np.arange(5, dtype=np.float32)
    responses = split_outputs(requests, ["OUT"], [out], {"OUT": "FP32"}, True)
    with pytest.raises(NereidError, match="batch output 'OUT'"):
        _batch_io().scatter(requests, responses, ["OUT"], [out])
