"""ModelConfig's `model_metrics` (later Triton's per-model histogram buckets), which tritonclient's protobuf lacks.

A ModelConfig with the field is built once from tritonclient's descriptor in a pool of its own; configs are parsed
through it by protobuf itself, and the field rides in the ordinary ModelConfig as an unknown field. It must not
parse text by hand, and must keep every message class of its pool alive (see `_message_classes`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from tritonclient.grpc import model_config_pb2 as mc

from nereid.core.errors import NereidError

log = logging.getLogger("nereid.config")

__all__ = [
    "ExtendedModelConfig",
    "CUSTOMIZABLE_HISTOGRAMS",
    "FIRST_RESPONSE_HISTOGRAM",
    "to_extended",
    "from_extended",
    "validate_model_metrics",
    "histogram_buckets",
]

# ModelConfig's field number for model_metrics in later Triton releases' model_config.proto.
_MODEL_METRICS_FIELD = 26
# The histogram families whose buckets a model may set, as later Triton's core allows.
FIRST_RESPONSE_HISTOGRAM = "nv_inference_first_response_histogram_ms"
CUSTOMIZABLE_HISTOGRAMS = (FIRST_RESPONSE_HISTOGRAM,)

_F: Any = descriptor_pb2.FieldDescriptorProto


def _field(name: str, number: int, kind: int, type_name: str = "", repeated: bool = False) -> Any:
    field = _F(
        name=name,
        number=number,
        type=kind,
        label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
        json_name=name.split("_")[0] + "".join(part.title() for part in name.split("_")[1:]),
    )
    if type_name:  # set only for message fields: a set-but-empty type_name is refused
        field.type_name = type_name
    return field


def _build() -> Any:
    """ModelConfig plus ModelMetrics{ repeated MetricControl metric_control = 1 }, in Triton's shape:
    MetricControl{ MetricIdentifier metric_identifier = 1; oneof metric_options { HistogramOptions = 2 } }."""
    file = descriptor_pb2.FileDescriptorProto()
    mc.DESCRIPTOR.CopyToProto(file)
    metrics = file.message_type.add(name="ModelMetrics")
    control = metrics.nested_type.add(name="MetricControl")
    control.nested_type.add(name="MetricIdentifier").field.append(_field("family", 1, _F.TYPE_STRING))
    control.nested_type.add(name="HistogramOptions").field.append(
        _field("buckets", 1, _F.TYPE_DOUBLE, repeated=True)
    )
    control.oneof_decl.add(name="metric_options")
    prefix = ".inference.ModelMetrics.MetricControl"
    control.field.append(_field("metric_identifier", 1, _F.TYPE_MESSAGE, f"{prefix}.MetricIdentifier"))
    options = _field("histogram_options", 2, _F.TYPE_MESSAGE, f"{prefix}.HistogramOptions")
    options.oneof_index = 0
    control.field.append(options)
    metrics.field.append(_field("metric_control", 1, _F.TYPE_MESSAGE, f"{prefix}", repeated=True))
    config = next(message for message in file.message_type if message.name == "ModelConfig")
    config.field.append(_field("model_metrics", _MODEL_METRICS_FIELD, _F.TYPE_MESSAGE, ".inference.ModelMetrics"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return pool.FindMessageTypeByName("inference.ModelConfig").file


def _message_classes(file: Any) -> dict[str, Any]:
    """A class for every message type of the file, nested and map-entry types included, by full name.

    protobuf's upb extension makes a sub-message's class on first use and caches it without a strong reference; the
    class and its descriptor then form a cycle that dies with each parse's messages. When the cyclic collector clears
    such a class it nulls the class's descriptor but drops it from the cache only when freeing it, and a collection
    that gives up the GIL in between (an mmap freed, a finalizer) lets another thread's parse take the half-cleared
    class from the cache and crash on it (SIGSEGV; benchmarks/upb_class_cache_crash.py shows it with protobuf
    alone). Holding every class for the life of the process leaves the collector nothing of this pool to clear.
    tritonclient's generated modules hold theirs the same way.
    """
    classes: dict[str, Any] = {}
    pending = list(file.message_types_by_name.values())
    while pending:
        message = pending.pop()
        classes[message.full_name] = message_factory.GetMessageClass(message)
        pending.extend(message.nested_types)
    return classes


_CLASSES = _message_classes(_build())
# Generated classes have no stubs; annotations use Any.
ExtendedModelConfig: Any = _CLASSES["inference.ModelConfig"]


def to_extended(config: Any) -> Any:
    """The config as an ExtendedModelConfig, its model_metrics (an unknown field of ModelConfig) read back."""
    extended = ExtendedModelConfig()
    extended.ParseFromString(config.SerializeToString())
    return extended


def from_extended(extended: Any) -> Any:
    """The ordinary ModelConfig; model_metrics survives in it as an unknown field."""
    config = mc.ModelConfig()
    config.ParseFromString(extended.SerializeToString())
    return config


def validate_model_metrics(config: Any, model_name: str) -> None:
    """Later Triton's checks on model_metrics, with its wording, raised as INVALID_ARG naming the model."""
    for control in to_extended(config).model_metrics.metric_control:
        problem = ""
        if not control.HasField("metric_identifier"):
            problem = "metric control must specify 'metric_identifier'"
        elif not control.metric_identifier.family:
            problem = "metric identifier must specify non-empty 'family'"
        elif not control.HasField("histogram_options"):
            problem = "metric control must specify 'histogram_options'"
        elif not control.histogram_options.buckets:
            problem = "histogram options must specify non-empty 'buckets'"
        else:
            buckets = list(control.histogram_options.buckets)
            # Triton's Prometheus library throws on boundaries that are not strictly sorted; a non-finite one would
            # repeat or precede the implicit +Inf bucket.
            if not all(math.isfinite(b) for b in buckets) or any(a >= b for a, b in zip(buckets, buckets[1:])):
                problem = (
                    f"histogram 'buckets' of '{control.metric_identifier.family}': Bucket Boundaries must be finite "
                    f"and strictly sorted, got [{', '.join(format(b, 'g') for b in buckets)}]"
                )
        if problem:
            raise NereidError.invalid(f"model '{model_name}': {problem}")
        if control.metric_identifier.family not in CUSTOMIZABLE_HISTOGRAMS:
            # Later Triton loads the model and warns: the field is meant to grow to backend metrics.
            log.warning(
                "Metric family '%s' in 'metric_identifier' is not a customizable metric in Triton core (model '%s')",
                control.metric_identifier.family,
                model_name,
            )


def histogram_buckets(config: Any, family: str) -> tuple[float, ...] | None:
    """The buckets model_metrics sets for `family` (the last entry naming it wins), or None for the default."""
    buckets = None
    for control in to_extended(config).model_metrics.metric_control:
        if control.metric_identifier.family == family and control.HasField("histogram_options"):
            buckets = tuple(control.histogram_options.buckets)
    return buckets
