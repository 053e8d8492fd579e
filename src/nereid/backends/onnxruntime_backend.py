"""ONNX Runtime backend: one InferenceSession per instance, each run on its own thread (ORT frees the GIL)."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from nereid.backends.base import ExecutionTimes, InstanceSpec, ModelContext
from nereid.backends.batch_io import BatchIO
from nereid.backends.batching import requested_names, split_outputs, stack_inputs
from nereid.config.model_config import mc
from nereid.core.dtypes import config_to_triton
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InferenceResponse

__all__ = ["BACKEND", "OnnxRuntimeBackend"]

log = logging.getLogger("nereid.onnxruntime")

# ONNX element type names as onnxruntime reports them -> config data types.
_ORT_TO_CONFIG = {
    "tensor(bool)": mc.TYPE_BOOL,
    "tensor(int8)": mc.TYPE_INT8,
    "tensor(int16)": mc.TYPE_INT16,
    "tensor(int32)": mc.TYPE_INT32,
    "tensor(int64)": mc.TYPE_INT64,
    "tensor(uint8)": mc.TYPE_UINT8,
    "tensor(uint16)": mc.TYPE_UINT16,
    "tensor(uint32)": mc.TYPE_UINT32,
    "tensor(uint64)": mc.TYPE_UINT64,
    "tensor(float16)": mc.TYPE_FP16,
    "tensor(bfloat16)": mc.TYPE_BF16,
    "tensor(float)": mc.TYPE_FP32,
    "tensor(double)": mc.TYPE_FP64,
    "tensor(string)": mc.TYPE_STRING,
}
# What Triton's ORT backend uses when auto-complete finds a batchable model and no max_batch_size.
_DEFAULT_MAX_BATCH_SIZE = 4
# Runs shorter than this execute on the event loop instead of the instance's thread (until their average on the
# loop passes twice this).
INLINE_RUN_NS = 50_000
_ONNX_BFLOAT16 = 16  # TensorProto.BFLOAT16, without importing onnx at run time
_KNOWN_PARAMETERS = {
    "intra_op_spinning",
    "intra_op_thread_count",
    "inter_op_thread_count",
    "execution_mode",
    "enable_mem_arena",
    "enable_mem_pattern",
    "memory.enable_memory_arena_shrinkage",
}


def _default_max_batch_size(context: ModelContext) -> int:
    """--backend-config=onnxruntime,default-max-batch-size=N (or the global form), else Triton's 4."""
    settings = context.extra.get("backend_config", {})
    value = settings.get("onnxruntime", {}).get("default-max-batch-size") or settings.get("", {}).get(
        "default-max-batch-size"
    )
    return int(value) if value else _DEFAULT_MAX_BATCH_SIZE


def _ort() -> Any:
    import onnxruntime

    return onnxruntime


def _dims(shape: list[Any]) -> list[int]:
    return [d if isinstance(d, int) and d > 0 else -1 for d in shape]


def _session_options(context: ModelContext) -> Any:
    ort = _ort()
    options = ort.SessionOptions()
    params = {k: v.string_value for k, v in context.config.parameters.items()}
    for key in params:
        if key not in _KNOWN_PARAMETERS:
            log.warning("model '%s': unknown onnxruntime parameter '%s' ignored", context.name, key)
    # ORT's idle pool threads spin for work by default, taking a core from the event loop that serves
    # every request; they sleep instead unless the model asks for spinning.
    spinning = params.get("intra_op_spinning", "0")
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning in ("1", "true") else "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "1" if spinning in ("1", "true") else "0")
    try:
        if "intra_op_thread_count" in params:
            options.intra_op_num_threads = int(params["intra_op_thread_count"])
        if "inter_op_thread_count" in params:
            options.inter_op_num_threads = int(params["inter_op_thread_count"])
        if params.get("execution_mode") == "1":
            options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        if "enable_mem_arena" in params:
            options.enable_cpu_mem_arena = params["enable_mem_arena"] not in ("0", "false")
        if "enable_mem_pattern" in params:
            options.enable_mem_pattern = params["enable_mem_pattern"] not in ("0", "false")
    except ValueError as exc:
        raise NereidError.invalid(f"model '{context.name}': bad onnxruntime parameter: {exc}") from None
    level = context.config.optimization.graph.level if context.config.HasField("optimization") else 0
    # Triton's ORT backend levels: -1 basic, 1 basic + extended, 2 none; anything else (0) all of them.
    options.graph_optimization_level = {
        -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    log.debug(
        "model '%s': onnxruntime session options intra_op_num_threads=%d inter_op_num_threads=%d "
        "execution_mode=%s graph_optimization_level=%s",
        context.name,
        options.intra_op_num_threads,
        options.inter_op_num_threads,
        options.execution_mode.name,
        options.graph_optimization_level.name,
    )
    return options


# NodeProto.op_type (field 4) as it is serialized for the control-flow operators, whose run time depends on the
# data and not on the input sizes.
_CONTROL_FLOW_OPS = (b'"\x04Loop', b'"\x04Scan', b'"\x02If')
_INLINE_MAX_MODEL_BYTES = 64 * 1024 * 1024


def _may_run_inline(path: Path) -> bool:
    """Whether a model's short runs may run on the event loop: a small graph without data-dependent loops, so
    a run's time follows its input size (a big model is never a 50 µs run anyway)."""
    try:
        if path.stat().st_size > _INLINE_MAX_MODEL_BYTES:
            return False
        graph = path.read_bytes()
    except OSError:
        return False
    return not any(op in graph for op in _CONTROL_FLOW_OPS)


def _input_bytes(requests: list[InferenceRequest]) -> int:
    return sum(tensor.data.nbytes for request in requests for tensor in request.inputs)


def _model_path(context: ModelContext) -> Path:
    """The model file; `model.onnx` may also be a folder holding `model.onnx` and its external data."""
    path = context.model_file("model.onnx")
    return path / "model.onnx" if path.is_dir() else path


def _shape_text(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _batch_capable(config: Any, inputs: list[Any], outputs: list[Any]) -> bool:
    """Every model tensor has a variable first dimension, and no config tensor lists the full model rank
    (which would say the first dimension is not a batch)."""
    tensors = inputs + outputs
    if not tensors or any(not t.shape or _dims(t.shape)[0] != -1 for t in tensors):
        return False
    for config_tensors, model_tensors in ((config.input, inputs), (config.output, outputs)):
        by_name = {t.name: t for t in model_tensors}
        for entry in config_tensors:
            model = by_name.get(entry.name)
            if model is not None and entry.dims and not entry.HasField("reshape") and len(entry.dims) == len(model.shape):
                return False
    return True


def _check_io(context: ModelContext, session: Any) -> None:
    """The config's inputs and outputs must exist in the model with the same data type and a compatible
    shape, and the model's required inputs must all be in the config (Triton refuses the load otherwise)."""
    config = context.config
    where = f"model '{context.name}' version {context.version}"
    batching = config.max_batch_size > 0
    extra_inputs = {c.name for c in config.sequence_batching.control_input}
    extra_inputs |= {s.input_name for s in config.sequence_batching.state}
    extra_inputs |= {name for b in config.batch_input for name in b.target_name}
    ragged = {i.name for i in config.input if i.allow_ragged_batch}
    # A batch output's shape follows its source input, not the model's declared output shape.
    batch_outputs = {name for b in config.batch_output for name in b.target_name}
    model_inputs = session.get_inputs()
    for kind, model_tensors, config_tensors in (
        ("input", model_inputs, config.input),
        ("output", session.get_outputs(), config.output),
    ):
        by_name = {t.name: t for t in model_tensors}
        for entry in config_tensors:
            model = by_name.get(entry.name)
            if model is None:
                raise NereidError.invalid(
                    f"{where}: unexpected inference {kind} '{entry.name}', allowed {kind}s are: {', '.join(by_name)}"
                )
            expected = _ORT_TO_CONFIG.get(model.type)
            if expected is not None and entry.data_type != expected:
                raise NereidError.invalid(
                    f"{where}: unexpected datatype {mc.DataType.Name(entry.data_type)} for inference {kind} "
                    f"'{entry.name}', expecting {mc.DataType.Name(expected)}"
                )
            model_dims = _dims(model.shape)
            if kind == "input" and entry.name in ragged:
                # Triton's ORT backend feeds a ragged input as one flat tensor of the whole batch.
                if model_dims != [-1]:
                    raise NereidError.invalid(
                        f"unable to load model '{context.name}', configuration expects model provides input with "
                        f"shape [-1]  for ragged input '{entry.name}', model provides {_shape_text(model_dims)}"
                    )
                continue
            if kind == "output" and entry.name in batch_outputs:
                continue
            if batching:
                if not model_dims or model_dims[0] != -1:
                    raise NereidError.invalid(
                        f"{where}, {kind} '{entry.name}': for the model to support batching the shape should have "
                        f"at least 1 dimension and the first dimension must be -1; but shape expected by the model "
                        f"is {_shape_text(model_dims)}"
                    )
                model_dims = model_dims[1:]
            dims = list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)
            if len(dims) != len(model_dims) or any(m != -1 and d != -1 and m != d for m, d in zip(model_dims, dims, strict=True)):
                full = ([-1] if batching else []) + dims
                model_full = ([-1] if batching else []) + model_dims
                raise NereidError.invalid(
                    f"{where}, {kind} '{entry.name}': the model expects shape {_shape_text(model_full)} but the model "
                    f"configuration specifies shape {_shape_text(full)}"
                    + (" (after reshape)" if entry.HasField("reshape") else "")
                )
    known = {i.name for i in config.input} | extra_inputs
    missing = [t.name for t in model_inputs if t.name not in known]
    if missing:
        raise NereidError.invalid(
            f"{where}: the model requires input(s) {', '.join(repr(m) for m in missing)} that the model "
            f"configuration does not declare (configuration expects {len(config.input)} inputs, model provides "
            f"{len(model_inputs)})"
        )


def _providers(context: ModelContext, spec: InstanceSpec) -> list[Any]:
    available = _ort().get_available_providers()
    if spec.kind != "GPU":
        return ["CPUExecutionProvider"]
    accelerators = context.config.optimization.execution_accelerators.gpu_execution_accelerator
    providers: list[Any] = []
    if any(a.name == "tensorrt" for a in accelerators) and "TensorrtExecutionProvider" in available:
        providers.append(("TensorrtExecutionProvider", {"device_id": spec.device_id}))
    if "CUDAExecutionProvider" not in available:
        raise NereidError.unavailable(
            f"model '{context.name}': instance group '{spec.group_name}' asks for KIND_GPU but the installed "
            f"onnxruntime has no CUDA provider (available: {available})"
        )
    providers.append(("CUDAExecutionProvider", {"device_id": spec.device_id}))
    providers.append("CPUExecutionProvider")
    return providers


def _as_str_array(array: np.ndarray) -> np.ndarray:
    """ORT wants str elements for string tensors; the core carries bytes."""
    result = np.empty(array.shape, dtype=object)
    result.reshape(-1)[:] = [b.decode("utf-8", "replace") if isinstance(b, bytes) else b for b in array.reshape(-1)]
    return result


def _run_with_bf16(session: Any, names: list[str], feed: dict[str, np.ndarray], bf16_inputs: set[str]) -> list[np.ndarray]:
    """Run through io_binding, the one way onnxruntime's Python API takes and gives bfloat16 tensors."""
    ort = _ort()
    binding = session.io_binding()
    for name, array in feed.items():
        array = np.ascontiguousarray(array)
        if name in bf16_inputs:
            value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array, _ONNX_BFLOAT16)
        else:
            value = ort.OrtValue.ortvalue_from_numpy(array)
        binding.bind_ortvalue_input(name, value)
    for name in names:
        binding.bind_output(name)
    session.run_with_iobinding(binding)
    arrays: list[np.ndarray] = []
    for value in binding.get_outputs():
        if value.data_type() == "tensor(bfloat16)":
            shape = tuple(value.shape())
            words = (ctypes.c_uint16 * int(np.prod(shape, dtype=np.int64))).from_address(value.data_ptr())
            arrays.append(np.ctypeslib.as_array(words).copy().reshape(shape))
        else:
            arrays.append(value.numpy())
    return arrays


class OnnxRuntimeInstance:
    def __init__(self, context: ModelContext, spec: InstanceSpec, session: Any) -> None:
        self.name = spec.name
        self._session = session
        config = context.config
        self._batching = config.max_batch_size > 0
        # The sequence batcher adds control and implicit-state inputs, and takes the state outputs back.
        sequence = config.sequence_batching
        controls = [(c.name, k.data_type) for c in sequence.control_input for k in c.control]
        self._input_names = [i.name for i in config.input] + [name for name, _ in controls]
        self._input_names += [s.input_name for s in sequence.state]
        self._output_names = [o.name for o in config.output]
        self._state_outputs = [s.output_name for s in sequence.state]
        self._datatypes = {s.output_name: config_to_triton(mc.DataType.Name(s.data_type)) for s in sequence.state}
        self._datatypes.update({o.name: config_to_triton(mc.DataType.Name(o.data_type)) for o in config.output})
        # numpy has no bfloat16: such tensors travel as uint16 words and cross into ORT as OrtValues.
        self._bf16_inputs = {i.name for i in config.input if i.data_type == mc.TYPE_BF16}
        self._bf16_outputs = {o.name for o in config.output if o.data_type == mc.TYPE_BF16}
        self._string_inputs = {i.name for i in config.input if i.data_type == mc.TYPE_STRING}
        self._string_inputs |= {name for name, data_type in controls if data_type == mc.TYPE_STRING}
        self._string_inputs |= {s.input_name for s in sequence.state if s.data_type == mc.TYPE_STRING}
        self._string_outputs = {o.name for o in config.output if o.data_type == mc.TYPE_STRING}
        self._string_outputs |= {s.output_name for s in sequence.state if s.data_type == mc.TYPE_STRING}
        # config `reshape`: the model sees reshape.shape where the client sends dims (batch dim kept).
        self._input_reshape = {i.name: list(i.reshape.shape) for i in config.input if i.HasField("reshape")}
        self._output_dims = {o.name: list(o.dims) for o in config.output if o.HasField("reshape")}
        # Ragged inputs, batch inputs and batch outputs (None, and no cost, for models without them).
        self._batch_io = BatchIO.from_config(config)
        if self._batch_io is not None:
            self._input_names = [n for n in self._input_names if n not in self._batch_io.ragged]
            for name in self._batch_io.ragged:
                self._input_reshape.pop(name, None)
            self._output_dims = {n: d for n, d in self._output_dims.items() if not self._batch_io.is_batch_output(n)}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ort-{spec.name}")
        # Until measured, runs use the thread; see _observe.
        self._may_inline = _may_run_inline(_model_path(context))
        self._inline = False
        self._inline_ns = 0.0
        self._inline_bytes = 0  # the largest batch input, in bytes, of the runs that put the model on the loop
        self._thread_runs: list[tuple[int, int]] = []
        self._runs_on_thread = 0  # runs handed to the executor and not yet back

    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        if self._inline and _input_bytes(requests) <= 2 * self._inline_bytes:
            # Handing a run this short to the instance thread and back costs far more than the run (a thread
            # wake-up and the GIL's switch interval), so it runs here, on the event loop.
            return self._run(requests)
        loop = asyncio.get_running_loop()
        self._runs_on_thread += 1
        try:
            return await loop.run_in_executor(self._executor, self._run, requests)
        finally:
            self._runs_on_thread -= 1

    def _run(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        t0 = time.monotonic_ns()
        try:
            return self._run_timed(requests, t0)
        finally:
            if self._may_inline:
                self._observe(time.monotonic_ns() - t0, requests)

    def _observe(self, run_ns: int, requests: list[InferenceRequest]) -> None:
        """Choose where the next runs go. Runs on the thread wait for the GIL under load and look slower than
        they are, so the way to the loop takes the fastest of a few of them (and only inputs up to twice as big
        follow); runs on the loop are timed cleanly, and an average of them that grows sends the model back."""
        if self._inline:
            # One run is counted at most 4x the bound: a run whose end waited out another Python thread's turn with
            # the GIL (the monitor's, 4 times a second) reads milliseconds, and alone must not send the model
            # back to its thread; three slow runs in a row still do.
            self._inline_ns = 0.8 * self._inline_ns + 0.2 * min(run_ns, 4 * INLINE_RUN_NS)
            if self._inline_ns > 2 * INLINE_RUN_NS:
                self._inline = False
            return
        self._thread_runs.append((run_ns, _input_bytes(requests)))
        if len(self._thread_runs) >= 8:
            fastest = min(ns for ns, _ in self._thread_runs)
            if fastest < INLINE_RUN_NS:
                self._inline, self._inline_ns = True, float(fastest)
                self._inline_bytes = max(size for ns, size in self._thread_runs if ns < INLINE_RUN_NS)
            self._thread_runs.clear()

    def _run_timed(self, requests: list[InferenceRequest], t0: int) -> tuple[list[InferenceResponse], ExecutionTimes]:
        feed = stack_inputs(requests, self._input_names, self._batching)
        if self._batch_io is not None:
            self._batch_io.complete_feed(feed, requests)
        for name in self._string_inputs & feed.keys():
            feed[name] = _as_str_array(feed[name])
        for name, shape in self._input_reshape.items():
            if name in feed:
                array = feed[name]
                lead = [array.shape[0]] if self._batching else []
                feed[name] = array.reshape(lead + shape)
        names = requested_names(requests, self._output_names)
        if self._state_outputs:
            names = names + [name for name in self._state_outputs if name not in names]
        t1 = time.monotonic_ns()
        try:
            if self._bf16_inputs or self._bf16_outputs:
                arrays = _run_with_bf16(self._session, names, feed, self._bf16_inputs)
            else:
                arrays = self._session.run(names, feed)
        except Exception as exc:  # ORT raises its own exception types for bad data
            message = f"onnxruntime failed to run the model: {exc}"
            raise NereidError.internal(message) from None
        t2 = time.monotonic_ns()
        for i, name in enumerate(names):
            array = arrays[i]
            if name in self._string_outputs:
                encoded = np.empty(array.shape, dtype=object)
                encoded.reshape(-1)[:] = [s.encode("utf-8") if isinstance(s, str) else s for s in array.reshape(-1)]
                arrays[i] = encoded
            if name in self._output_dims:
                lead = [array.shape[0]] if self._batching else []
                arrays[i] = arrays[i].reshape(lead + self._output_dims[name])
        responses = split_outputs(requests, names, arrays, self._datatypes, self._batching, self._state_outputs)
        if self._batch_io is not None:
            self._batch_io.scatter(requests, responses, names, arrays)
        t3 = time.monotonic_ns()
        return responses, ExecutionTimes(t1 - t0, t2 - t1, t3 - t2)

    async def close(self) -> None:
        if self._runs_on_thread:
            # Wait for a run still in progress (after a drain timed out) off the event loop, never on it.
            await asyncio.to_thread(self._executor.shutdown, True)
        else:
            # Idle (the usual unload, and every eviction): nothing to wait for, so no hop through a thread, which
            # on a busy server waits behind other loads' work in the default executor.
            self._executor.shutdown(wait=False)
        self._session = None


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def auto_complete(self, context: ModelContext) -> None:
        config = context.config
        path = _model_path(context)
        if not path.is_file():
            return  # loading reports the missing file
        ort = _ort()
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        model_inputs = list(session.get_inputs())
        model_outputs = list(session.get_outputs())
        # Dynamic batching is switched on only when auto-complete chose max_batch_size itself; a config that
        # states max_batch_size without a scheduler keeps one request per execution, as in Triton.
        chose_batch_size = config.max_batch_size == 0 and _batch_capable(config, model_inputs, model_outputs)
        if chose_batch_size:
            config.max_batch_size = _default_max_batch_size(context)
        skip = 1 if config.max_batch_size > 0 else 0
        # The tensors the sequence batcher feeds (controls, state) and takes back (state), and the batch inputs
        # the backend computes, are not the client's.
        sequence = config.sequence_batching
        internal = {c.name for c in sequence.control_input} | {s.input_name for s in sequence.state}
        internal |= {s.output_name for s in sequence.state}
        internal |= {name for b in context.config.batch_input for name in b.target_name}
        for _kind, model_tensors, config_tensors in (
            ("input", model_inputs, config.input),
            ("output", model_outputs, config.output),
        ):
            existing = {t.name: t for t in config_tensors}
            for tensor in model_tensors:
                entry = existing.get(tensor.name)
                if entry is None and tensor.name in internal:
                    continue
                if entry is None:
                    entry = config_tensors.add()
                    entry.name = tensor.name
                if entry.data_type == mc.TYPE_INVALID:
                    entry.data_type = _ORT_TO_CONFIG.get(tensor.type, mc.TYPE_INVALID)
                if not entry.dims and not entry.HasField("reshape"):
                    entry.dims.extend(_dims(tensor.shape)[skip:])
                    if not entry.dims:
                        # A scalar per batch item is shown as [1] with an empty reshape, as Triton does.
                        entry.dims.append(1)
                        entry.reshape.SetInParent()
        if chose_batch_size and not config.HasField("dynamic_batching") and not config.HasField(
            "sequence_batching"
        ):
            config.dynamic_batching.SetInParent()

    async def create_instance(self, context: ModelContext, spec: InstanceSpec) -> OnnxRuntimeInstance:
        path = _model_path(context)
        if not path.is_file():
            raise NereidError.unavailable(
                f"model '{context.name}' version {context.version}: unable to find '{path}'"
            )
        options = _session_options(context)
        providers = _providers(context, spec)

        def build() -> Any:
            return _ort().InferenceSession(str(path), options, providers=providers)

        try:
            session = await asyncio.to_thread(build)
        except NereidError:
            raise
        except Exception as exc:
            raise NereidError.unavailable(f"model '{context.name}': onnxruntime could not load '{path}': {exc}") from None
        _check_io(context, session)
        return OnnxRuntimeInstance(context, spec, session)


BACKEND = OnnxRuntimeBackend()
