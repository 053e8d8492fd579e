"""The TensorFlow backend: a SavedModel's config completed from its signature, its sessions shared by up to
MAX_SESSION_SHARE_COUNT instances, and each instance running its batches on a thread of its own (TensorFlow frees
the GIL while a session runs, so instances run in parallel)."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from nereid.backends.base import ExecutionTimes, InstanceSpec, ModelContext
from nereid.backends.batching import requested_names, split_outputs, stack_inputs
from nereid.backends.tensorflow.autocomplete import complete_config
from nereid.backends.tensorflow.options import BackendOptions, ModelOptions, backend_options, model_options
from nereid.backends.tensorflow.runtime import (
    LoadedGraph,
    gpu_count,
    load_graphdef,
    load_savedmodel,
    read_signature,
    session_config,
    tensorflow,
)
from nereid.backends.tensorflow.signature import ModelTensor, shape_text
from nereid.config.model_config import ModelConfig, mc
from nereid.core.dtypes import config_to_triton
from nereid.core.errors import NereidError
from nereid.core.types import InferenceRequest, InferenceResponse

__all__ = ["BACKEND", "TensorFlowBackend", "TensorFlowInstance"]

log = logging.getLogger("nereid.tensorflow")

SAVEDMODEL = "tensorflow_savedmodel"
GRAPHDEF = "tensorflow_graphdef"
_DEFAULT_FILES = {SAVEDMODEL: "model.savedmodel", GRAPHDEF: "model.graphdef"}
# Where a model version's shared sessions live between its instances' creations (its context is theirs).
_SESSIONS = "_tensorflow_sessions"
_SESSIONS_LOCK = "_tensorflow_sessions_lock"


def _where(context: ModelContext) -> str:
    return f"[model '{context.name}' version {context.version}]"


def _platform(context: ModelContext) -> str:
    """The config's platform, else the one its default_model_filename or the version folder's files name (as
    Triton completes a config naming only `backend: "tensorflow"`)."""
    config = context.config
    if config.platform:
        return str(config.platform)
    for platform, filename in _DEFAULT_FILES.items():
        if config.default_model_filename == filename:
            return platform
    if not config.default_model_filename:
        if (context.version_path / _DEFAULT_FILES[SAVEDMODEL]).is_dir():
            return SAVEDMODEL
        if (context.version_path / _DEFAULT_FILES[GRAPHDEF]).is_file():
            return GRAPHDEF
    return ""


def _refuse_unsupported(context: ModelContext) -> None:
    """Config features this backend does not run yet, refused by name rather than half-served."""
    config = context.config
    features = []
    if len(config.batch_input) or len(config.batch_output) or any(i.allow_ragged_batch for i in config.input):
        features.append("ragged batching (batch_input, batch_output, allow_ragged_batch)")
    if len(config.sequence_batching.state):
        features.append("implicit sequence state (sequence_batching.state)")
    if features:
        raise NereidError.unsupported(f"{_where(context)}: the TensorFlow backend does not support {' or '.join(features)} yet")


def _full_shape(config: ModelConfig, entry: Any) -> list[int]:
    dims = list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)
    return ([-1] if config.max_batch_size > 0 else []) + dims


def _check_tensor(where: str, kind: str, entry: Any, model: ModelTensor, config: ModelConfig) -> None:
    """A config tensor against the model's: the same data type, and a shape the model accepts (a variable model
    dimension takes any size; a fixed one must be the config's)."""
    if model.data_type != entry.data_type:
        expected = mc.DataType.Name(model.data_type) if model.data_type else model.tf_type
        raise NereidError.invalid(
            f"{where} {kind} '{entry.name}': the model expects data type {expected} but the configuration says "
            f"{mc.DataType.Name(entry.data_type)}"
        )
    if model.shape is None:
        return
    full = _full_shape(config, entry)
    if len(full) != len(model.shape) or any(m != -1 and m != c for m, c in zip(model.shape, full)):
        batch = " (the first dimension is the batch, as max_batch_size > 0 says)" if config.max_batch_size > 0 else ""
        raise NereidError.invalid(
            f"{where} {kind} '{entry.name}': the model expects shape {shape_text(model.shape)} but the configuration "
            f"gives {shape_text(full)}{batch}"
        )


def _check_io(context: ModelContext, graph: LoadedGraph) -> None:
    """The config's tensors exist in the model with its data types and shapes, and every model input is fed."""
    config = context.config
    where = _where(context)
    for kind, entries, tensors in (("input", config.input, graph.inputs), ("output", config.output, graph.outputs)):
        for entry in entries:
            model = tensors.get(entry.name)
            if model is None:
                raise NereidError.invalid(
                    f"{where}: unexpected inference {kind} '{entry.name}', allowed {kind}s are: {', '.join(tensors)}"
                )
            _check_tensor(where, kind, entry, model, config)
    fed = {i.name for i in config.input} | {c.name for c in config.sequence_batching.control_input}
    missing = [name for name in graph.inputs if name not in fed]
    if missing:
        raise NereidError.invalid(
            f"{where}: the model requires input(s) {', '.join(repr(m) for m in missing)} that the model "
            f"configuration does not declare"
        )


class TensorFlowInstance:
    """One instance: its own thread, running the batches it is given on its (maybe shared) session."""

    def __init__(self, context: ModelContext, spec: InstanceSpec, graph: LoadedGraph) -> None:
        self.name = spec.name
        self._graph = graph
        self._tf = tensorflow()
        config = context.config
        self._where = _where(context)
        self._batching = config.max_batch_size > 0
        controls = [c.name for c in config.sequence_batching.control_input if c.name in graph.inputs]
        self._input_names = [i.name for i in config.input] + controls
        self._feed = [graph.inputs[name].tensor for name in self._input_names]
        self._output_names = [o.name for o in config.output]
        self._datatypes = {o.name: config_to_triton(mc.DataType.Name(o.data_type)) for o in config.output}
        # numpy has no bfloat16 of its own: the core carries BF16 as uint16 words, TensorFlow wants its bfloat16.
        self._bf16 = np.dtype(self._tf.bfloat16.as_numpy_dtype)
        self._bf16_inputs = {i.name for i in config.input if i.data_type == mc.TYPE_BF16}
        self._bf16_outputs = {o.name for o in config.output if o.data_type == mc.TYPE_BF16}
        # config `reshape`: the model sees reshape.shape where the client sends dims (the batch dimension kept).
        self._input_reshape = {i.name: list(i.reshape.shape) for i in config.input if i.HasField("reshape")}
        self._output_dims = {o.name: list(o.dims) for o in config.output if o.HasField("reshape")}
        self._callables: dict[tuple[str, ...], Any] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tf-{spec.name}")
        self._busy = 0

    def prepare(self) -> None:
        """Build the callable that fetches every output (the usual request), off the event loop."""
        self._callable(tuple(self._output_names))

    def _callable(self, names: tuple[str, ...]) -> Any:
        call = self._callables.get(names)
        if call is None:
            fetches = [self._graph.outputs[name].tensor for name in names]
            call = self._callables[names] = self._graph.session.make_callable(fetches, self._feed)
        return call

    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        loop = asyncio.get_running_loop()
        self._busy += 1
        try:
            return await loop.run_in_executor(self._executor, self._run, requests)
        finally:
            self._busy -= 1

    def _run(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        t0 = time.monotonic_ns()
        feed = stack_inputs(requests, self._input_names, self._batching)
        values = []
        for name in self._input_names:
            array = feed[name]
            shape = self._input_reshape.get(name)
            if shape is not None:
                array = array.reshape(([array.shape[0]] if self._batching else []) + shape)
            if name in self._bf16_inputs:
                array = np.ascontiguousarray(array).view(self._bf16)
            values.append(array)
        names = requested_names(requests, self._output_names)
        call = self._callable(tuple(names))
        t1 = time.monotonic_ns()
        try:
            arrays = list(call(*values))
        except self._tf.errors.InvalidArgumentError as exc:
            raise NereidError.invalid(f"{self._where}: TensorFlow refused the batch: {exc.message}") from None
        except Exception as exc:
            raise NereidError.internal(f"{self._where}: TensorFlow failed to run the model: {exc}") from None
        t2 = time.monotonic_ns()
        for i, name in enumerate(names):
            if name in self._bf16_outputs:
                arrays[i] = arrays[i].view(np.uint16)
            dims = self._output_dims.get(name)
            if dims is not None:
                arrays[i] = arrays[i].reshape(([arrays[i].shape[0]] if self._batching else []) + dims)
        responses = split_outputs(requests, names, arrays, self._datatypes, self._batching)
        t3 = time.monotonic_ns()
        return responses, ExecutionTimes(t1 - t0, t2 - t1, t3 - t2)

    async def close(self) -> None:
        if self._busy:
            # A run still in progress (after a drain timed out): wait for it off the event loop, never on it.
            await asyncio.to_thread(self._executor.shutdown, True)
        else:
            self._executor.shutdown(wait=False)
        self._callables.clear()
        await asyncio.to_thread(self._graph.release)


class TensorFlowBackend:
    name = "tensorflow"

    def auto_complete(self, context: ModelContext) -> None:
        """Name the platform from the files when the config does not, then (SavedModels only: a GraphDef says
        nothing of its inputs and outputs) complete the config from the serving signature."""
        config = context.config
        platform = _platform(context)
        if platform and not config.platform:
            config.platform = platform
        if platform == SAVEDMODEL:
            path = context.model_file(_DEFAULT_FILES[SAVEDMODEL])
            if not path.is_dir():
                return  # loading reports the missing model
            options = model_options(config)
            inputs, outputs = read_signature(path, options, _where(context))
            complete_config(config, inputs, outputs, backend_options(context.extra).default_max_batch_size)

    async def create_instance(self, context: ModelContext, spec: InstanceSpec) -> TensorFlowInstance:
        config = context.config
        where = _where(context)
        platform = _platform(context)
        if platform not in _DEFAULT_FILES:
            raise NereidError.invalid(
                f"{where}: platform '{config.platform}' is not a TensorFlow platform; expected "
                f"'{SAVEDMODEL}' (a model.savedmodel folder) or '{GRAPHDEF}' (a model.graphdef file)"
            )
        _refuse_unsupported(context)
        options = model_options(config)
        backend = backend_options(context.extra)
        path = context.model_file(_DEFAULT_FILES[platform])
        if not path.exists():
            raise NereidError.unavailable(f"{where}: unable to find '{path}' for model instance '{spec.name}'")
        device = await asyncio.to_thread(self._device, context, spec, options, backend)
        graph = await self._shared_graph(context, spec, platform, path, options, backend, device)
        try:
            instance = TensorFlowInstance(context, spec, graph)
            await asyncio.to_thread(instance.prepare)
        except BaseException:
            await asyncio.to_thread(graph.release)
            raise
        return instance

    def _device(self, context: ModelContext, spec: InstanceSpec, options: ModelOptions, backend: BackendOptions) -> str | None:
        """The device a GPU instance pins its graph to; None for CPU (and KIND_MODEL: the graph's own placement).
        GPU-only options on a CPU instance are said not to apply, never pretended."""
        where = _where(context)
        if spec.kind == "GPU":
            gpus = gpu_count()
            if spec.device_id >= gpus:
                raise NereidError.unavailable(
                    f"{where}: instance group '{spec.group_name}' asks for KIND_GPU device {spec.device_id} but the "
                    f"installed TensorFlow sees {gpus} GPU(s) (tensorflow-cpu has none; install tensorflow[and-cuda])"
                )
            if options.tensorrt:
                log.warning(
                    "%s: gpu_execution_accelerator 'tensorrt' is accepted but not applied: Nereid does not convert "
                    "models with TF-TRT, so instance '%s' runs on TensorFlow's own GPU kernels", where, spec.name,
                )
            return f"/device:GPU:{spec.device_id}"
        if options.gpu_accelerators:
            log.warning(
                "%s: gpu_execution_accelerator %s applies to GPU instances only; instance '%s' runs on CPU without it",
                where, options.gpu_accelerators, spec.name,
            )
        if backend.gpu_memory_fraction and spec.index == 0:
            log.warning(
                "%s: --backend-config=tensorflow,gpu-memory-fraction applies to GPU instances only; instance "
                "group '%s' runs on CPU", where, spec.group_name,
            )
        return None

    async def _shared_graph(
        self,
        context: ModelContext,
        spec: InstanceSpec,
        platform: str,
        path: Path,
        options: ModelOptions,
        backend: BackendOptions,
        device: str | None,
    ) -> LoadedGraph:
        """A session for this instance: one already loaded on the same device that fewer than
        MAX_SESSION_SHARE_COUNT instances use, else a new one (Triton's default of 1: a session per instance)."""
        pools: dict[str | None, list[LoadedGraph]] = context.extra.setdefault(_SESSIONS, {})
        lock: asyncio.Lock = context.extra.setdefault(_SESSIONS_LOCK, asyncio.Lock())
        async with lock:
            pool = pools.setdefault(device, [])
            pool[:] = [g for g in pool if g.session is not None]
            for graph in pool:
                if graph.acquire(options.share_count):
                    log.debug("%s: instance '%s' shares a TensorFlow session (%d of MAX_SESSION_SHARE_COUNT %d)",
                              _where(context), spec.name, graph.users, options.share_count)
                    return graph
            proto = session_config(options, backend, gpu=device is not None)
            where = _where(context)
            if platform == SAVEDMODEL:
                graph = await asyncio.to_thread(load_savedmodel, path, options, proto, device, context.name, where)
            else:
                names = ([i.name for i in context.config.input], [o.name for o in context.config.output])
                folders = (context.version_path, context.model_path)
                graph = await asyncio.to_thread(
                    load_graphdef, path, options, proto, device, names, folders, context.name, where
                )
            graph.users = 1
            try:
                _check_io(context, graph)
            except BaseException:
                await asyncio.to_thread(graph.release)
                raise
            pool.append(graph)
            log.debug("%s: instance '%s' opened a TensorFlow session on %s", where, spec.name, device or "CPU")
            return graph


# TensorFlow is imported with this module, which the registry imports only when the first TensorFlow model is
# prepared: other models and the server's start never pay for it, and a server without TensorFlow answers that
# model UNAVAILABLE naming the `tensorflow` extra (the registry turns this ImportError into that answer).
tensorflow()
BACKEND = TensorFlowBackend()
