"""pb_utils as a model sees it, without a server: its data-type helpers follow core.dtypes' table and Triton's,
its BYTES helpers take every element form, and Logger records carry the model's own file and line."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from nereid.backends.python import pb_runtime, pb_utils
from nereid.core.dtypes import TRITON_DTYPES


class _Recorder:
    def __init__(self) -> None:
        self.records: list[tuple[int, str, str, int]] = []

    def log(self, level: int, message: str, filename: str, lineno: int) -> None:
        self.records.append((level, message, filename, lineno))


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    detached: Any = pb_runtime.current
    recorder = _Recorder()
    pb_utils._bind(recorder)
    yield recorder
    pb_utils._bind(detached)


def test_logger_records_name_the_line_of_the_model_that_logged(recorder: _Recorder) -> None:
    first = sys._getframe().f_lineno + 1
    pb_utils.Logger.log_info("one")
    pb_utils.Logger.log_warn(b"two")
    pb_utils.Logger.log("three", pb_utils.LogLevel.ERROR)
    pb_utils.Logger.log_verbose("4")
    assert recorder.records == [
        (0, "one", __file__, first),
        (1, "two", __file__, first + 1),
        (2, "three", __file__, first + 2),
        (3, "4", __file__, first + 3),
    ]


def test_pb_utils_refuses_arguments_as_tritons_pybind_layer_does(recorder: _Recorder) -> None:
    """qa/L0_backend_python/argument_validation: None where a value is needed is a TypeError (a None inside the list
    of tensors a TritonModelException); a log level is a LogLevel, a log message text."""
    tensor = pb_utils.Tensor("IN", np.array([1, 2], np.int32))
    fine: dict[str, Any] = {"model_name": "m", "inputs": [tensor], "requested_output_names": ["OUT"]}
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceRequest(**{**fine, "inputs": [None]})
    for argument in ("inputs", "model_name", "requested_output_names", "correlation_id", "request_id", "model_version", "flags"):
        with pytest.raises(TypeError):
            pb_utils.InferenceRequest(**{**fine, argument: None})
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(**{**fine, "requested_output_names": [None]})
    pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=[None])
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=None)  # type: ignore[arg-type]
    assert pb_utils.InferenceResponse().output_tensors() == []
    for call in (lambda: pb_utils.Logger.log("x", None), lambda: pb_utils.Logger.log("x", 1), lambda: pb_utils.Logger.log_info(None)):
        with pytest.raises(TypeError):
            call()
    assert recorder.records == []


def test_pb_utils_dtype_helpers_follow_core_dtypes_and_tritons_tables() -> None:
    for name in TRITON_DTYPES:
        if name in ("BF16",):
            assert pb_utils.triton_to_numpy_type(pb_utils.DataType.BF16) is None  # as Triton's table: none
            continue
        number = int(pb_utils.DataType[name])
        assert np.dtype(pb_utils.triton_to_numpy_type(number)) == np.dtype(pb_utils.triton_string_to_numpy(
            "TYPE_STRING" if name == "BYTES" else f"TYPE_{name}"
        ))
        assert pb_utils.numpy_to_triton_type(pb_utils.triton_to_numpy_type(number)) == number
    assert pb_utils.TRITON_STRING_TO_NUMPY["TYPE_BOOL"] is bool
    assert pb_utils.numpy_to_triton_type(np.bytes_) == pb_utils.DataType.BYTES
    assert pb_utils.numpy_to_triton_type(np.str_) is None and pb_utils.numpy_to_triton_type(np.complex64) is None
    with pytest.raises(pb_utils.TritonModelException, match="complex64 has no Triton data type"):
        pb_utils.Tensor("C", np.zeros(2, np.complex64))


def test_pb_utils_bytes_helpers_round_trip_every_element_form() -> None:
    elements = np.array([b"raw", "text\u00e9", bytearray(b"ba"), memoryview(b"mv"), 7], dtype=object)
    encoded = pb_utils.serialize_byte_tensor(elements)
    assert list(pb_utils.deserialize_bytes_tensor(encoded)) == [b"raw", "text\u00e9".encode(), b"ba", b"mv", b"7"]
    # A numeric array's elements as the text of their Python values (float32 0.1 is not written as "0.1").
    numbers = pb_utils.serialize_byte_tensor(np.array([0.1], np.float32))
    assert list(pb_utils.deserialize_bytes_tensor(numbers)) == [str(float(np.float32(0.1))).encode()]


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ([1], "Expect dict, got <class 'list'>"),
        ({1: "a"}, "Expect parameters keys to have type str, found type <class 'int'>"),
        ({"f": 1.5}, "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
        ({"n": None}, "Expect parameters values to have type bool/int/str, found type <class 'NoneType'>"),
        ({"l": [1]}, "Expect parameters values to have type bool/int/str, found type <class 'list'>"),
    ],
)
def test_response_parameters_are_checked_in_the_python_backends_words(parameters: Any, expected: str) -> None:
    """As the python_backend releases that have InferenceResponse(parameters=...) (qa/L0_backend_python/parameters):
    str keys, and bool, int or str values only."""
    with pytest.raises(pb_utils.TritonModelException) as caught:
        pb_utils.InferenceResponse(parameters=parameters)
    assert str(caught.value) == expected
    ok = pb_utils.InferenceResponse(parameters={"b": True, "i": 2, "s": "x"})
    assert json.loads(ok.parameters()) == {"b": True, "i": 2, "s": "x"}


def test_histogram_buckets_and_metrics_whose_family_is_gone_are_refused() -> None:
    """As Triton (qa/L0_backend_python/custom_metrics): buckets must rise strictly; they are not sorted for the model."""

    class Runtime:
        ops: list[Any] = []

        def call(self, kind: str, payload: Any) -> Any:
            return None

        def metric_op(self, op: Any) -> None:
            self.ops.append(op)

    detached: Any = pb_runtime.current
    runtime = Runtime()
    pb_utils._bind(runtime)
    try:
        family = pb_utils.MetricFamily("h", "a histogram", pb_utils.MetricFamily.HISTOGRAM)
        for buckets in ([2.5, 0.1, 1.0], [1.0, 1.0, 2.0]):
            with pytest.raises(pb_utils.TritonModelException, match="strictly increasing"):
                family.Metric(labels={}, buckets=buckets)
        family.Metric(labels={}, buckets=[0.1, 1.0])
        # A metric outlives its family only to refuse every operation, in Triton's words (custom_metrics'
        # test_metric_lifetime_error).
        gauge = pb_utils.MetricFamily("g", "a gauge", pb_utils.MetricFamily.GAUGE)
        metric = gauge.Metric(labels={})
        metric.set(1.0)
        del gauge
        for operation in (lambda: metric.set(2.0), lambda: metric.increment(1.0), lambda: metric.value()):
            with pytest.raises(pb_utils.TritonModelException, match="the corresponding 'MetricFamily' has been deleted"):
                operation()
    finally:
        pb_utils._bind(detached)
    assert [op[3] for op in runtime.ops] == [(0.1, 1.0), None, 1.0]
