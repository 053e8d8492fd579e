"""Cache keys and the byte form of cached outputs (shared by the local and the Redis cache)."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np
import orjson

from nereid.core.dtypes import numpy_dtype, serialize_bytes
from nereid.core.tensor_codec import array_from_buffer
from nereid.core.types import InferenceRequest, OutputTensor

__all__ = ["cache_key", "encode_outputs", "decode_outputs"]

# Parameters that describe transport or identity, not the computation.
_IGNORED_PARAMETERS = {"binary_data_output", "timeout", "priority", "triton_enable_empty_final_response"}


def cache_key(request: InferenceRequest) -> bytes:
    digest = hashlib.blake2b(digest_size=20)
    digest.update(f"{request.model_name}\0{request.model_version}\0".encode())
    for tensor in sorted(request.inputs, key=lambda t: t.name):
        digest.update(f"{tensor.name}\0{tensor.datatype}\0{tensor.shape}\0".encode())
        data = tensor.data
        if tensor.datatype == "BYTES":
            digest.update(serialize_bytes(data))
        else:
            digest.update(np.ascontiguousarray(data).data)
    parameters = {k: v for k, v in request.parameters.items() if k not in _IGNORED_PARAMETERS}
    if parameters:
        digest.update(orjson.dumps(parameters, option=orjson.OPT_SORT_KEYS))
    if request.outputs is not None:
        digest.update(",".join(sorted(o.name for o in request.outputs)).encode())
    return digest.digest()


def encode_outputs(outputs: list[OutputTensor]) -> bytes:
    """A JSON header (names, datatypes, shapes, sizes) followed by each output's raw bytes."""
    chunks: list[bytes] = []
    meta: list[dict[str, Any]] = []
    for output in outputs:
        raw = serialize_bytes(output.data) if output.datatype == "BYTES" else np.ascontiguousarray(output.data).tobytes()
        meta.append({"n": output.name, "t": output.datatype, "s": list(output.shape), "b": len(raw)})
        chunks.append(raw)
    header = orjson.dumps(meta)
    return struct.pack("<I", len(header)) + header + b"".join(chunks)


def decode_outputs(blob: bytes) -> list[OutputTensor]:
    (header_length,) = struct.unpack_from("<I", blob, 0)
    meta = orjson.loads(blob[4 : 4 + header_length])
    offset = 4 + header_length
    outputs: list[OutputTensor] = []
    for entry in meta:
        raw = memoryview(blob)[offset : offset + entry["b"]]
        offset += entry["b"]
        shape = tuple(entry["s"])
        if entry["t"] == "BYTES":
            array = array_from_buffer(raw, "BYTES", shape, entry["n"], "cache")
        else:
            array = np.frombuffer(raw, dtype=numpy_dtype(entry["t"])).reshape(shape)
        outputs.append(OutputTensor(entry["n"], entry["t"], shape, array))
    return outputs
