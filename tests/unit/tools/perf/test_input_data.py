"""Input data for `nereid perf`: generated tensors, perf_analyzer's input-data JSON (flat values, content+shape,
b64, streams), batching, and errors that name the entry and the input."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from nereid.tools.perf import PerfConfig, PerfError
from nereid.tools.perf.control_client import ModelInfo, TensorSpec
from nereid.tools.perf.input_data import build_inputs


def _model(*inputs: TensorSpec, max_batch: int = 8, sequence: bool = False) -> ModelInfo:
    return ModelInfo("m", "", "python", max_batch, list(inputs), [TensorSpec("OUT", "FP32", [4])], False, sequence)


def _json_file(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "data.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_random_and_zero_data_have_the_batched_shape() -> None:
    model = _model(TensorSpec("A", "INT32", [16]), TensorSpec("B", "FP32", [2, -1]))
    inputs = build_inputs(model, PerfConfig("m", batch_size=4, shapes={"B": [2, 3]}))
    (sample,) = inputs.streams[0]
    a, b = sample
    assert a.shape == [4, 16] and len(a.raw) == 4 * 16 * 4 and len(a.values) == 64
    assert b.shape == [4, 2, 3] and np.frombuffer(b.raw, np.float32).tolist() == pytest.approx(b.values)
    zero = build_inputs(model, PerfConfig("m", input_data=["zero"], shapes={"B": [2, 3]})).streams[0][0]
    assert zero[0].raw == bytes(64) and zero[0].shape == [1, 16]


def test_non_batching_model_uses_the_shape_as_is() -> None:
    model = _model(TensorSpec("A", "INT64", [3]), max_batch=0)
    (a,) = build_inputs(model, PerfConfig("m")).streams[0][0]
    assert a.shape == [3]
    with pytest.raises(PerfError, match="does not support batching"):
        build_inputs(model, PerfConfig("m", batch_size=2))


def test_variable_dims_without_shape_is_a_clear_error() -> None:
    with pytest.raises(PerfError, match=r"input 'B' has variable dimensions \[-1\]: give its shape with --shape B:N"):
        build_inputs(_model(TensorSpec("B", "FP32", [-1])), PerfConfig("m"))


def test_strings_are_length_prefixed_for_binary_and_plain_for_json() -> None:
    model = _model(TensorSpec("S", "BYTES", [2]))
    (s,) = build_inputs(model, PerfConfig("m", string_data="hi")).streams[0][0]
    assert s.values == ["hi", "hi"]
    assert s.raw == struct.pack("<I", 2) + b"hi" + struct.pack("<I", 2) + b"hi"
    (r,) = build_inputs(model, PerfConfig("m", string_length=5)).streams[0][0]
    assert [len(v) for v in r.values] == [5, 5]


def test_json_file_in_perf_analyzer_format(tmp_path: Path) -> None:
    model = _model(TensorSpec("A", "INT32", [4]), TensorSpec("V", "FP32", [-1]))
    doc = {
        "data": [
            {"A": [[1, 2], [3, 4]], "V": {"content": [1.0, 2.0], "shape": [2]}},
            {"A": {"b64": base64.b64encode(np.arange(4, dtype=np.int32).tobytes()).decode()}, "V": {"content": [5.0], "shape": [1]}},
        ]
    }
    inputs = build_inputs(model, PerfConfig("m", input_data=[_json_file(tmp_path, doc)]))
    first, second = inputs.streams[0]
    assert first[0].values == [1, 2, 3, 4] and first[0].shape == [1, 4]
    assert first[1].shape == [1, 2] and first[1].values == [1.0, 2.0]
    assert second[0].values == [0, 1, 2, 3] and second[1].shape == [1, 1]
    assert inputs.from_user_data


def test_json_entries_are_batched_consecutively(tmp_path: Path) -> None:
    model = _model(TensorSpec("A", "INT32", [1]))
    path = _json_file(tmp_path, {"data": [{"A": [i]} for i in range(3)]})
    samples = build_inputs(model, PerfConfig("m", batch_size=2, input_data=[path])).streams[0]
    assert [s[0].values for s in samples] == [[0, 1], [1, 2], [2, 0]]
    assert samples[0][0].shape == [2, 1]


def test_sequence_models_keep_one_stream_per_list(tmp_path: Path) -> None:
    model = _model(TensorSpec("A", "INT32", [1]), sequence=True)
    path = _json_file(tmp_path, {"data": [[{"A": [1]}, {"A": [2]}, {"A": [3]}], [{"A": [9]}]]})
    streams = build_inputs(model, PerfConfig("m", input_data=[path])).streams
    assert [[s[0].values[0] for s in stream] for stream in streams] == [[1, 2, 3], [9]]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"data": [{"A": [1, 2, 3]}]}, "entry 0, input 'A': 3 values for shape \\[4\\], expected 4"),
        ({"data": [{}]}, "entry 0: input 'A' is missing"),
        ({"data": [{"A": [1, 2, 3, 4], "Z": [1]}]}, "unknown input\\(s\\) \\['Z'\\]"),
        ({"data": [{"A": {"b64": "!!"}}]}, "not valid base64"),
        ({"data": [{"A": {"b64": "AAAA"}}]}, "3 bytes of INT32 for shape \\[4\\], expected 16"),
        ({"data": [{"A": ["x", "y", "z", "w"]}]}, "values are not INT32"),
        ({"rows": []}, "non-empty \"data\" list"),
    ],
)
def test_bad_input_data_names_entry_and_input(tmp_path: Path, doc: object, message: str) -> None:
    with pytest.raises(PerfError, match=message):
        build_inputs(_model(TensorSpec("A", "INT32", [4])), PerfConfig("m", input_data=[_json_file(tmp_path, doc)]))


def test_directory_input_holds_one_raw_file_per_input(tmp_path: Path) -> None:
    (tmp_path / "A").write_bytes(np.arange(4, dtype=np.int32).tobytes())
    (tmp_path / "S").write_text("one\ntwo\n")
    model = _model(TensorSpec("A", "INT32", [4]), TensorSpec("S", "BYTES", [2]))
    a, s = build_inputs(model, PerfConfig("m", input_data=[str(tmp_path)])).streams[0][0]
    assert a.values == [0, 1, 2, 3] and s.values == ["one", "two"]


def test_batch_size_above_max_and_unknown_shape_names_are_refused() -> None:
    model = _model(TensorSpec("A", "INT32", [4]))
    with pytest.raises(PerfError, match="exceeds max_batch_size 8"):
        build_inputs(model, PerfConfig("m", batch_size=9))
    with pytest.raises(PerfError, match="--shape: unknown input"):
        build_inputs(model, PerfConfig("m", shapes={"Q": [1]}))
