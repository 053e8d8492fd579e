"""What a TensorFlow model's config asks of TensorFlow: Triton's TF_* parameters, the `tensorflow` backend config
(--backend-config=tensorflow,...), and the execution accelerators, parsed and checked once per load. Never
imports TensorFlow: the runtime turns these into session options."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from nereid.backends.tensorflow.autocomplete import DEFAULT_MAX_BATCH_SIZE
from nereid.config.model_config import ModelConfig
from nereid.core.errors import NereidError

__all__ = ["ModelOptions", "BackendOptions", "model_options", "backend_options", "DEFAULT_TAG", "DEFAULT_SIGNATURE"]

log = logging.getLogger("nereid.tensorflow")

DEFAULT_TAG = "serve"
DEFAULT_SIGNATURE = "serving_default"
_TRUE = ("1", "true", "yes", "on")
_KNOWN = {
    "TF_NUM_INTRA_THREADS",
    "TF_NUM_INTER_THREADS",
    "TF_USE_PER_SESSION_THREADS",
    "TF_GRAPH_TAG",
    "TF_SIGNATURE_DEF",
    "MAX_SESSION_SHARE_COUNT",
    "TF_INIT_OPS_FILE",
}
_TRT_PARAMETERS = {"precision_mode", "minimum_segment_size", "max_workspace_size_bytes", "max_cached_engines"}
_GPU_ACCELERATORS = {"tensorrt", "auto_mixed_precision", "gpu_io"}


@dataclass(frozen=True, slots=True)
class ModelOptions:
    intra_threads: int = 0  # 0: TensorFlow's choice (one per core)
    inter_threads: int = 0
    per_session_threads: bool = False
    graph_tag: str = ""  # "": "serve"
    signature_def: str = ""  # "": "serving_default", else the first serving signature
    share_count: int = 1  # instances sharing one session (MAX_SESSION_SHARE_COUNT)
    init_ops_file: str = ""
    graph_level: int | None = None  # optimization.graph.level: XLA's global JIT level
    tensorrt: bool = False  # GPU only; TF-TRT is not applied (see docs/compatibility.md)
    auto_mixed_precision: bool = False  # GPU only: grappler's auto mixed precision

    @property
    def gpu_accelerators(self) -> list[str]:
        return [name for name, on in (("tensorrt", self.tensorrt), ("auto_mixed_precision", self.auto_mixed_precision)) if on]


@dataclass(frozen=True, slots=True)
class BackendOptions:
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    gpu_memory_fraction: float = 0.0  # 0: grow as needed
    allow_soft_placement: bool = True


def _count(config: ModelConfig, key: str, value: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        what = "a positive" if minimum > 0 else "a non-negative"
        raise NereidError.invalid(
            f"[model '{config.name}'] parameter '{key}': expected {what} integer, got '{value}'"
        )
    return number


def model_options(config: ModelConfig) -> ModelOptions:
    """The model's TensorFlow options; INVALID_ARG naming the parameter for a bad value."""
    params = {k: v.string_value for k, v in config.parameters.items()}
    for key in params:
        if key not in _KNOWN and not key.startswith("EXECUTION_ENV"):
            log.warning("model '%s': unknown tensorflow parameter '%s' ignored", config.name, key)
    accelerators = config.optimization.execution_accelerators
    if len(accelerators.cpu_execution_accelerator):
        raise NereidError.invalid(
            f"[model '{config.name}'] optimization.execution_accelerators.cpu_execution_accelerator: the TensorFlow "
            f"backend has no CPU execution accelerator (Triton's has none either)"
        )
    names = [a.name for a in accelerators.gpu_execution_accelerator]
    for accelerator in accelerators.gpu_execution_accelerator:
        if accelerator.name not in _GPU_ACCELERATORS:
            raise NereidError.invalid(
                f"[model '{config.name}'] gpu_execution_accelerator '{accelerator.name}': expected one of "
                f"{sorted(_GPU_ACCELERATORS)}"
            )
        if accelerator.name == "tensorrt":
            for key in accelerator.parameters:
                if key not in _TRT_PARAMETERS:
                    raise NereidError.invalid(
                        f"[model '{config.name}'] gpu_execution_accelerator 'tensorrt': unknown parameter '{key}', "
                        f"expected one of {sorted(_TRT_PARAMETERS)}"
                    )
    if "tensorrt" in names and "auto_mixed_precision" in names:
        raise NereidError.invalid(
            f"[model '{config.name}'] gpu_execution_accelerator: 'auto_mixed_precision' cannot be combined with "
            f"'tensorrt'"
        )
    level = config.optimization.graph.level if config.optimization.HasField("graph") else None
    return ModelOptions(
        intra_threads=_count(config, "TF_NUM_INTRA_THREADS", params.get("TF_NUM_INTRA_THREADS", "0"), 0),
        inter_threads=_count(config, "TF_NUM_INTER_THREADS", params.get("TF_NUM_INTER_THREADS", "0"), 0),
        per_session_threads=params.get("TF_USE_PER_SESSION_THREADS", "").lower() in _TRUE,
        graph_tag=params.get("TF_GRAPH_TAG", ""),
        signature_def=params.get("TF_SIGNATURE_DEF", ""),
        share_count=_count(config, "MAX_SESSION_SHARE_COUNT", params.get("MAX_SESSION_SHARE_COUNT", "1"), 1),
        init_ops_file=params.get("TF_INIT_OPS_FILE", ""),
        graph_level=level,
        tensorrt="tensorrt" in names,
        auto_mixed_precision="auto_mixed_precision" in names,
    )


def backend_options(extra: dict[str, Any]) -> BackendOptions:
    """--backend-config=tensorflow,KEY=VALUE (and the global default-max-batch-size) for this server."""
    settings: dict[str, dict[str, str]] = extra.get("backend_config", {})
    own = settings.get("tensorflow", {})
    shared = settings.get("", {})
    try:
        default_max = int(own.get("default-max-batch-size") or shared.get("default-max-batch-size") or DEFAULT_MAX_BATCH_SIZE)
        fraction = float(own.get("gpu-memory-fraction", "0") or 0)
    except ValueError as exc:
        raise NereidError.invalid(f"--backend-config=tensorflow: {exc}") from None
    if not 0.0 <= fraction <= 1.0:
        raise NereidError.invalid(f"--backend-config=tensorflow,gpu-memory-fraction={fraction}: expected 0.0 to 1.0")
    version = own.get("version", "2")
    if version != "2":
        raise NereidError.invalid(
            f"--backend-config=tensorflow,version={version}: Nereid runs TensorFlow 2 only (as Triton has since 23.04)"
        )
    return BackendOptions(
        default_max_batch_size=default_max,
        gpu_memory_fraction=fraction,
        allow_soft_placement=own.get("allow-soft-placement", "true").lower() in _TRUE,
    )
