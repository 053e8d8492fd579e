"""Parse, normalise, validate and render Triton's ModelConfig (the protobuf shipped in tritonclient)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeAlias

from google.protobuf import descriptor, json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from nereid.config.model_metrics import ExtendedModelConfig, from_extended, to_extended, validate_model_metrics
from nereid.core.backend_registry import (
    BACKEND_TO_PLATFORM,
    DEFAULT_MODEL_FILENAMES,
    DEFAULT_MODEL_FILENAMES_BY_PLATFORM,
    PLATFORM_TO_BACKEND,
)
from nereid.core.errors import NereidError

__all__ = [
    "ModelConfig",
    "mc",
    "parse_pbtxt",
    "read_config_file",
    "config_from_json",
    "parse_json",
    "config_to_json_dict",
    "normalize",
    "validate",
    "platform_of",
]

# Generated protobuf classes have no type stubs; annotations use this alias, code builds mc.ModelConfig().
ModelConfig: TypeAlias = Any


# Configs are parsed through ExtendedModelConfig (ModelConfig plus later Triton's model_metrics) and handed on as
# tritonclient's ModelConfig, in which model_metrics rides as an unknown field.


def parse_pbtxt(text: str, source: str) -> ModelConfig:
    extended = ExtendedModelConfig()
    try:
        text_format.Parse(text, extended)
    except text_format.ParseError as exc:
        raise NereidError.invalid(f"failed to parse model configuration '{source}': {exc}") from None
    return from_extended(extended)


def read_config_file(path: Path) -> ModelConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise NereidError.invalid(f"failed to read model configuration '{path}': {exc.strerror}") from None
    return parse_pbtxt(text, str(path))


def config_from_json(text: str | bytes, model_name: str) -> ModelConfig:
    """A config given as JSON, as the repository load API's `config` parameter carries it."""
    try:
        return parse_json(text)
    except (json_format.ParseError, UnicodeDecodeError) as exc:
        raise NereidError.invalid(f"failed to load '{model_name}', failed to parse config JSON: {exc}") from None


def parse_json(text: str | bytes) -> ModelConfig:
    """A config from JSON (proto or camel-case field names); raises json_format.ParseError."""
    return from_extended(json_format.Parse(text, ExtendedModelConfig(), ignore_unknown_fields=False))


def platform_of(config: ModelConfig) -> str:
    """What metadata reports as the platform: the platform, else the backend name."""
    return config.platform or config.backend


_INT64_TYPES = {
    descriptor.FieldDescriptor.TYPE_INT64,
    descriptor.FieldDescriptor.TYPE_UINT64,
    descriptor.FieldDescriptor.TYPE_SINT64,
    descriptor.FieldDescriptor.TYPE_FIXED64,
    descriptor.FieldDescriptor.TYPE_SFIXED64,
}


def _ints_not_strings(message_descriptor: descriptor.Descriptor, value: Any) -> Any:
    """protobuf renders 64-bit integers as JSON strings; Triton renders them as numbers."""
    if not isinstance(value, dict):
        return value
    for key, item in value.items():
        field = message_descriptor.fields_by_name.get(key)
        if field is None:
            continue
        if field.type in _INT64_TYPES:
            if isinstance(item, list):
                value[key] = [int(v) for v in item]
            else:
                value[key] = int(item)
        elif field.message_type is not None:
            sub = field.message_type
            if sub.GetOptions().map_entry:
                value_field = sub.fields_by_name["value"]
                if value_field.message_type is not None:
                    for map_key, map_item in item.items():
                        item[map_key] = _ints_not_strings(value_field.message_type, map_item)
                elif value_field.type in _INT64_TYPES:
                    for map_key, map_item in item.items():
                        item[map_key] = int(map_item)
            elif isinstance(item, list):
                value[key] = [_ints_not_strings(sub, v) for v in item]
            else:
                value[key] = _ints_not_strings(sub, item)
    return value


def config_to_json_dict(config: ModelConfig) -> dict[str, Any]:
    """The config as Triton's GET .../config shows it: every scalar field, proto field names, model_metrics too."""
    as_dict = json_format.MessageToDict(
        to_extended(config), always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )
    return _ints_not_strings(ExtendedModelConfig.DESCRIPTOR, as_dict)


def normalize(config: ModelConfig, model_name: str) -> None:
    """Fill in what Triton fills in after auto-complete: names, platform/backend pairs, defaults."""
    if not config.name:
        config.name = model_name
    if config.platform and not config.backend:
        backend = PLATFORM_TO_BACKEND.get(config.platform)
        if backend:
            config.backend = backend
    if config.backend and not config.platform and config.backend in BACKEND_TO_PLATFORM:
        config.platform = BACKEND_TO_PLATFORM[config.backend]
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if not config.HasField("optimization") and config.platform != "ensemble":  # ensembles may not have one
        config.optimization.input_pinned_memory.enable = True
        config.optimization.output_pinned_memory.enable = True
    if not config.default_model_filename and config.platform in DEFAULT_MODEL_FILENAMES_BY_PLATFORM:
        config.default_model_filename = DEFAULT_MODEL_FILENAMES_BY_PLATFORM[config.platform]
    elif not config.default_model_filename and config.backend in DEFAULT_MODEL_FILENAMES:
        config.default_model_filename = DEFAULT_MODEL_FILENAMES[config.backend]
    if config.platform == "ensemble":
        return
    # As Triton: the group it adds when there is none takes the model's name; an unnamed group of the config's own
    # is '<model>_<its index>', even when it is the only one.
    if not config.instance_group:
        config.instance_group.add().name = config.name
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.count < 1:
            group.count = 1
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_GPU if group.gpus else mc.ModelInstanceGroup.KIND_CPU
    if config.HasField("dynamic_batching"):
        db = config.dynamic_batching
        if db.priority_levels and not db.default_priority_level:
            db.default_priority_level = (db.priority_levels + 1) // 2
    if config.HasField("sequence_batching"):
        sb = config.sequence_batching
        if not sb.max_sequence_idle_microseconds:
            sb.max_sequence_idle_microseconds = 1_000_000  # Triton's default idle timeout, shown by /config
        if sb.HasField("oldest") and not sb.oldest.preferred_batch_size and config.max_batch_size > 0:
            sb.oldest.preferred_batch_size.append(config.max_batch_size)


def _check_dims(model: str, kind: str, name: str, dims: Any) -> None:
    for dim in dims:
        if dim < -1 or dim == 0:
            raise NereidError.invalid(
                f"model '{model}', tensor '{name}': the model {kind} dims must be >= 1, or -1 for a "
                f"variable-size dimension, got [{','.join(str(d) for d in dims)}]"
            )


def validate(config: ModelConfig, model_name: str) -> None:
    """Triton's checks on a complete config; raises INVALID_ARG naming the model and field."""
    if config.name != model_name:
        raise NereidError.invalid(
            f"unexpected 'name' in model configuration '{config.name}', expected '{model_name}'"
        )
    if not config.platform and not config.backend:
        raise NereidError.invalid(
            f"unexpected platform type '' for {model_name}: set 'backend' or 'platform' in config.pbtxt"
        )
    if config.max_batch_size < 0:
        raise NereidError.invalid(f"model '{model_name}': max_batch_size must be >= 0")
    if config.platform == "ensemble":
        if not config.HasField("ensemble_scheduling") or not config.ensemble_scheduling.step:
            raise NereidError.invalid(f"ensemble '{model_name}' must have at least one step")
    seen: set[str] = set()
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            if not tensor.name:
                raise NereidError.invalid(f"model '{model_name}': every {kind} must have a name")
            key = f"{kind}:{tensor.name}"
            if key in seen:
                raise NereidError.invalid(f"model '{model_name}': duplicate {kind} name '{tensor.name}'")
            seen.add(key)
            if tensor.data_type == mc.TYPE_INVALID:
                raise NereidError.invalid(
                    f"model '{model_name}', {kind} '{tensor.name}': data_type must be specified"
                )
            if not tensor.dims:
                raise NereidError.invalid(f"model {kind} '{tensor.name}' must specify 'dims' for {model_name}")
            _check_dims(model_name, kind, tensor.name, tensor.dims)
            if tensor.HasField("reshape"):
                _check_reshape(model_name, tensor.name, list(tensor.dims), list(tensor.reshape.shape))
            if tensor.is_shape_tensor:
                # Triton takes shape tensors on its TensorRT platform only, which Nereid does not serve.
                raise NereidError.invalid(f"shape tensors are only supported for TensorRT platform for {model_name}")
    if config.batch_input or config.batch_output:
        _check_batch_io(config, model_name)
    if config.HasField("dynamic_batching"):
        for size in config.dynamic_batching.preferred_batch_size:
            if size < 1 or (config.max_batch_size and size > config.max_batch_size):
                raise NereidError.invalid(
                    f"model '{model_name}': dynamic batching preferred size {size} must be between 1 and "
                    f"max_batch_size {config.max_batch_size}"
                )
    validate_model_metrics(config, model_name)


def _check_batch_io(config: ModelConfig, model: str) -> None:
    """Triton's checks on batch_input and batch_output, with its wording: one source input each, a known
    source input, INT32 or FP32 batch inputs, and batch-output targets that are outputs, named once."""
    inputs = {tensor.name for tensor in config.input}
    outputs = {tensor.name for tensor in config.output}
    for batch_input in config.batch_input:
        kind = mc.BatchInput.Kind.Name(batch_input.kind)
        if len(batch_input.source_input) != 1:
            raise NereidError.invalid(
                f"batch input kind '{kind}' expects 1 source input, got {len(batch_input.source_input)} for {model}"
            )
        if batch_input.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
            raise NereidError.invalid(f"batch input data type must be TYPE_INT32 or TYPE_FP32 for {model}")
        _check_sources(batch_input.source_input, inputs, model)
    for batch_output in config.batch_output:
        kind = mc.BatchOutput.Kind.Name(batch_output.kind)
        if len(batch_output.source_input) != 1:
            raise NereidError.invalid(
                f"batch output kind '{kind}' expects 1 source input, got {len(batch_output.source_input)} for {model}"
            )
        _check_sources(batch_output.source_input, inputs, model)
        targets: set[str] = set()
        for target in batch_output.target_name:
            if target not in outputs:
                raise NereidError.invalid(f"unknown target output name '{target}' for {model}")
            if target in targets:
                raise NereidError.invalid(f"target output name '{target}' can only be specified once for {model}")
            targets.add(target)


def _check_sources(sources: Any, inputs: set[str], model: str) -> None:
    for source in sources:
        if source not in inputs:
            raise NereidError.invalid(f"unknown source input name '{source}' for {model}")


def _check_reshape(model: str, tensor: str, dims: list[int], reshape: list[int]) -> None:
    if -1 in dims or -1 in reshape:
        if dims.count(-1) != reshape.count(-1) and reshape:
            raise NereidError.invalid(
                f"model '{model}', tensor '{tensor}': reshape {reshape} does not match the variable "
                f"dimensions of dims {dims}"
            )
        return
    count_dims = 1
    for d in dims:
        count_dims *= d
    count_reshape = 1
    for d in reshape:
        count_reshape *= d
    if count_dims != count_reshape:
        raise NereidError.invalid(
            f"model '{model}', tensor '{tensor}': reshape {reshape} has {count_reshape} elements but dims "
            f"{dims} has {count_dims}"
        )
