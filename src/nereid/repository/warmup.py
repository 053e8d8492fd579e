"""`model_warmup` in config.pbtxt: sample requests run on every instance before the model turns READY.

As in Triton, each sample becomes `batch_size` requests of one item each, executed together `count` times
(at least once) on each instance directly, so the first real request does not pay for lazy initialisation.
They bypass the scheduler and the statistics. Data is zeros, random values, or a raw file from the
model's `warmup/` folder. A failing sample fails the load, naming the sample.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from nereid.backends.base import BackendInstance
from nereid.core.dtypes import config_to_triton, deserialize_bytes, numpy_dtype
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor

__all__ = ["warm_up"]

log = logging.getLogger("nereid.repository")

WARMUP_FOLDER = "warmup"


def _sample_data(model: str, sample: str, name: str, spec: Any, model_path: Path) -> tuple[str, tuple[int, ...], np.ndarray]:
    datatype = config_to_triton(mc.DataType.Name(spec.data_type))
    shape = tuple(int(d) for d in spec.dims)
    if any(d < 0 for d in shape):
        raise NereidError.invalid(f"model '{model}' warmup '{sample}': input '{name}' needs fixed dims, got {list(shape)}")
    count = int(np.prod(shape, dtype=np.int64))
    source = spec.WhichOneof("input_data_type")
    if datatype == "BYTES":
        if source == "input_data_file":
            return datatype, shape, deserialize_bytes(_read(model, sample, model_path, spec.input_data_file), count).reshape(shape)
        # Triton sends empty strings for BYTES zero and random data alike.
        return datatype, shape, np.array([b""] * count, dtype=object).reshape(shape)
    dtype = numpy_dtype(datatype)
    if source == "input_data_file":
        raw = _read(model, sample, model_path, spec.input_data_file)
        expected = count * dtype.itemsize
        if len(raw) < expected:
            raise NereidError.invalid(
                f"model '{model}' warmup '{sample}': file '{spec.input_data_file}' for input '{name}' has {len(raw)} bytes, "
                f"expected {expected}"
            )
        return datatype, shape, np.frombuffer(raw[:expected], dtype=dtype).reshape(shape)
    if source == "random_data":
        rng = np.random.default_rng()
        if dtype.kind == "f":
            return datatype, shape, rng.random(shape).astype(dtype)
        if dtype.kind == "b":
            return datatype, shape, rng.integers(0, 2, shape).astype(dtype)
        return datatype, shape, rng.integers(0, 100, shape).astype(dtype)
    return datatype, shape, np.zeros(shape, dtype=dtype)


def _read(model: str, sample: str, model_path: Path, file_name: str) -> bytes:
    path = model_path / WARMUP_FOLDER / file_name
    try:
        return path.read_bytes()
    except OSError as exc:
        raise NereidError.invalid(f"model '{model}' warmup '{sample}': cannot read '{path}': {exc.strerror}") from None


def _sample_inputs(model: str, sample: Any, batching: bool, model_path: Path) -> list[InputTensor]:
    """The sample's inputs, read or generated once (a batching model gets the batch dimension of 1)."""
    inputs = []
    for name, spec in sample.inputs.items():
        datatype, shape, data = _sample_data(model, sample.name, name, spec, model_path)
        if batching:
            shape, data = (1, *shape), data.reshape((1, *shape))
        inputs.append(InputTensor(name, datatype, shape, data))
    return inputs


async def warm_up(model: str, version: str, config: Any, model_path: Path, instances: list[BackendInstance]) -> None:
    batching = config.max_batch_size > 0
    for sample in config.model_warmup:
        if not batching and sample.batch_size > 1:
            raise NereidError.invalid(
                f"model '{model}' warmup '{sample.name}': batch_size {sample.batch_size} needs a model that batches"
            )
        inputs = _sample_inputs(model, sample, batching, model_path)
        for instance in instances:
            for _ in range(max(sample.count, 1)):
                streamed: list[InferenceResponse] = []
                # Fresh requests each time (a backend may keep state on them); the tensors are shared, read-only.
                requests = [
                    InferenceRequest(model, version, list(inputs), id=f"warmup:{sample.name}", respond=streamed.append)
                    for _ in range(max(sample.batch_size, 1))
                ]
                responses, _ = await instance.execute(requests)  # decoupled models answer through respond
                for response in [*responses, *streamed]:
                    if response.error is not None:
                        raise NereidError.invalid(f"model '{model}' warmup '{sample.name}' failed: {response.error.message}")
        log.info("'%s' version %s: warmup '%s' ran on %d instance(s)", model, version, sample.name, len(instances))
