"""What `Triton.bind` makes of its arguments: the model's `TritonModelConfig` (what decorators read through the
triton context, as in PyTriton) and the config.pbtxt Nereid loads. Checks follow PyTriton's, with its messages."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from google.protobuf import text_format

from nereid.config.model_config import mc
from nereid.core.dtypes import triton_dtype_of, triton_to_config
from nereid.pytriton.exceptions import PyTritonBadParameterError, PyTritonValidationError
from nereid.pytriton.model_config import DeviceKind, DynamicBatcher, ModelConfig, QueuePolicy, Tensor

__all__ = ["FUNCTION_BACKEND", "TensorSpec", "TritonModelConfig", "check_model_name", "model_spec", "config_text"]

# The backend that serves bound functions (registered in nereid.backends.base).
FUNCTION_BACKEND = "python_function"

_BYTES_TYPES = (np.object_, object, bytes, np.bytes_, str, np.str_)


@dataclasses.dataclass
class TensorSpec:
    """One input or output of a bound model, with its final name."""

    name: str
    shape: tuple[int, ...]
    dtype: Any
    optional: bool | None = False


@dataclasses.dataclass
class ResponseCache:
    enable: bool


@dataclasses.dataclass
class TritonModelConfig:
    """The served model as decorators see it (`get_model_config`, `triton_context.model_configs[fn]`)."""

    model_name: str
    model_version: int = 1
    max_batch_size: int = 4
    batching: bool = True
    batcher: DynamicBatcher | None = None
    instance_group: dict[DeviceKind, int | None] = dataclasses.field(default_factory=dict)
    decoupled: bool = False
    backend_parameters: dict[str, str] = dataclasses.field(default_factory=dict)
    inputs: Sequence[TensorSpec] | None = None
    outputs: Sequence[TensorSpec] | None = None
    response_cache: ResponseCache | None = None

    @property
    def backend(self) -> str:
        return FUNCTION_BACKEND


def check_model_name(model_name: str) -> None:
    if not model_name:
        raise PyTritonValidationError("Model name cannot be empty")
    if not re.match(r"^[a-zA-Z0-9._-]+$", model_name):
        raise PyTritonValidationError("Model name can only contain alphanumeric characters, dots, underscores and dashes")


def config_type(dtype: Any) -> str:
    """numpy dtype -> 'TYPE_FP32'; bytes and objects are TYPE_STRING."""
    if dtype in _BYTES_TYPES:
        return "TYPE_STRING"
    try:
        return triton_to_config(triton_dtype_of(np.empty(0, dtype=dtype)))
    except (TypeError, ValueError):
        raise PyTritonBadParameterError(f"dtype {dtype!r} has no Triton data type") from None


def model_spec(
    model_name: str,
    model_version: int,
    instances: int,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    config: ModelConfig,
) -> TritonModelConfig:
    if any(output.optional for output in outputs):
        raise PyTritonValidationError("Output tensors cannot be optional.")
    if config.batching and config.max_batch_size < 1:
        raise PyTritonBadParameterError("The `max_batch_size` must be greater or equal to 1.")
    for tensor in (*inputs, *outputs):
        config_type(tensor.dtype)  # refuses a dtype with no Triton type before anything is served
    return TritonModelConfig(
        model_name=model_name,
        model_version=model_version,
        max_batch_size=config.max_batch_size if config.batching else 0,
        batching=config.batching,
        batcher=config.batcher,
        instance_group={DeviceKind.KIND_CPU: instances},
        decoupled=config.decoupled,
        inputs=[
            TensorSpec(t.name or f"INPUT_{i}", tuple(t.shape), t.dtype, bool(t.optional)) for i, t in enumerate(inputs, 1)
        ],
        outputs=[TensorSpec(t.name or f"OUTPUT_{i}", tuple(t.shape), t.dtype) for i, t in enumerate(outputs, 1)],
        response_cache=ResponseCache(enable=True) if config.response_cache else None,
    )


def _queue_policy(target: Any, policy: QueuePolicy) -> None:
    target.timeout_action = mc.ModelQueuePolicy.TimeoutAction.Value(policy.timeout_action.value)
    target.default_timeout_microseconds = int(policy.default_timeout_microseconds)
    target.allow_timeout_override = bool(policy.allow_timeout_override)
    target.max_queue_size = int(policy.max_queue_size)


def _dynamic_batching(config: Any, batcher: DynamicBatcher) -> None:
    db = config.dynamic_batching
    db.SetInParent()
    if batcher.max_queue_delay_microseconds > 0:
        db.max_queue_delay_microseconds = int(batcher.max_queue_delay_microseconds)
    if batcher.preferred_batch_size:
        db.preferred_batch_size.extend(int(size) for size in batcher.preferred_batch_size)
    db.preserve_ordering = bool(batcher.preserve_ordering)
    if batcher.priority_levels:
        db.priority_levels = int(batcher.priority_levels)
    if batcher.default_priority_level:
        if batcher.default_priority_level > batcher.priority_levels:
            raise PyTritonBadParameterError(
                f"The `default_priority_level` must be between 1 and {batcher.priority_levels}."
            )
        db.default_priority_level = int(batcher.default_priority_level)
    if batcher.default_queue_policy:
        _queue_policy(db.default_queue_policy, batcher.default_queue_policy)
    if batcher.priority_queue_policy:
        if not batcher.priority_levels:
            raise PyTritonBadParameterError(
                "Provide the `priority_levels` if you want to define `priority_queue_policy` for Dynamic Batching."
            )
        for priority, policy in batcher.priority_queue_policy.items():
            if priority < 0 or priority > batcher.priority_levels:
                raise PyTritonBadParameterError(
                    f"Invalid `priority`={priority} provided. The value must be between 1 and {batcher.priority_levels}."
                )
            _queue_policy(db.priority_queue_policy[int(priority)], policy)


def config_text(spec: TritonModelConfig) -> str:
    """The config.pbtxt of a bound model: the function backend, its tensors, batching, instances, decoupling, cache."""
    config = mc.ModelConfig()
    config.name = spec.model_name
    config.backend = FUNCTION_BACKEND
    config.max_batch_size = spec.max_batch_size
    if spec.batching and isinstance(spec.batcher, DynamicBatcher):
        _dynamic_batching(config, spec.batcher)
    for tensor in spec.inputs or ():
        item = config.input.add(name=tensor.name, data_type=mc.DataType.Value(config_type(tensor.dtype)))
        item.dims.extend(int(d) for d in tensor.shape)
        if tensor.optional:
            item.optional = True
    for tensor in spec.outputs or ():
        item = config.output.add(name=tensor.name, data_type=mc.DataType.Value(config_type(tensor.dtype)))
        item.dims.extend(int(d) for d in tensor.shape)
    for _kind, count in spec.instance_group.items():
        config.instance_group.add(count=int(count or 1), kind=mc.ModelInstanceGroup.KIND_CPU)
    if spec.decoupled:
        config.model_transaction_policy.decoupled = True
    if spec.response_cache is not None:
        config.response_cache.enable = spec.response_cache.enable
    return text_format.MessageToString(config)
