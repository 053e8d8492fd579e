"""Check a request against its model's config before it is queued, with Triton's error messages.

It lives beside the model version that owns one per config; it reads the config and never touches the wire."""

from __future__ import annotations

from dataclasses import dataclass

from nereid.config.model_config import ModelConfig, mc
from nereid.core.dtypes import config_to_triton
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest

__all__ = ["RequestValidator"]

_SHAPE_NOTE = (
    " NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended "
    "to each input shape. If you want to specify the full shape including the batch dim in your input dims "
    "config, try setting max_batch_size to zero. See the model configuration docs for more info on "
    "max_batch_size."
)


@dataclass(slots=True, frozen=True)
class _InputSpec:
    datatype: str
    dims: tuple[int, ...]  # the full expected shape, batch dim (-1) included when batching
    optional: bool
    ragged: bool
    bit: int  # this input's bit in the mask of the inputs a request gave
    # The dims after the batch dim when none of them is variable (-1): then a shape is checked by one comparison.
    fixed_tail: tuple[int, ...] | None

    def shape_matches(self, shape: tuple[int, ...]) -> bool:
        expected = self.dims
        if len(shape) != len(expected):
            return False
        tail = self.fixed_tail
        if tail is not None:
            return tuple(shape[len(expected) - len(tail) :]) == tail
        return all(e == -1 or e == s for e, s in zip(expected, shape, strict=False))


def _fmt(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _prefix(request: InferenceRequest) -> str:
    return f"[request id: {request.id or '<id_unknown>'}] "


class RequestValidator:
    """Built once per model version; `validate` runs on every request and sets its batch size."""

    def __init__(self, config: ModelConfig) -> None:
        self.model = config.name
        self.max_batch_size = config.max_batch_size
        batching = config.max_batch_size > 0
        self._inputs: dict[str, _InputSpec] = {}
        for index, tensor in enumerate(config.input):
            dims = tuple(tensor.dims)
            if tensor.HasField("reshape") and not dims:
                dims = ()
            self._inputs[tensor.name] = _InputSpec(
                config_to_triton(mc.DataType.Name(tensor.data_type)),
                ((-1,) if batching else ()) + dims,
                tensor.optional,
                tensor.allow_ragged_batch,
                1 << index,
                None if -1 in dims else dims,
            )
        self._required = [name for name, spec in self._inputs.items() if not spec.optional]
        self._required_mask = sum(spec.bit for spec in self._inputs.values() if not spec.optional)
        self._outputs = {o.name for o in config.output}

    def validate(self, request: InferenceRequest) -> None:
        specs = self._inputs
        batch_size = -1
        given = 0  # the mask of the inputs seen so far
        repeated = False
        for tensor in request.inputs:
            spec = specs.get(tensor.name)
            if spec is None:
                raise NereidError.invalid(f"unexpected inference input '{tensor.name}' for model '{self.model}'")
            repeated = repeated or bool(given & spec.bit)
            given |= spec.bit
            if tensor.datatype != spec.datatype:
                raise NereidError.invalid(
                    f"{_prefix(request)}inference input '{tensor.name}' data-type is '{tensor.datatype}', but "
                    f"model '{self.model}' expects '{spec.datatype}'"
                )
            shape = tensor.shape
            if not spec.shape_matches(shape) and not spec.ragged:
                note = _SHAPE_NOTE if self.max_batch_size > 0 else " "  # Triton ends the sentence with a space
                raise NereidError.invalid(
                    f"{_prefix(request)}unexpected shape for input '{tensor.name}' for model '{self.model}'. "
                    f"Expected {_fmt(spec.dims)}, got {_fmt(shape)}.{note}"
                )
            if self.max_batch_size > 0 and shape:
                if batch_size == -1:
                    batch_size = shape[0]
                elif shape[0] != batch_size:
                    raise NereidError.invalid(
                        f"{_prefix(request)}input '{tensor.name}' batch size does not match other inputs for "
                        f"'{self.model}'"
                    )
        if repeated or given & self._required_mask != self._required_mask:
            self._check_missing(request)
        if self.max_batch_size > 0:
            if batch_size > self.max_batch_size:
                raise NereidError.invalid(
                    f"{_prefix(request)}inference request batch-size must be <= {self.max_batch_size} for "
                    f"'{self.model}'"
                )
            request.batch_size = max(batch_size, 0)
        else:
            request.batch_size = 1
        if request.outputs is not None:
            for output in request.outputs:
                if output.name not in self._outputs:
                    raise NereidError.invalid(
                        f"unexpected inference output '{output.name}' for model '{self.model}'"
                    )
            if len(request.outputs) > 1:
                names = [output.name for output in request.outputs]
                if len(set(names)) != len(names):
                    duplicate = next(n for n in names if names.count(n) > 1)
                    raise NereidError.invalid(f"{_prefix(request)}output '{duplicate}' already exists in request")

    def _check_missing(self, request: InferenceRequest) -> None:
        names = [t.name for t in request.inputs]
        if len(set(names)) != len(names):
            duplicate = next(n for n in names if names.count(n) > 1)
            raise NereidError.invalid(
                f"{_prefix(request)}input '{duplicate}' was given more than once for model '{self.model}'"
            )
        missing = [n for n in self._required if n not in names]
        if missing:
            expected = len(self._required)
            count = f"{expected} inputs" if expected == len(self._inputs) else f"number of inputs between {expected} and {len(self._inputs)}"
            raise NereidError.invalid(
                f"{_prefix(request)}expected {count} but got {len(names)} inputs for model "
                f"'{self.model}'. Got input(s) {_quoted(names)}, but missing required input(s) {_quoted(missing)}. Please provide "
                f"all required input(s)."
            )


def _quoted(names: list[str]) -> str:
    """A list of names as Triton writes it: ['A','B'] (no space after the commas)."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]"
