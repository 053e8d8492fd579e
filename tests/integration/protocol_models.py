"""Models and sample tensors the protocol tests share: an identity ("echo") ONNX model per Triton data type and
an FP32 add/sub model with a label file, built with onnx.helper into a temporary repository."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from examples.build_models import add_sub, identity
from onnx import TensorProto

__all__ = ["PYTHON_ENSEMBLE", "DTYPES", "ONNX_TYPES", "TRITON_EXTENSIONS", "HTTP_TRACE_DEFAULTS", "build_protocol_repository", "echo_model", "sample", "as_bytes_array"]

# Every Triton data type and the ONNX element type of its echo model.
ONNX_TYPES: dict[str, int] = {
    "BOOL": TensorProto.BOOL,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "FP16": TensorProto.FLOAT16,
    "BF16": TensorProto.BFLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}
DTYPES = tuple(ONNX_TYPES)

ADD_SUB_LABELS = ["alpha", "beta", "gamma", "delta"]


def echo_model(datatype: str) -> str:
    return f"echo_{datatype.lower()}"


def build_protocol_repository(repository: Path) -> Path:
    """echo_<type> for every type (INPUT0 -> OUTPUT0, dims [-1], max_batch_size 8) and add_sub (FP32 [4],
    labels on OUTPUT0). Names do not clash with examples/model_repository so both can be served together."""
    for datatype, onnx_type in ONNX_TYPES.items():
        name = echo_model(datatype)
        identity(repository / name / "1" / "model.onnx", onnx_type, name)
        config_type = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
        (repository / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
            f'input [ {{ name: "INPUT0" data_type: {config_type} dims: [ -1 ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: {config_type} dims: [ -1 ] }} ]\n'
        )
    add_sub(repository / "add_sub" / "1" / "model.onnx", TensorProto.FLOAT, 4)
    (repository / "add_sub" / "config.pbtxt").write_text(
        'name: "add_sub"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" }, '
        '{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    (repository / "add_sub" / "labels.txt").write_text("\n".join(ADD_SUB_LABELS) + "\n")
    return repository


def sample(datatype: str) -> np.ndarray:
    """A [2, 3] tensor of `datatype` that includes each type's extremes (BF16 as float32 values bf16 holds)."""
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if datatype == "BYTES":
        return np.array([[b"abc", b"", "\u00fcn\u00efc\u00f8de".encode()], [b"x" * 300, b"0", b" spaced "]], dtype=np.object_)
    if datatype in ("FP16", "FP32", "FP64"):
        dtype = np.dtype(datatype.replace("FP", "float"))
        info = np.finfo(dtype)
        return np.array([[-1.5, 0.0, info.max], [info.min, info.tiny, 0.25]], dtype=dtype)
    if datatype == "BF16":
        return np.array([[1.0, -2.0, 0.5], [2.0**127, -0.0, 65536.0]], dtype=np.float32)
    dtype = np.dtype(datatype.lower())
    iinfo = np.iinfo(dtype)
    return np.array([[iinfo.min, 0, iinfo.max], [1, iinfo.max - 1, 7]], dtype=dtype)


def as_bytes_array(array: np.ndarray) -> np.ndarray:
    """BYTES results come back as bytes (binary) or str (JSON); compare them as bytes."""
    flat = [item.encode() if isinstance(item, str) else bytes(item) for item in array.reshape(-1)]
    result = np.empty(len(flat), dtype=np.object_)
    result[:] = flat
    return result.reshape(array.shape)


# What real Triton 2.51 lists in its server metadata (kept apart from the server's own list on purpose).
TRITON_EXTENSIONS = {
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
}
# The trace settings a fresh server answers over HTTP.
HTTP_TRACE_DEFAULTS = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_file": "",
    "trace_mode": "triton",
}


# An ensemble of one step over examples/model_repository/add_sub_python (a copy of which sits beside it).
PYTHON_ENSEMBLE = """
name: "python_ensemble"
platform: "ensemble"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ {
  model_name: "add_sub_python" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" }
} ] }
"""
