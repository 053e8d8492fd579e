"""The `triton_python_backend_utils` module that Triton `model.py` files import, as Nereid's worker provides it.

The worker installs this module under Triton's name before it imports a model. Everything here runs inside the
worker process: requests arrive as views of the shared-memory input arena, and logging, custom metrics and BLS go
back to the server over the worker's channel (see `worker_runtime.Runtime`). The types live in `pb_tensor`,
`pb_requests`, `pb_errors` and `pb_config`; here are the module's surface, logging, custom metrics and the
model-repository calls. This module must not import the server.
"""

from __future__ import annotations

import enum
import re
import sys
import weakref
from typing import Any

from nereid.backends.python import pb_runtime
from nereid.backends.python.pb_config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from nereid.backends.python.pb_errors import TritonError, TritonModelException
from nereid.backends.python.pb_requests import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    InferenceTrace,
    get_input_tensor_by_name,
    get_output_tensor_by_name,
)
from nereid.backends.python.pb_strings import as_message, as_text
from nereid.backends.python.pb_tensor import (
    TRITON_STRING_TO_NUMPY,
    DataType,
    Tensor,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from nereid.backends.python.protocol import CALL_FAMILY, CALL_LOAD, CALL_METRIC_VALUE, CALL_MODEL_READY, CALL_UNLOAD

__all__ = [
    "Tensor",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "TritonError",
    "TritonModelException",
    "DataType",
    "Logger",
    "LogLevel",
    "MetricFamily",
    "Metric",
    "MetricKind",
    "ModelConfig",
    "PreferredMemory",
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "using_decoupled_model_transaction_policy",
    "triton_to_numpy_type",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "serialize_byte_tensor",
    "deserialize_bytes_tensor",
    "get_model_dir",
    "load_model",
    "unload_model",
    "is_model_ready",
    "TRITON_STRING_TO_NUMPY",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
]


# -- logging ---------------------------------------------------------------------------------------------------
class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    """Writes to the server's log, with the caller's file and line: `pb_utils.Logger.log_info("loaded")`."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        if not isinstance(level, LogLevel):  # Triton's pybind enum: a plain int is no level
            raise TypeError(f"Logger.log(): level must be a pb_utils.LogLevel, got {type(level).__name__}")
        _log_from_caller(int(level), message)

    @staticmethod
    def log_info(message: str) -> None:
        _log_from_caller(0, message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log_from_caller(1, message)

    @staticmethod
    def log_error(message: str) -> None:
        _log_from_caller(2, message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log_from_caller(3, message)


def _log_from_caller(level: int, message: Any) -> None:
    """A record with the file and line of the model code that called a Logger method (two frames up)."""
    if not isinstance(message, (str, bytes, bytearray)):  # Triton's pybind layer takes text (or bytes) only
        raise TypeError(f"Logger: the message must be a str, got {type(message).__name__}")
    frame = sys._getframe(2)
    pb_runtime.current.log(level, as_message(message), frame.f_code.co_filename, frame.f_lineno)


# -- custom metrics ----------------------------------------------------------------------------------------------
class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class MetricFamily:
    """A custom metric family on the server's metrics endpoint; `family.Metric(labels=...)` makes one series."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        try:
            self._kind = MetricKind(int(kind))
        except ValueError:
            raise TritonModelException(f"metric family '{name}': unknown kind {kind!r}") from None
        self._name = as_text(name, "MetricFamily name")
        self._description = as_text(description, "MetricFamily description")
        pb_runtime.call(CALL_FAMILY, (self._name, self._description, int(self._kind)), f"cannot create metric family '{name}'")

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802
        return Metric(self, labels, buckets)


class Metric:
    """One labelled series of a MetricFamily."""

    __slots__ = ("_family", "_kind", "_key", "_owner")

    def __init__(self, family: MetricFamily, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> None:
        self._family = family._name
        self._owner = weakref.ref(family)  # Triton's metrics die with their family (the model keeps it referenced)
        self._kind = family._kind
        label_items = []
        for key, value in (labels or {}).items():
            if not isinstance(key, str) or not _LABEL_NAME.match(key):
                raise TritonModelException(f"metric family '{family._name}': invalid label name {key!r}")
            if isinstance(value, (bytes, bytearray)):  # Triton's labels go through json.dumps, which refuses bytes
                raise TypeError(f"metric family '{family._name}': label '{key}' must be a str, got {type(value).__name__}")
            label_items.append((key, str(value)))
        self._key = tuple(sorted(label_items))
        bucket_list: tuple[float, ...] | None = None
        if family._kind == MetricKind.HISTOGRAM:
            if buckets is None:
                raise TritonModelException(f"metric family '{family._name}' is a histogram: Metric() needs buckets")
            bucket_list = tuple(float(b) for b in buckets)
            if any(low >= high for low, high in zip(bucket_list, bucket_list[1:])):
                # Triton (prometheus-cpp) refuses them rather than sorting (qa/L0_backend_python/custom_metrics).
                raise TritonModelException(
                    f"metric family '{family._name}': histogram buckets must be in strictly increasing order, got "
                    f"{list(bucket_list)}"
                )
        elif buckets is not None:
            raise TritonModelException(
                f"metric family '{family._name}' is a {family._kind.name.lower()}: only histograms take buckets"
            )
        pb_runtime.current.metric_op(("m", self._family, self._key, bucket_list))

    def _alive(self) -> None:
        if self._owner() is None:
            raise TritonModelException("Invalid metric operation as the corresponding 'MetricFamily' has been deleted.")

    def _refuse(self, what: str) -> TritonModelException:
        return TritonModelException(f"metric family '{self._family}' is a {self._kind.name}: {what}() is not supported")

    def increment(self, value: float) -> None:
        self._alive()
        if self._kind == MetricKind.HISTOGRAM:
            raise self._refuse("increment")
        if self._kind == MetricKind.COUNTER and value < 0:
            raise TritonModelException(f"metric family '{self._family}' is a COUNTER: it cannot decrease ({value})")
        pb_runtime.current.metric_op(("i", self._family, self._key, float(value)))

    def set(self, value: float) -> None:
        self._alive()
        if self._kind != MetricKind.GAUGE:
            raise self._refuse("set")
        pb_runtime.current.metric_op(("s", self._family, self._key, float(value)))

    def observe(self, value: float) -> None:
        self._alive()
        if self._kind != MetricKind.HISTOGRAM:
            raise self._refuse("observe")
        pb_runtime.current.metric_op(("o", self._family, self._key, float(value)))

    def value(self) -> float:
        self._alive()
        if self._kind == MetricKind.HISTOGRAM:
            raise self._refuse("value")
        return float(pb_runtime.call(CALL_METRIC_VALUE, (self._family, self._key), f"cannot read metric '{self._family}'"))


# -- the rest of the module's surface ------------------------------------------------------------------------------
class PreferredMemory:
    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


def get_model_dir() -> str:
    """The folder of the running model.py (the model version folder)."""
    return str(pb_runtime.current.version_dir)


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model of the repository, optionally with a JSON config and `file:<path>` contents
    (explicit model control mode only, as Triton's load API)."""
    model_name = as_text(model_name, "load_model model_name")
    overrides: dict[str, bytes] = {}
    for key, value in (files or {}).items():
        if not isinstance(key, (str, bytes, bytearray)) or not isinstance(value, (bytes, bytearray, memoryview)):
            raise TritonModelException(f"load_model('{model_name}'): files maps 'file:<path>' strings to bytes")
        overrides[as_text(key, "load_model files key")] = bytes(value)
    config_text = as_text(config, "load_model config") if config else ""
    pb_runtime.current.repository_call(CALL_LOAD, (model_name, config_text, overrides), "load")


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    pb_runtime.current.repository_call(CALL_UNLOAD, (as_text(model_name, "unload_model model_name"), bool(unload_dependents)), "unload")


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    name = as_text(model_name, "is_model_ready model_name")
    version = as_text(model_version, "is_model_ready model_version") if model_version else ""
    return bool(pb_runtime.current.repository_call(CALL_MODEL_READY, (name, version), "query"))


def _bind(runtime: Any) -> None:
    """The worker plugs in its runtime (see pb_runtime.bind)."""
    pb_runtime.bind(runtime)
