"""The TENSORS trace level (`--trace-config level=TENSORS`): each input as TENSOR_QUEUE_INPUT and each output as
TENSOR_BACKEND_OUTPUT, with Triton's layout and number formatting, next to real Triton's trace file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.tracing_models import TWICE_ENSEMBLE
from tests.servers import start_nereid, start_real_triton

MODELS = Path(__file__).parent.parent / "models" / "python"

# INT8 and UINT8 are left out: Triton streams them as raw characters (see the unit test of the formatting).
_VALUES: dict[str, np.ndarray] = {
    "BOOL": np.array([True, False, True]),
    "INT16": np.array([-32768, 7], np.int16),
    "INT32": np.array([-5, 0, 2147483647], np.int32),
    "INT64": np.array([-(2**63), 2**62], np.int64),
    "UINT16": np.array([65535], np.uint16),
    "UINT32": np.array([4294967295, 1], np.uint32),
    "UINT64": np.array([2**64 - 1, 0], np.uint64),
    "FP16": np.array([0.5, 65504], np.float16),
    "FP32": np.array([0.1, 1e-7, 1e10, 123456789, np.nan, np.inf, -np.inf, -0.0, 2.5], np.float32),
    "FP64": np.array([0.1, 1 / 3, 1e300, 1e-300, 12345678901234567.0], np.float64),
    "STRING": np.array([b"hello", b"a,b", "d\u00e9j\u00e0".encode()], np.object_),
}


def _infer_every_type(server: Any) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        inputs = []
        for kind, values in _VALUES.items():
            tensor = httpclient.InferInput("IN_" + kind, list(values.shape), "BYTES" if kind == "STRING" else kind)
            tensor.set_data_from_numpy(values, binary_data=kind in ("STRING", "FP16", "FP32", "FP64"))  # NaN: not as JSON
            inputs.append(tensor)
        empty = httpclient.InferInput("IN_INT8", [0], "INT8")  # no elements: Triton writes no record for it
        empty.set_data_from_numpy(np.array([], np.int8))
        inputs.append(empty)
        outputs = [httpclient.InferRequestedOutput(name) for name in ("OUT_FP32", "OUT_STRING", "OUT_BOOL")]
        client.infer("dtypes", inputs, outputs=outputs, request_id="every-type")


def _written(tmp_path: Path, name: str, *levels: str) -> list[dict[str, Any]]:
    repository = tmp_path / "repository"
    if not repository.exists():
        shutil.copytree(MODELS / "dtypes", repository / "dtypes")
    trace_file = tmp_path / f"{name}.json"
    flags = [f"--trace-config=triton,file={trace_file}", "--trace-config=rate=1"]
    flags += [f"--trace-config=level={level}" for level in levels]
    server = start_real_triton(repository, *flags) if name == "triton" else start_nereid(repository, *flags, log_dir=tmp_path)
    try:
        _infer_every_type(server)
    finally:
        server.stop()
    records: list[dict[str, Any]] = json.loads(trace_file.read_text(encoding="utf-8"))
    return records


def _tensors(records: list[dict[str, Any]]) -> list[tuple[str, str, str, str, str]]:
    return sorted(
        (r["activity"], r["tensor"]["name"], r["tensor"]["data"], r["tensor"]["shape"], r["tensor"]["dtype"])
        for r in records
        if "activity" in r
    )


@pytest.mark.differential
def test_tensor_records_match_real_triton_for_every_type(tmp_path: Path) -> None:
    triton = _written(tmp_path, "triton", "TIMESTAMPS", "TENSORS")
    nereid = _written(tmp_path, "nereid", "TIMESTAMPS", "TENSORS")
    assert _tensors(nereid) == _tensors(triton)
    inputs = {name: data for activity, name, data, _, _ in _tensors(nereid) if activity == "TENSOR_QUEUE_INPUT"}
    assert inputs["IN_FP32"] == "0.1,1e-07,1e+10,1.23457e+08,nan,inf,-inf,-0,2.5"
    assert inputs["IN_STRING"] == '"hello","a,b","d\u00e9j\u00e0"'
    assert inputs["IN_FP16"] == ""  # Triton does not format half floats
    assert "IN_INT8" not in inputs
    outputs = {name for activity, name, *_ in _tensors(nereid) if activity == "TENSOR_BACKEND_OUTPUT"}
    assert outputs == {"OUT_FP32", "OUT_STRING", "OUT_BOOL"}  # the outputs the client asked for
    # Every record belongs to the request's trace, which also has its timestamps.
    (trace_id,) = {r["id"] for r in nereid}
    assert any(r.get("request_id") == "every-type" for r in nereid)
    assert any("timestamps" in r for r in nereid) and trace_id == 1


@pytest.mark.differential
def test_tensors_level_alone_writes_only_tensor_records_like_real_triton(tmp_path: Path) -> None:
    triton = _written(tmp_path, "triton", "TENSORS")
    nereid = _written(tmp_path, "nereid", "TENSORS")
    assert all(set(r) == {"id", "activity", "tensor"} for r in triton)
    assert all(set(r) == {"id", "activity", "tensor"} for r in nereid)
    assert _tensors(nereid) == _tensors(triton)


@pytest.mark.differential
def test_an_ensembles_steps_record_their_tensors_like_real_triton(tmp_path: Path) -> None:
    """Each step's trace has the step's inputs and the outputs the ensemble takes from it."""
    from tests.conftest import EXAMPLES

    repository = tmp_path / "repository"
    shutil.copytree(EXAMPLES / "add_sub_python", repository / "add_sub_python")
    (repository / "add_sub_twice" / "1").mkdir(parents=True)
    (repository / "add_sub_twice" / "config.pbtxt").write_text(TWICE_ENSEMBLE)
    written: dict[str, list[tuple[str, ...]]] = {}
    for name, start in (("triton", start_real_triton), ("nereid", start_nereid)):
        trace_file = tmp_path / f"{name}.json"
        flags = [f"--trace-config=triton,file={trace_file}", "--trace-config=rate=1", "--trace-config=level=TENSORS"]
        server = start(repository, *flags) if name == "triton" else start(repository, *flags, log_dir=tmp_path)
        try:
            with httpclient.InferenceServerClient(server.http_url) as client:
                inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("A", "B")]
                for tensor in inputs:
                    tensor.set_data_from_numpy(np.full((1, 4), 2.0, dtype=np.float32))
                client.infer("add_sub_twice", inputs)
        finally:
            server.stop()
        records = json.loads(trace_file.read_text())
        # Trace ids differ in order; what each trace holds must not.
        by_trace: dict[int, list[tuple[str, str, str]]] = {}
        for r in records:
            by_trace.setdefault(r["id"], []).append((r["activity"], r["tensor"]["name"], r["tensor"]["data"]))
        written[name] = sorted(tuple(sorted(entries)) for entries in by_trace.values())  # type: ignore[misc]
    assert written["nereid"] == written["triton"]
    assert len(written["nereid"]) == 3  # the ensemble's trace and one per step
