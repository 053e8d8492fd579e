"""Implicit state (`sequence_batching.state`): the initial value of each state input, the input tensors
of a sequence's current state, and taking the new state out of a response. It holds no sequence itself;
the sequence batcher keeps one state per batch slot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nereid.config.model_config import ModelConfig, mc
from nereid.core.dtypes import config_to_triton, deserialize_bytes, numpy_dtype
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor

__all__ = ["ImplicitState", "State", "INITIAL_STATE_FOLDER"]

# Where `initial_state { data_file: ... }` files live, inside the model's folder (as in Triton).
INITIAL_STATE_FOLDER = "initial_state"

# input_name -> the array fed as that state input (batch dimension included when the model batches).
State = dict[str, np.ndarray]


@dataclass(slots=True, frozen=True)
class _Spec:
    input_name: str
    output_name: str
    datatype: str
    initial: np.ndarray


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _zeros(datatype: str, shape: list[int]) -> np.ndarray:
    if datatype == "BYTES":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=numpy_dtype(datatype))


def _initial(config: ModelConfig, state: object, model_path: Path | None) -> np.ndarray:
    """The first input state of a sequence: `initial_state` when given, zeros otherwise (variable
    dimensions become 1, as Triton sizes them)."""
    name = state.input_name  # type: ignore[attr-defined]
    datatype = config_to_triton(mc.DataType.Name(state.data_type))  # type: ignore[attr-defined]
    lead = [1] if config.max_batch_size > 0 else []
    dims = list(state.dims)  # type: ignore[attr-defined]
    initial_states = list(state.initial_state)  # type: ignore[attr-defined]
    if not initial_states:
        return _frozen(_zeros(datatype, lead + [1 if d == -1 else d for d in dims]))
    if len(initial_states) > 1:
        raise NereidError.invalid(
            f"initial_state field for state input '{name}' must contain exactly one or zero element. Found "
            f"'{len(initial_states)}' elements."
        )
    initial = initial_states[0]
    if initial.data_type != state.data_type:  # type: ignore[attr-defined]
        raise NereidError.invalid(
            f"The data type used for 'initial_state' field of state '{name}' does not match the state data type."
        )
    if not initial.name:
        raise NereidError.invalid(f"Field 'name' must be set when using initial_state for state input '{name}'.")
    initial_dims = list(initial.dims)
    if len(initial_dims) != len(dims):
        raise NereidError.invalid(
            f"Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input "
            f"'{name}'. {len(initial_dims)} != {len(dims)}"
        )
    for given, declared in zip(initial_dims, dims, strict=True):
        if given == -1:
            raise NereidError.invalid(
                f"'initial_state' field for state input name '{name}' contains variable dimensions."
            )
        if declared != -1 and given != declared:
            raise NereidError.invalid(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim description. {given} != {declared}"
            )
    shape = lead + initial_dims
    which = initial.WhichOneof("state_data")
    if which == "zero_data":
        return _frozen(_zeros(datatype, shape))
    if which != "data_file":
        raise NereidError.invalid(f"initial_state setting expects state'{name}' to have state_data set")
    path = (model_path or Path(".")) / INITIAL_STATE_FOLDER / initial.data_file
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise NereidError.invalid(
            f"failed to read initial_state data file '{path}' for state input '{name}': {exc}"
        ) from None
    count = int(np.prod(shape))
    if datatype == "BYTES":
        try:
            array = deserialize_bytes(raw)
        except ValueError as exc:
            raise NereidError.invalid(
                f"initial_state data file '{initial.data_file}' for state input '{name}': {exc}"
            ) from None
        if array.size < count:
            raise NereidError.invalid(
                f"initial_state setting expects {count} strings, but the data provided from {initial.data_file} only "
                f"has {array.size}."
            )
        return _frozen(array[:count].reshape(shape))
    dtype = numpy_dtype(datatype)
    needed = count * dtype.itemsize
    if len(raw) < needed:
        raise NereidError.invalid(
            f"initial_state setting expects {needed} bytes, but the data provided from {initial.data_file} only has "
            f"{len(raw)} bytes."
        )
    return _frozen(np.frombuffer(raw[:needed], dtype=dtype).reshape(shape).copy())


class ImplicitState:
    """The `state` entries of one model. Falsy when the model has none."""

    def __init__(self, config: ModelConfig, model_path: Path | None) -> None:
        specs: list[_Spec] = []
        seen_inputs: set[str] = set()
        seen_outputs: set[str] = set()
        for state in config.sequence_batching.state:
            if not state.input_name or not state.output_name:
                raise NereidError.invalid(
                    f"model '{config.name}': every sequence_batching state must name its input_name and output_name"
                )
            if state.input_name in seen_inputs or state.output_name in seen_outputs:
                raise NereidError.invalid(
                    f"model '{config.name}': sequence_batching state '{state.input_name}' / '{state.output_name}' "
                    "is declared more than once"
                )
            if state.data_type == mc.TYPE_INVALID:
                raise NereidError.invalid(
                    f"model '{config.name}': sequence_batching state '{state.input_name}' must specify 'data_type'"
                )
            seen_inputs.add(state.input_name)
            seen_outputs.add(state.output_name)
            datatype = config_to_triton(mc.DataType.Name(state.data_type))
            specs.append(_Spec(state.input_name, state.output_name, datatype, _initial(config, state, model_path)))
        self._specs = specs
        self.input_names = frozenset(s.input_name for s in specs)
        self.output_names = frozenset(s.output_name for s in specs)
        self._declared_outputs = frozenset(o.name for o in config.output)

    def __bool__(self) -> bool:
        return bool(self._specs)

    def initial(self) -> State:
        return {s.input_name: s.initial for s in self._specs}

    def tensors(self, state: State) -> list[InputTensor]:
        tensors: list[InputTensor] = []
        for spec in self._specs:
            array = state.get(spec.input_name, spec.initial)
            tensors.append(InputTensor(spec.input_name, spec.datatype, array.shape, array))
        return tensors

    def dummy(self, state: State) -> list[InputTensor]:
        """State inputs for a filler slot: zeros shaped like `state`, so no sequence's state is touched."""
        tensors: list[InputTensor] = []
        for spec in self._specs:
            shape = state.get(spec.input_name, spec.initial).shape
            tensors.append(InputTensor(spec.input_name, spec.datatype, shape, _zeros(spec.datatype, list(shape))))
        return tensors

    def shapes(self, state: State) -> tuple[tuple[str, tuple[int, ...]], ...]:
        return tuple((s.input_name, state.get(s.input_name, s.initial).shape) for s in self._specs)

    def take(self, request: InferenceRequest, response: InferenceResponse) -> State | None:
        """The new state carried by `response` (None when it carries none), removing from the response the
        state outputs the client did not ask for."""
        if not response.outputs:
            return None
        new: State = {}
        kept = []
        wanted = None if request.outputs is None else {o.name for o in request.outputs}
        by_output = {s.output_name: s for s in self._specs}
        for output in response.outputs:
            spec = by_output.get(output.name)
            if spec is None:
                kept.append(output)
                continue
            data = output.data
            new[spec.input_name] = _frozen(np.array(data, copy=True)) if data.flags.writeable else data
            if output.name in self._declared_outputs and (wanted is None or output.name in wanted):
                kept.append(output)
        if len(kept) != len(response.outputs):
            response.outputs = kept
        return new or None
