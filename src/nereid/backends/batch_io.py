"""Triton's ragged batching for backends that run a batch as one tensor per input: ragged inputs flattened and
concatenated, `batch_input` tensors computed from the formed batch, `batch_output` tensors scattered back by
each request's source-input shape. Backends build a `BatchIO` only when the config asks for one of these, so
models without them pay nothing; this module never decides what shares a batch (the schedulers do)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nereid.config.model_config import ModelConfig, mc
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InferenceResponse, OutputTensor

__all__ = ["BatchIO", "batch_input_array"]

_DTYPES = {mc.TYPE_INT32: np.dtype(np.int32), mc.TYPE_FP32: np.dtype(np.float32)}
_Kind = mc.BatchInput.Kind


def _element_counts(shapes: Sequence[tuple[int, ...]]) -> np.ndarray:
    return np.array([int(np.prod(shape, dtype=np.int64)) for shape in shapes], dtype=np.int64)


def batch_input_array(kind: int, dtype: np.dtype, shapes: Sequence[tuple[int, ...]]) -> np.ndarray:
    """The tensor Triton builds for one batch input, from the source input's full shape in each request of
    the batch (batch dimension first), in batch order."""
    if kind == _Kind.BATCH_ELEMENT_COUNT:
        return _element_counts(shapes).astype(dtype)
    if kind == _Kind.BATCH_ACCUMULATED_ELEMENT_COUNT:
        return np.cumsum(_element_counts(shapes)).astype(dtype)
    if kind == _Kind.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        counts = np.empty(len(shapes) + 1, dtype=np.int64)
        counts[0] = 0
        np.cumsum(_element_counts(shapes), out=counts[1:])
        return counts.astype(dtype)
    if kind == _Kind.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE:
        # Only the shape carries information; Triton leaves the data uninitialised, Nereid gives zeros.
        largest = int(_element_counts(shapes).max()) if shapes else 0
        return np.zeros(largest, dtype=dtype)
    if kind in (_Kind.BATCH_ITEM_SHAPE, _Kind.BATCH_ITEM_SHAPE_FLATTEN):
        # One row per batch item: the item's shape without the batch dimension.
        rank = len(shapes[0]) - 1 if shapes else 0
        rows = [np.tile(np.array(shape[1:], dtype=np.int64), (shape[0], 1)) for shape in shapes]
        items = np.concatenate(rows, axis=0) if rows else np.zeros((0, rank), dtype=np.int64)
        items = items.reshape(-1, rank).astype(dtype)
        return items.reshape(-1) if kind == _Kind.BATCH_ITEM_SHAPE_FLATTEN else items
    raise NereidError.internal(f"unsupported batch input kind {kind}")


@dataclass(slots=True, frozen=True)
class _BatchInput:
    kind: int
    targets: tuple[str, ...]
    dtype: np.dtype
    source: str


@dataclass(slots=True, frozen=True)
class _BatchOutput:
    targets: frozenset[str]
    source: str
    shape: tuple[int, ...]  # batch dimension (-1) first when the model batches; -1 dims come from the source


class BatchIO:
    """What one model's config asks a concatenating backend to add to each batch and to do with its outputs."""

    __slots__ = ("model", "ragged", "_inputs", "_outputs", "_output_of")

    def __init__(self, config: ModelConfig) -> None:
        self.model = config.name
        self.ragged = frozenset(t.name for t in config.input if t.allow_ragged_batch)
        self._inputs = [
            _BatchInput(b.kind, tuple(b.target_name), _DTYPES[b.data_type], b.source_input[0]) for b in config.batch_input
        ]
        outputs = {o.name: o for o in config.output}
        self._outputs: list[_BatchOutput] = []
        self._output_of: dict[str, _BatchOutput] = {}
        for b in config.batch_output:
            first = outputs[b.target_name[0]]
            dims = list(first.reshape.shape) if first.HasField("reshape") else list(first.dims)
            entry = _BatchOutput(
                frozenset(b.target_name), b.source_input[0], tuple(([-1] if config.max_batch_size > 0 else []) + dims)
            )
            self._outputs.append(entry)
            self._output_of.update(dict.fromkeys(b.target_name, entry))

    @classmethod
    def from_config(cls, config: ModelConfig) -> BatchIO | None:
        """None when the config has no ragged input, batch input or batch output (the common case)."""
        if not config.batch_input and not config.batch_output and not any(t.allow_ragged_batch for t in config.input):
            return None
        return cls(config)

    @property
    def batch_input_names(self) -> list[str]:
        return [name for entry in self._inputs for name in entry.targets]

    def is_batch_output(self, name: str) -> bool:
        return name in self._output_of

    def complete_feed(self, feed: dict[str, np.ndarray], requests: list[InferenceRequest]) -> None:
        """Put each ragged input in `feed` as one flat tensor of every request's elements, in batch order, and
        add the batch inputs."""
        for name in self.ragged:
            parts = [r.input(name).data.reshape(-1) for r in requests]  # type: ignore[union-attr]
            feed[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
        for entry in self._inputs:
            shapes = [tuple(r.input(entry.source).shape) for r in requests]  # type: ignore[union-attr]
            array = batch_input_array(entry.kind, entry.dtype, shapes)
            for target in entry.targets:
                feed[target] = array

    def scatter(self, requests: list[InferenceRequest], responses: list[InferenceResponse], names: list[str],
                arrays: list[np.ndarray]) -> None:
        """Replace each response's part of a batch output by its slice of the flat output, shaped as the
        output's dims with every variable dimension taken from the request's source input."""
        for name, array in zip(names, arrays, strict=False):
            entry = self._output_of.get(name)
            if entry is None:
                continue
            flat = array.reshape(-1)
            offset = 0
            for request, response in zip(requests, responses, strict=True):
                source = request.input(entry.source).shape  # type: ignore[union-attr]
                try:
                    shape = tuple(source[i] if d == -1 else d for i, d in enumerate(entry.shape))
                except IndexError:
                    raise NereidError.internal(
                        f"[model '{self.model}'] batch output '{name}': shape {list(entry.shape)} has more dimensions "
                        f"than source input '{entry.source}' {list(source)}"
                    ) from None
                count = int(np.prod(shape, dtype=np.int64))
                if offset + count > flat.size:
                    raise NereidError.internal(
                        f"[model '{self.model}'] batch output '{name}': the model produced {flat.size} elements, fewer "
                        f"than the batch's requests need when scattered by input '{entry.source}'"
                    )
                part = flat[offset : offset + count].reshape(shape)
                offset += count
                outputs = response.outputs
                for index, tensor in enumerate(outputs):
                    if tensor.name == name:
                        outputs[index] = OutputTensor(name, tensor.datatype, shape, part, tensor.parameters)
