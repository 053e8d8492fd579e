"""The control tensors the sequence batcher adds to every request it schedules (Triton's
CONTROL_SEQUENCE_START, END, READY and CORRID), built once from `sequence_batching.control_input`.
It only builds tensors; it never decides what runs when."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from nereid.config.model_config import ModelConfig, mc
from nereid.core.dtypes import config_to_triton, numpy_dtype
from nereid.core.errors import NereidError
from nereid.core.sequence_flags import SEQUENCE_END, SEQUENCE_START  # re-exported for the sequence batcher
from nereid.core.types import InputTensor

__all__ = ["SequenceControls", "SEQUENCE_START", "SEQUENCE_END"]


_Control = mc.ModelSequenceBatching.Control
_BOOLEAN_KINDS = (_Control.CONTROL_SEQUENCE_START, _Control.CONTROL_SEQUENCE_END, _Control.CONTROL_SEQUENCE_READY)
_CORRID_TYPES = (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING)


@dataclass(slots=True, frozen=True)
class _Boolean:
    name: str
    kind: int
    datatype: str
    false: InputTensor
    true: InputTensor


def _kind_name(kind: int) -> str:
    return str(_Control.Kind.Name(kind))


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _find(config: ModelConfig, kind: int) -> tuple[str, object] | None:
    """The (tensor name, control) mapped to `kind`, with Triton's checks on the control_input list."""
    model = config.name
    seen_tensors: set[str] = set()
    found: tuple[str, object] | None = None
    for control_input in config.sequence_batching.control_input:
        if not control_input.name:
            raise NereidError.invalid(f"sequence batching control tensor must have a name for {model}")
        if control_input.name in seen_tensors:
            raise NereidError.invalid(
                f"sequence batching control tensor '{control_input.name}' is specified for multiple control kinds "
                f"for {model}"
            )
        seen_tensors.add(control_input.name)
        for control in control_input.control:
            if control.kind != kind:
                continue
            if found is not None:
                raise NereidError.invalid(
                    f"sequence batching specifies multiple {_kind_name(kind)} tensors for {model}"
                )
            found = (control_input.name, control)
    return found


def _boolean(config: ModelConfig, kind: int, shape: tuple[int, ...]) -> _Boolean | None:
    found = _find(config, kind)
    if found is None:
        return None
    name, control = found
    where = f"{_kind_name(kind)} for {config.name}"
    lists = {
        "int32_false_true": (list(control.int32_false_true), "INT32"),  # type: ignore[attr-defined]
        "fp32_false_true": (list(control.fp32_false_true), "FP32"),  # type: ignore[attr-defined]
        "bool_false_true": (list(control.bool_false_true), "BOOL"),  # type: ignore[attr-defined]
    }
    given = [(field, values, datatype) for field, (values, datatype) in lists.items() if values]
    if not given:
        raise NereidError.invalid(
            f"sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for {where}"
        )
    if len(given) > 1:
        raise NereidError.invalid(
            "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
            f"'bool_false_true' for {where}"
        )
    field, values, datatype = given[0]
    if len(values) != 2:
        raise NereidError.invalid(f"sequence batching control '{field}' must have exactly 2 entries for {where}")
    dtype = numpy_dtype(datatype)
    false = InputTensor(name, datatype, shape, _frozen(np.full(shape, values[0], dtype=dtype)))
    true = InputTensor(name, datatype, shape, _frozen(np.full(shape, values[1], dtype=dtype)))
    return _Boolean(name, kind, datatype, false, true)


def _string_as_number(value: str) -> int:
    """What Triton writes into a numeric CORRID tensor for a string ID: the 4-byte length, then the
    string's first bytes, read as a little-endian 64-bit word."""
    raw = value.encode("utf-8")
    word = (struct.pack("<I", len(raw)) + raw[:4]).ljust(8, b"\0")
    return int.from_bytes(word, "little")


class SequenceControls:
    """The control tensors of one model; `for_request` and `not_ready` return ready-made InputTensors."""

    def __init__(self, config: ModelConfig) -> None:
        self._shape: tuple[int, ...] = (1, 1) if config.max_batch_size > 0 else (1,)
        booleans = [_boolean(config, kind, self._shape) for kind in _BOOLEAN_KINDS]
        self._booleans = [b for b in booleans if b is not None]
        self.names: frozenset[str] = frozenset(b.name for b in self._booleans)
        self._corrid_name = ""
        self._corrid_datatype = ""
        found = _find(config, _Control.CONTROL_SEQUENCE_CORRID)
        if found is not None:
            name, control = found
            if control.int32_false_true or control.fp32_false_true or control.bool_false_true:  # type: ignore[attr-defined]
                raise NereidError.invalid(
                    "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                    f"'bool_false_true' for CONTROL_SEQUENCE_CORRID for {config.name}"
                )
            data_type = control.data_type  # type: ignore[attr-defined]
            if data_type not in _CORRID_TYPES:
                raise NereidError.invalid(
                    "unexpected control data type, expected TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32, or "
                    f"TYPE_STRING for CONTROL_SEQUENCE_CORRID for {config.name}"
                )
            self._corrid_name = name
            self._corrid_datatype = config_to_triton(mc.DataType.Name(data_type))
            self.names = self.names | {name}
        # Precomputed tensor lists for the four START/END combinations and for "not ready".
        self._by_flags = [self._build(flags, ready=True) for flags in range(4)]
        self._not_ready = self._build(0, ready=False)
        self.corrid_is_string = self._corrid_datatype == "BYTES"
        self.corrid_name = self._corrid_name

    def _build(self, flags: int, ready: bool) -> list[InputTensor]:
        tensors: list[InputTensor] = []
        for control in self._booleans:
            if not ready:
                value = False
            elif control.kind == _Control.CONTROL_SEQUENCE_START:
                value = bool(flags & SEQUENCE_START)
            elif control.kind == _Control.CONTROL_SEQUENCE_END:
                value = bool(flags & SEQUENCE_END)
            else:
                value = True
            tensors.append(control.true if value else control.false)
        return tensors

    def _corrid(self, correlation_id: int | str) -> InputTensor:
        shape = self._shape
        if self._corrid_datatype == "BYTES":
            text = correlation_id if isinstance(correlation_id, str) else str(correlation_id) if correlation_id else ""
            data = np.full(shape, text.encode("utf-8"), dtype=object)
        else:
            number = _string_as_number(correlation_id) if isinstance(correlation_id, str) else correlation_id
            # Triton copies the leading bytes of the 64-bit ID into the tensor, so narrower types wrap.
            word = np.array([number & 0xFFFFFFFFFFFFFFFF], dtype="<u8").view(np.uint8)
            dtype = numpy_dtype(self._corrid_datatype).newbyteorder("<")
            value = word[: dtype.itemsize].view(dtype)[0]
            data = np.full(shape, value, dtype=numpy_dtype(self._corrid_datatype))
        return InputTensor(self._corrid_name, self._corrid_datatype, shape, data)

    def for_request(self, flags: int, correlation_id: int | str) -> list[InputTensor]:
        tensors = self._by_flags[flags & (SEQUENCE_START | SEQUENCE_END)]
        if self._corrid_name:
            return [*tensors, self._corrid(correlation_id)]
        return list(tensors)

    def not_ready(self) -> list[InputTensor]:
        """The controls of a filler slot: every boolean false and CORRID 0 (or empty), as Triton sends them."""
        if self._corrid_name:
            return [*self._not_ready, self._corrid(0)]
        return list(self._not_ready)
