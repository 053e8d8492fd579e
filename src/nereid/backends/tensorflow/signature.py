"""A TensorFlow model's tensors as the config sees them: name, data type and shape, described without TensorFlow
objects so that auto-complete and the load checks can be tested (and run) without TensorFlow's types."""

from __future__ import annotations

from dataclasses import dataclass

from nereid.config.model_config import mc

__all__ = ["ModelTensor", "TF_TO_CONFIG", "config_type_of", "shape_text"]

# TensorFlow's DataType names -> config data types. Types with no Triton equivalent (complex, quantized, resource,
# variant) are absent: a tensor of those types cannot cross the wire.
TF_TO_CONFIG: dict[str, int] = {
    "DT_BOOL": mc.TYPE_BOOL,
    "DT_INT8": mc.TYPE_INT8,
    "DT_INT16": mc.TYPE_INT16,
    "DT_INT32": mc.TYPE_INT32,
    "DT_INT64": mc.TYPE_INT64,
    "DT_UINT8": mc.TYPE_UINT8,
    "DT_UINT16": mc.TYPE_UINT16,
    "DT_UINT32": mc.TYPE_UINT32,
    "DT_UINT64": mc.TYPE_UINT64,
    "DT_HALF": mc.TYPE_FP16,
    "DT_BFLOAT16": mc.TYPE_BF16,
    "DT_FLOAT": mc.TYPE_FP32,
    "DT_DOUBLE": mc.TYPE_FP64,
    "DT_STRING": mc.TYPE_STRING,
}


def config_type_of(tf_type_name: str) -> int:
    """The config data type of a TensorFlow DataType name; TYPE_INVALID when Triton has none."""
    return TF_TO_CONFIG.get(tf_type_name, mc.TYPE_INVALID)


def shape_text(dims: tuple[int, ...] | list[int] | None) -> str:
    return "unknown" if dims is None else "[" + ",".join(str(d) for d in dims) + "]"


@dataclass(frozen=True, slots=True)
class ModelTensor:
    """One input or output of a model. `name` is what the config and the client call it (a SavedModel
    signature's key, a GraphDef node's name); `tensor` is the graph tensor fed or fetched for it."""

    name: str
    tensor: str
    tf_type: str  # TensorFlow's DataType name, "DT_FLOAT"
    shape: tuple[int, ...] | None  # -1 for a variable dimension; None when the model does not say its rank

    @property
    def data_type(self) -> int:
        return config_type_of(self.tf_type)

    @property
    def batchable(self) -> bool:
        """Its first dimension is variable, so it can be a batch dimension."""
        return bool(self.shape) and self.shape[0] == -1  # type: ignore[index]
