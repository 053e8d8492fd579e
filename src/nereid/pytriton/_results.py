"""What an inference callable must return, checked as PyTriton checks it (with its messages), and the cast of each
output to the model's type. Shared by the in-process instances and the worker-process model; no server code here."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from nereid.core.dtypes import config_to_triton, numpy_dtype

__all__ = ["ResultRules", "cast_output", "check_results"]

_ALLOWED_KINDS = "biufOSU"


@dataclasses.dataclass(frozen=True)
class ResultRules:
    model_name: str
    strict: bool
    batching: bool
    output_types: dict[str, str]  # output name -> Triton type ('FP32', 'BYTES')
    output_dims: dict[str, tuple[int, ...]]

    @classmethod
    def of(cls, config: Any, strict: bool) -> ResultRules:
        """From a ModelConfig protobuf."""
        from nereid.config.model_config import mc

        return cls(
            config.name,
            strict,
            config.max_batch_size > 0,
            {t.name: config_to_triton(mc.DataType.Name(t.data_type)) for t in config.output},
            {t.name: tuple(t.dims) for t in config.output},
        )


def check_results(rules: ResultRules, outputs: Any, requests: int) -> None:
    name = rules.model_name
    if not isinstance(outputs, list):
        raise ValueError(
            f"Outputs returned by `{name}` model callable must be list of response dicts with numpy arrays. "
            f"Got outputs={outputs} instead."
        )
    if len(outputs) != requests:
        raise ValueError(
            f"Number of outputs returned by `{name}` inference callable ({len(outputs)}) does not match number of "
            f"requests ({requests}) received from Triton."
        )
    for result in outputs:
        if not isinstance(result, dict):
            raise ValueError(
                f"Outputs returned by `{name}` model callable must be list of response dicts with numpy arrays. "
                f"Got response={result} instead."
            )
        for key, value in result.items():
            _check(rules, key, value)


def _check(rules: ResultRules, key: Any, value: Any) -> None:
    name = rules.model_name
    if not isinstance(key, str):
        raise ValueError(f"Not all keys returned by `{name}` model callable are string")
    if not isinstance(value, np.ndarray):
        raise ValueError(f"Not all values returned by `{name}` model callable are numpy arrays")
    kind = value.dtype.kind
    if kind not in _ALLOWED_KINDS:
        raise ValueError(
            f"Only bool, numeric, string, unicode and object arrays are supported by Triton "
            f"(dtype.kind: {_ALLOWED_KINDS}). Returned `{key}` for model `{name}` has `{kind}` dtype.kind."
        )
    if kind == "O" and value.size:
        first = value.item(0)
        if isinstance(first, str):
            raise ValueError(f"Use string/byte-string instead of object for passing string in NumPy array from model `{name}`.")
        if not isinstance(first, bytes):
            raise ValueError(
                f"Only bytes as objects dtype are supported by PyTriton. Returned `{key}` from `{name}` has "
                f"`{type(first)}` type."
            )
    if rules.strict:
        _check_strict(rules, key, value)


def _check_strict(rules: ResultRules, key: str, value: np.ndarray) -> None:
    name = rules.model_name
    datatype = rules.output_types.get(key)
    if datatype is None:
        raise ValueError(f"Returned output `{key}` is not defined in model config for model `{name}`.")
    expected = np.object_ if datatype == "BYTES" else numpy_dtype(datatype).type
    textual = value.dtype.kind in "OSU"
    if (not textual and not np.issubdtype(value.dtype, expected)) or (textual and datatype != "BYTES"):
        raise ValueError(
            f"Returned output `{key}` for model `{name}` has invalid type. Returned: {value.dtype} "
            f"({value.dtype.kind}). Expected: {np.dtype(expected)}."
        )
    dims = rules.output_dims[key]
    shape = value.shape[1:] if rules.batching else value.shape
    if len(shape) != len(dims):
        raise ValueError(f"Returned output `{key}` for model `{name}` has invalid shapes. Returned: {shape}. Expected: {dims}.")
    if any(x != y != -1 for x, y in zip(shape, dims, strict=True)):
        raise ValueError(
            f"Returned output `{key}` for model `{name}` has invalid shapes at one or more positions. "
            f"Returned: {shape}. Expected: {dims}."
        )


def cast_output(value: np.ndarray, datatype: str) -> np.ndarray:
    """The output as the model's type says (PyTriton casts too); arrays already right pass through uncopied."""
    if datatype == "BYTES":
        kind = value.dtype.kind
        if kind == "U":
            value = np.char.encode(value, "utf-8")
        if kind != "O":
            value = value.astype(np.object_)
        return value
    target = numpy_dtype(datatype)
    if value.dtype != target:
        value = value.astype(target)
    if not value.flags.c_contiguous:
        value = np.ascontiguousarray(value)
    return value
