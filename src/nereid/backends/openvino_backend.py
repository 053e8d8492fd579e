"""OpenVINO backend: OpenVINO IR (`model.xml` + `model.bin`) and ONNX files compiled for the CPU, one compiled
model and infer request per instance, run on its own thread (OpenVINO frees the GIL while it infers).

Parameters are those of Triton's OpenVINO backend: PERFORMANCE_HINT, NUM_STREAMS, INFERENCE_NUM_THREADS,
COMPILATION_NUM_THREADS, HINT_BF16, CPU_EXTENSION_PATH, SKIP_OV_DYNAMIC_BATCHSIZE, ENABLE_BATCH_PADDING and
RESHAPE_IO_LAYERS (and the older CPU_THREADS_NUM / CPU_THROUGHPUT_STREAMS / ENFORCE_BF16 spellings).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from nereid.backends.base import ExecutionTimes, InstanceSpec, ModelContext
from nereid.backends.batching import requested_names, split_outputs, stack_inputs
from nereid.config.model_config import mc
from nereid.core.dtypes import config_to_triton
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InferenceResponse

__all__ = ["BACKEND", "OpenVINOBackend", "OpenVINOInstance"]

log = logging.getLogger("nereid.openvino")

_OV_TO_CONFIG = {
    "boolean": mc.TYPE_BOOL,
    "u8": mc.TYPE_UINT8,
    "u16": mc.TYPE_UINT16,
    "u32": mc.TYPE_UINT32,
    "u64": mc.TYPE_UINT64,
    "i8": mc.TYPE_INT8,
    "i16": mc.TYPE_INT16,
    "i32": mc.TYPE_INT32,
    "i64": mc.TYPE_INT64,
    "f16": mc.TYPE_FP16,
    "bf16": mc.TYPE_BF16,
    "f32": mc.TYPE_FP32,
    "f64": mc.TYPE_FP64,
}
# Triton parameter -> OpenVINO CPU property (older Triton spellings map to the same property).
_PROPERTIES = {
    "PERFORMANCE_HINT": "PERFORMANCE_HINT",
    "NUM_STREAMS": "NUM_STREAMS",
    "CPU_THROUGHPUT_STREAMS": "NUM_STREAMS",
    "INFERENCE_NUM_THREADS": "INFERENCE_NUM_THREADS",
    "CPU_THREADS_NUM": "INFERENCE_NUM_THREADS",
    "COMPILATION_NUM_THREADS": "COMPILATION_NUM_THREADS",
}
_FLAGS = {"HINT_BF16", "ENFORCE_BF16", "SKIP_OV_DYNAMIC_BATCHSIZE", "ENABLE_BATCH_PADDING", "RESHAPE_IO_LAYERS"}
_OTHER = {"CPU_EXTENSION_PATH", "CPU_BIND_THREAD"}
_HINTS = {"LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"}
_DEFAULT_MAX_BATCH_SIZE = 4


def _yes(value: str) -> bool:
    return value.strip().upper() in ("YES", "TRUE", "1", "ON")


def _dims(shape: Any) -> list[int]:
    return [d.get_length() if d.is_static else -1 for d in shape]


def _model_path(context: ModelContext) -> Path:
    """model.xml by default; a model.onnx when that is what the version folder holds."""
    path = context.model_file("model.xml")
    if not path.exists() and not context.config.default_model_filename:
        onnx = context.version_path / "model.onnx"
        if onnx.exists():
            return onnx
    return path


def _read_parameters(context: ModelContext) -> tuple[dict[str, str], dict[str, str]]:
    """(compile properties, backend flags) from the config parameters; bad values are INVALID_ARG."""
    where = f"model '{context.name}'"
    properties: dict[str, str] = {}
    flags: dict[str, str] = {}
    for key, value in context.config.parameters.items():
        raw = value.string_value.strip()
        if key in _PROPERTIES:
            target = _PROPERTIES[key]
            if target == "PERFORMANCE_HINT" and raw.upper() not in _HINTS:
                raise NereidError.invalid(f"{where}: PERFORMANCE_HINT must be one of {sorted(_HINTS)}, got '{raw}'")
            if target == "NUM_STREAMS" and raw.upper() not in ("AUTO", "NUMA") and not raw.isdigit():
                raise NereidError.invalid(f"{where}: NUM_STREAMS must be AUTO, NUMA or a number of streams, got '{raw}'")
            if target in ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS") and not raw.isdigit():
                raise NereidError.invalid(f"{where}: {key} must be a non-negative integer, got '{raw}'")
            properties[target] = raw.upper() if not raw.isdigit() else raw
        elif key in _FLAGS or key in _OTHER:
            flags[key] = raw
        else:
            log.warning("%s: unknown openvino parameter '%s' ignored", where, key)
    if _yes(flags.get("HINT_BF16", "")) or _yes(flags.get("ENFORCE_BF16", "")):
        properties["INFERENCE_PRECISION_HINT"] = "bf16"
    if "CPU_BIND_THREAD" in flags:
        properties["ENABLE_CPU_PINNING"] = "YES" if flags["CPU_BIND_THREAD"].upper() in ("YES", "NUMA") else "NO"
    return properties, flags


def _core(flags: dict[str, str]) -> Any:
    core = ov.Core()
    if flags.get("CPU_EXTENSION_PATH"):
        core.add_extension(flags["CPU_EXTENSION_PATH"])
    return core


def _prepare_shapes(context: ModelContext, model: Any, flags: dict[str, str]) -> None:
    """Give batching models a batch dimension OpenVINO accepts: dynamic by default, max_batch_size when
    SKIP_OV_DYNAMIC_BATCHSIZE is set; RESHAPE_IO_LAYERS takes the config's dims for every input."""
    config = context.config
    batching = config.max_batch_size > 0
    by_name = {i.name: i for i in config.input}
    shapes: dict[str, list[int]] = {}
    for port in model.inputs:
        dims = _dims(port.get_partial_shape())
        entry = by_name.get(port.get_any_name())
        if _yes(flags.get("RESHAPE_IO_LAYERS", "")) and entry is not None:
            dims = ([-1] if batching else []) + list(entry.dims)
        if batching and dims:
            dims[0] = config.max_batch_size if _yes(flags.get("SKIP_OV_DYNAMIC_BATCHSIZE", "")) else -1
        if dims != _dims(port.get_partial_shape()):
            shapes[port.get_any_name()] = dims
    if shapes:
        try:
            model.reshape({name: ov.PartialShape(dims) for name, dims in shapes.items()})
        except RuntimeError as exc:
            raise NereidError.invalid(f"model '{context.name}': OpenVINO cannot reshape the model to {shapes}: {exc}") from None


def _check_io(context: ModelContext, model: Any) -> None:
    config = context.config
    where = f"model '{context.name}' version {context.version}"
    for kind, ports, entries in (("input", model.inputs, config.input), ("output", model.outputs, config.output)):
        names = {name: port for port in ports for name in port.get_names()}
        for entry in entries:
            port = names.get(entry.name)
            if port is None:
                raise NereidError.invalid(
                    f"{where}: unexpected inference {kind} '{entry.name}', allowed {kind}s are: "
                    f"{', '.join(p.get_any_name() for p in ports)}"
                )
            expected = _OV_TO_CONFIG.get(port.get_element_type().get_type_name())
            if expected is not None and entry.data_type != expected:
                raise NereidError.invalid(
                    f"{where}: unexpected datatype {mc.DataType.Name(entry.data_type)} for inference {kind} "
                    f"'{entry.name}', expecting {mc.DataType.Name(expected)}"
                )


class OpenVINOInstance:
    def __init__(self, context: ModelContext, spec: InstanceSpec, compiled: Any, flags: dict[str, str]) -> None:
        self.name = spec.name
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        config = context.config
        self._batching = config.max_batch_size > 0
        self._max_batch_size = config.max_batch_size
        self._pad = _yes(flags.get("SKIP_OV_DYNAMIC_BATCHSIZE", "")) and _yes(flags.get("ENABLE_BATCH_PADDING", ""))
        self._input_names = [i.name for i in config.input]
        self._output_names = [o.name for o in config.output]
        self._ports = {o.name: compiled.output(o.name) for o in config.output}
        self._datatypes = {o.name: config_to_triton(mc.DataType.Name(o.data_type)) for o in config.output}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ov-{spec.name}")

    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run, requests)

    def _run(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        t0 = time.monotonic_ns()
        feed = stack_inputs(requests, self._input_names, self._batching)
        rows = next(iter(feed.values())).shape[0] if self._batching and feed else 0
        if self._pad and rows < self._max_batch_size:
            feed = {n: np.concatenate([a, np.zeros((self._max_batch_size - rows, *a.shape[1:]), a.dtype)]) for n, a in feed.items()}
        names = requested_names(requests, self._output_names)
        t1 = time.monotonic_ns()
        try:
            # share_outputs=False: the results are copies, so the next batch cannot overwrite a response.
            results = self._request.infer(feed, share_inputs=True, share_outputs=False)
        except Exception as exc:  # OpenVINO raises RuntimeError for bad shapes and data
            raise NereidError.internal(f"OpenVINO failed to run the model: {exc}") from None
        t2 = time.monotonic_ns()
        arrays = [results[self._ports[name]] for name in names]
        if self._pad and rows < self._max_batch_size:
            arrays = [a[:rows] for a in arrays]
        responses = split_outputs(requests, names, arrays, self._datatypes, self._batching)
        return responses, ExecutionTimes(t1 - t0, t2 - t1, time.monotonic_ns() - t2)

    async def close(self) -> None:
        self._executor.shutdown(wait=True)
        self._request = None
        self._compiled = None


class OpenVINOBackend:
    name = "openvino"

    def auto_complete(self, context: ModelContext) -> None:
        """Fill inputs, outputs and max_batch_size from the model, as Triton's OpenVINO backend does: a model
        whose every tensor has a dynamic first dimension can batch."""
        path = _model_path(context)
        if not path.is_file():
            return
        config = context.config
        _, flags = _read_parameters(context)
        model = _core(flags).read_model(str(path))
        ports = list(model.inputs) + list(model.outputs)
        batchable = bool(ports) and all(
            len(p.get_partial_shape()) > 0 and p.get_partial_shape()[0].is_dynamic for p in ports
        )
        chose = config.max_batch_size == 0 and batchable
        if chose:
            config.max_batch_size = _DEFAULT_MAX_BATCH_SIZE
        skip = 1 if config.max_batch_size > 0 else 0
        for config_tensors, model_ports in ((config.input, model.inputs), (config.output, model.outputs)):
            existing = {t.name: t for t in config_tensors}
            if config_tensors and not all(p.get_any_name() in existing for p in model_ports):
                continue  # the config lists its own tensors
            for port in model_ports:
                entry = existing.get(port.get_any_name())
                if entry is None:
                    entry = config_tensors.add()
                    entry.name = port.get_any_name()
                if entry.data_type == mc.TYPE_INVALID:
                    entry.data_type = _OV_TO_CONFIG.get(port.get_element_type().get_type_name(), mc.TYPE_INVALID)
                if not entry.dims:
                    entry.dims.extend(_dims(port.get_partial_shape())[skip:] or [1])
        if chose and not config.HasField("dynamic_batching") and not config.HasField("sequence_batching"):
            config.dynamic_batching.SetInParent()

    async def create_instance(self, context: ModelContext, spec: InstanceSpec) -> OpenVINOInstance:
        path = _model_path(context)
        if not path.is_file():
            raise NereidError.unavailable(f"model '{context.name}' version {context.version}: unable to find '{path}'")
        if spec.kind == "GPU":
            raise NereidError.unavailable(
                f"model '{context.name}': instance group '{spec.group_name}' asks for KIND_GPU; the openvino backend "
                f"runs on the CPU (use KIND_CPU)"
            )
        properties, flags = _read_parameters(context)

        def build() -> Any:
            core = _core(flags)
            model = core.read_model(str(path))
            _prepare_shapes(context, model, flags)
            _check_io(context, model)
            supported = core.get_property("CPU", "SUPPORTED_PROPERTIES")
            for key in [k for k in properties if k not in supported]:
                log.warning("model '%s': this OpenVINO CPU plugin has no property %s; parameter ignored", context.name, key)
                del properties[key]
            return core.compile_model(model, "CPU", properties)

        try:
            compiled = await asyncio.to_thread(build)
        except NereidError:
            raise
        except Exception as exc:
            raise NereidError.unavailable(f"model '{context.name}': OpenVINO could not load '{path}': {exc}") from None
        log.info(
            "model '%s': instance '%s' compiled for CPU with %s (streams %s, threads %s, hint %s)",
            context.name, spec.name, properties or "OpenVINO's defaults", compiled.get_property("NUM_STREAMS"),
            compiled.get_property("INFERENCE_NUM_THREADS"), compiled.get_property("PERFORMANCE_HINT"),
        )
        return OpenVINOInstance(context, spec, compiled, flags)


BACKEND = OpenVINOBackend()
