"""Input tensors for a perf run: random or zero data, perf_analyzer's input-data JSON files (flat lists,
`{"content", "shape"}`, `{"b64"}`, one list per sequence stream) and per-input binary files in a directory.

It produces plain bytes and JSON values once, before the run; it knows nothing of the wire format.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nereid.tools.perf.config import PerfConfig, PerfError
from nereid.tools.perf.control_client import ModelInfo, TensorSpec

__all__ = ["InputSet", "Sample", "TensorData", "build_inputs", "numpy_dtype", "serialize_strings"]

_NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": np.uint16,  # raw bits; JSON gets the float values
}


def numpy_dtype(datatype: str) -> Any:
    try:
        return _NUMPY[datatype]
    except KeyError:
        raise PerfError(f"unsupported input datatype '{datatype}'") from None


@dataclass(slots=True)
class TensorData:
    """One input of one request: the shape includes the batch dimension when the model batches."""

    name: str
    datatype: str
    shape: list[int]
    raw: bytes  # the binary-extension / raw_input_contents bytes (BYTES: 4-byte length prefixes)
    values: list[Any]  # flat JSON values (BYTES: str)


Sample = list[TensorData]  # the inputs of one request


@dataclass(slots=True)
class InputSet:
    """Requests to send, grouped in streams. Ordinary models cycle through `streams[0]`; sequence models give
    each new sequence the next stream and play it back step by step."""

    streams: list[list[Sample]]
    from_user_data: bool  # streams come from a JSON file (the sequence length defaults to their lengths)


def serialize_strings(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def _deserialize_strings(raw: bytes, what: str) -> list[bytes]:
    items, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise PerfError(f"{what}: truncated BYTES element (each element needs a 4-byte length prefix)")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        items.append(raw[offset : offset + length])
        offset += length
    if offset != len(raw):
        raise PerfError(f"{what}: truncated BYTES element")
    return items


def _batch_shape(model: ModelInfo, shape: list[int], batch: int) -> list[int]:
    return [batch, *shape] if model.max_batch_size > 0 else list(shape)


def _resolve_shape(spec: TensorSpec, config: PerfConfig) -> list[int]:
    if spec.name in config.shapes:
        shape = config.shapes[spec.name]
        if len(shape) != len(spec.dims) or any(d != -1 and d != s for d, s in zip(spec.dims, shape)):
            raise PerfError(f"--shape {spec.name}: model expects {spec.dims} (without the batch dimension), got {shape}")
        return list(shape)
    if any(d < 0 for d in spec.dims):
        raise PerfError(
            f"input '{spec.name}' has variable dimensions {spec.dims}: give its shape with --shape {spec.name}:"
            + ",".join("N" if d < 0 else str(d) for d in spec.dims)
        )
    return list(spec.dims)


def _generated(spec: TensorSpec, shape: list[int], zero: bool, config: PerfConfig, rng: np.random.Generator) -> tuple[bytes, list[Any]]:
    count = math.prod(shape)
    if spec.datatype == "BYTES":
        if config.string_data is not None:
            items = [config.string_data.encode()] * count
        elif zero:
            items = [b""] * count
        else:
            alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", dtype=np.uint8)
            items = [alphabet[rng.integers(0, len(alphabet), config.string_length)].tobytes() for _ in range(count)]
        return serialize_strings(items), [item.decode() for item in items]
    dtype = numpy_dtype(spec.datatype)
    if zero:
        array = np.zeros(count, dtype=dtype)
    elif spec.datatype == "BOOL":
        array = rng.integers(0, 2, count).astype(np.bool_)
    elif spec.datatype in ("FP16", "FP32", "FP64"):
        array = rng.random(count).astype(dtype)
    elif spec.datatype == "BF16":
        array = (rng.random(count).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    else:
        array = rng.integers(0, 100, count).astype(dtype)
    return array.tobytes(), _json_values(spec.datatype, array)


def _json_values(datatype: str, array: np.ndarray) -> list[Any]:
    if datatype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32).tolist()  # type: ignore[no-any-return]
    return array.tolist()  # type: ignore[no-any-return]


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            out.extend(_flatten(item))
        return out
    return [value]


def _from_json(spec: TensorSpec, value: Any, default_shape: list[int] | None, where: str) -> tuple[list[int], bytes, list[Any]]:
    """One input of one batch-1 entry of an input-data file: (shape without batch, raw bytes, JSON values)."""
    shape = default_shape
    content = value
    if isinstance(value, dict) and "content" in value:
        content = value["content"]
        if "shape" in value:
            try:
                shape = [int(d) for d in value["shape"]]
            except (TypeError, ValueError):
                raise PerfError(f"{where}: 'shape' must be a list of whole numbers") from None
    if shape is None:
        raise PerfError(f"{where}: variable dimensions {spec.dims} need a \"shape\" field or --shape {spec.name}:...")
    count = math.prod(shape)
    if isinstance(content, dict):
        if "b64" not in content:
            raise PerfError(f"{where}: expected a list of values, {{\"b64\": ...}} or {{\"content\": ..., \"shape\": ...}}")
        try:
            raw = base64.b64decode(content["b64"], validate=True)
        except (ValueError, TypeError):
            raise PerfError(f"{where}: 'b64' is not valid base64") from None
        if spec.datatype == "BYTES":
            items = _deserialize_strings(raw, where)
            if len(items) != count:
                raise PerfError(f"{where}: {len(items)} strings for shape {shape}, expected {count}")
            return shape, raw, [item.decode("utf-8", "replace") for item in items]
        dtype = numpy_dtype(spec.datatype)
        expected = count * np.dtype(dtype).itemsize
        if len(raw) != expected:
            raise PerfError(f"{where}: {len(raw)} bytes of {spec.datatype} for shape {shape}, expected {expected}")
        return shape, raw, _json_values(spec.datatype, np.frombuffer(raw, dtype=dtype))
    values = _flatten(content)
    if len(values) != count:
        raise PerfError(f"{where}: {len(values)} values for shape {shape}, expected {count}")
    if spec.datatype == "BYTES":
        items = [v.encode() if isinstance(v, str) else json.dumps(v).encode() for v in values]
        return shape, serialize_strings(items), [item.decode() for item in items]
    try:
        if spec.datatype == "BF16":
            array = (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        else:
            array = np.asarray(values, dtype=numpy_dtype(spec.datatype))
    except (TypeError, ValueError, OverflowError):
        raise PerfError(f"{where}: values are not {spec.datatype}") from None
    return shape, array.tobytes(), _json_values(spec.datatype, array)


@dataclass(slots=True)
class _Entry:
    """One batch-1 entry: per input (shape without batch, raw, values)."""

    tensors: dict[str, tuple[list[int], bytes, list[Any]]]


def _load_json_file(path: Path, model: ModelInfo, config: PerfConfig) -> list[list[_Entry]]:
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise PerfError(f"--input-data: cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise PerfError(f"--input-data: {path} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list) or not doc["data"]:
        raise PerfError(f"--input-data: {path} must be an object with a non-empty \"data\" list")
    data = doc["data"]
    raw_streams = data if all(isinstance(item, list) for item in data) else [data]
    names = {spec.name for spec in model.inputs}
    defaults = {}
    for spec in model.inputs:
        try:
            defaults[spec.name] = _resolve_shape(spec, config)
        except PerfError:
            defaults[spec.name] = None  # type: ignore[assignment]
    streams = []
    for s, raw_stream in enumerate(raw_streams):
        if not raw_stream:
            raise PerfError(f"--input-data: {path}: stream {s} is empty")
        entries = []
        for e, item in enumerate(raw_stream):
            where = f"--input-data {path.name}: entry {e}" + (f" of stream {s}" if len(raw_streams) > 1 else "")
            if not isinstance(item, dict):
                raise PerfError(f"{where}: expected an object of input name -> data")
            unknown = sorted(set(item) - names)
            if unknown:
                raise PerfError(f"{where}: unknown input(s) {unknown}; model '{model.name}' has {sorted(names)}")
            tensors = {}
            for spec in model.inputs:
                if spec.name not in item:
                    raise PerfError(f"{where}: input '{spec.name}' is missing")
                tensors[spec.name] = _from_json(spec, item[spec.name], defaults[spec.name], f"{where}, input '{spec.name}'")
            entries.append(_Entry(tensors))
        streams.append(entries)
    return streams


def _load_directory(path: Path, model: ModelInfo, config: PerfConfig) -> list[list[_Entry]]:
    tensors = {}
    for spec in model.inputs:
        file = path / spec.name
        try:
            raw = file.read_bytes()
        except OSError as exc:
            raise PerfError(f"--input-data: cannot read {file}: {exc.strerror}") from None
        shape = _resolve_shape(spec, config)
        where = f"--input-data {file}"
        if spec.datatype == "BYTES":
            lines = raw.decode("utf-8", "replace").splitlines()
            count = math.prod(shape)
            if len(lines) < count:
                raise PerfError(f"{where}: {len(lines)} lines, expected {count} strings for shape {shape}")
            items = [line.encode() for line in lines[:count]]
            tensors[spec.name] = (shape, serialize_strings(items), [item.decode() for item in items])
        else:
            tensors[spec.name] = _from_json(spec, {"b64": base64.b64encode(raw).decode()}, shape, where)
    return [[_Entry(tensors)]]


def _batched(model: ModelInfo, entries: list[_Entry], batch: int) -> list[Sample]:
    """Requests built from `batch` consecutive entries each, one request per entry position (round-robin)."""
    samples = []
    for first in range(len(entries)):
        picked = [entries[(first + j) % len(entries)] for j in range(batch)]
        sample = []
        for spec in model.inputs:
            shapes = [entry.tensors[spec.name][0] for entry in picked]
            if any(shape != shapes[0] for shape in shapes):
                raise PerfError(f"input data: batching {batch} entries of input '{spec.name}' with different shapes {shapes}")
            raw = b"".join(entry.tensors[spec.name][1] for entry in picked)
            values = [v for entry in picked for v in entry.tensors[spec.name][2]]
            sample.append(TensorData(spec.name, spec.datatype, _batch_shape(model, shapes[0], batch), raw, values))
        samples.append(sample)
    return samples


def build_inputs(model: ModelInfo, config: PerfConfig) -> InputSet:
    """Resolve shapes, generate or load data, and batch it: raises `PerfError` with the input's name on any
    mismatch with the model."""
    if model.max_batch_size == 0 and config.batch_size > 1:
        raise PerfError(f"-b {config.batch_size}: model '{model.name}' does not support batching (max_batch_size 0)")
    if model.max_batch_size > 0 and config.batch_size > model.max_batch_size:
        raise PerfError(f"-b {config.batch_size}: exceeds max_batch_size {model.max_batch_size} of model '{model.name}'")
    unknown = sorted(set(config.shapes) - {spec.name for spec in model.inputs})
    if unknown:
        raise PerfError(f"--shape: unknown input(s) {unknown}; model '{model.name}' has {[s.name for s in model.inputs]}")
    kinds = config.input_data
    if any(kind in ("random", "zero") for kind in kinds):
        if len(kinds) > 1:
            raise PerfError("--input-data: random/zero cannot be combined with files")
        zero = kinds[0] == "zero"
        rng = np.random.default_rng(config.seed)
        sample = []
        for spec in model.inputs:
            shape = _resolve_shape(spec, config)
            raw, values = _generated(spec, [config.batch_size, *shape] if model.max_batch_size > 0 else shape, zero, config, rng)
            sample.append(TensorData(spec.name, spec.datatype, _batch_shape(model, shape, config.batch_size), raw, values))
        return InputSet([[sample]], from_user_data=False)
    streams: list[list[_Entry]] = []
    for kind in kinds:
        path = Path(kind)
        if path.is_dir():
            streams += _load_directory(path, model, config)
        elif path.exists():
            streams += _load_json_file(path, model, config)
        else:
            raise PerfError(f"--input-data: expected random, zero, a JSON file or a directory; '{kind}' does not exist")
    if not model.sequence and len(streams) > 1:
        streams = [[entry for stream in streams for entry in stream]]
    return InputSet([_batched(model, stream, config.batch_size) for stream in streams], from_user_data=True)
