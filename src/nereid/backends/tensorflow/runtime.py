"""TensorFlow itself: imported quietly when the first TensorFlow model loads, and SavedModels and GraphDefs loaded
into sessions made with the options a model asks for. It knows nothing of requests (the instance runs them).

Both formats run in TensorFlow's graph sessions (tf.compat.v1.Session), as TF Serving and Triton run them, and a
SavedModel is read through its SignatureDef (tensor names) rather than called as a tf.function:
- measured here (tensorflow-cpu 2.21, one thread, median of 7 rounds), a session callable took 142 µs a call where
  the signature's concrete function took 210 µs (a 4-float model, batch 1), and 382 µs against 598 µs for a 5 MB MLP
  at batch 1; at batch 32 they were within 7% of each other;
- a session carries its own options (threads, soft placement, GPU memory, auto mixed precision, XLA), which is
  where Triton's parameters and backend config go; the eager runtime has only process-wide settings;
- a GraphDef's state (variables, tables set up by TF_INIT_OPS_FILE's ops) lives in its session across calls.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nereid.backends.tensorflow.options import DEFAULT_SIGNATURE, DEFAULT_TAG, BackendOptions, ModelOptions
from nereid.backends.tensorflow.signature import ModelTensor
from nereid.core.errors import NereidError

__all__ = [
    "tensorflow",
    "LoadedGraph",
    "read_signature",
    "load_savedmodel",
    "load_graphdef",
    "session_config",
    "gpu_count",
    "PROCESS_THREADS",
]

log = logging.getLogger("nereid.tensorflow")

_import_lock = threading.Lock()
_tf: Any = None
# SignatureDef keys that are the SavedModel's own machinery, never a serving signature.
_NOT_SERVING = ("__saved_model_init_op", "__saved_model_train_op")


def tensorflow() -> Any:
    """The tensorflow module, imported on first use with its C++ logging at warnings and above (a user's own
    TF_CPP_MIN_LOG_LEVEL wins). The variable is TensorFlow's alone, so no other backend sees a change; oneDNN's
    one-line notice at import is printed before TensorFlow reads any setting and cannot be silenced from here."""
    global _tf
    if _tf is None:
        with _import_lock:
            if _tf is None:
                os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
                import tensorflow as tf

                # Its Python logger: the deprecation notices of the tf.compat.v1 API this module uses on purpose.
                tf_logger = logging.getLogger("tensorflow")
                if tf_logger.level == logging.NOTSET:
                    tf_logger.setLevel(logging.ERROR)
                _tf = tf
    return _tf


class _ProcessThreads:
    """TensorFlow sizes its intra-op pool, and the inter-op pool sessions share, when its first session starts,
    and ignores what later sessions ask. So the first TensorFlow model's TF_NUM_INTRA_THREADS and
    TF_NUM_INTER_THREADS hold for every TensorFlow model in this process; a later model asking for other values is
    told so (TF_USE_PER_SESSION_THREADS gives a model an inter-op pool of its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.first: tuple[str, int, int] | None = None
        self._told: set[str] = set()  # models already warned (each instance opens a session)

    def open_session(self, model: str, options: ModelOptions, graph: Any, config_proto: Any) -> Any:
        """A new session for `graph`. The process's first is made under the lock, so the model recorded as sizing
        the pools is the one that did (measured: a first session asking for 8 and 8 threads started 17 threads,
        a second asking for 1 and 1 started none)."""
        with self._lock:
            if self.first is None:
                self.first = (model, options.intra_threads, options.inter_threads)
                if options.intra_threads or options.inter_threads:
                    log.info(
                        "model '%s' sizes TensorFlow's process-wide thread pools: intra-op %s, inter-op %s",
                        model, options.intra_threads or "one per core", options.inter_threads or "one per core",
                    )
                return tensorflow().compat.v1.Session(graph=graph, config=config_proto)
            owner, intra, inter = self.first
            told = model in self._told
            self._told.add(model)
        if not told and options.intra_threads not in (0, intra):
            log.warning(
                "model '%s': TF_NUM_INTRA_THREADS=%d does not apply: TensorFlow sizes its intra-op pool once per "
                "process, and the first TensorFlow model ('%s') sized it to %s",
                model, options.intra_threads, owner, intra or "one per core",
            )
        if not told and options.inter_threads not in (0, inter) and not options.per_session_threads:
            log.warning(
                "model '%s': TF_NUM_INTER_THREADS=%d does not apply: sessions share TensorFlow's inter-op pool, which "
                "the first TensorFlow model ('%s') sized to %s; TF_USE_PER_SESSION_THREADS=true gives this model a "
                "pool of its own",
                model, options.inter_threads, owner, inter or "one per core",
            )
        return tensorflow().compat.v1.Session(graph=graph, config=config_proto)


PROCESS_THREADS = _ProcessThreads()


def gpu_count() -> int:
    """GPUs TensorFlow can use (0 for tensorflow-cpu, without asking the driver)."""
    tf = tensorflow()
    if not tf.test.is_built_with_gpu_support():
        return 0
    return len(tf.config.list_physical_devices("GPU"))


def session_config(options: ModelOptions, backend: BackendOptions, gpu: bool) -> Any:
    """A session's ConfigProto: threads, placement, and on a GPU instance its memory and mixed precision."""
    tf = tensorflow()
    config = tf.compat.v1.ConfigProto()
    config.intra_op_parallelism_threads = options.intra_threads
    config.inter_op_parallelism_threads = options.inter_threads
    config.use_per_session_threads = options.per_session_threads
    config.allow_soft_placement = backend.allow_soft_placement
    if gpu:
        # gpu-memory-fraction 0 (the default): take memory as it is needed; otherwise reserve that fraction.
        config.gpu_options.allow_growth = backend.gpu_memory_fraction == 0.0
        config.gpu_options.per_process_gpu_memory_fraction = backend.gpu_memory_fraction
        if options.auto_mixed_precision:
            config.graph_options.rewrite_options.auto_mixed_precision = 1  # RewriterConfig.ON
    else:
        config.device_count["GPU"] = 0  # a CPU instance stays off any GPU a GPU build of TensorFlow sees
    if options.graph_level is not None:
        # Triton's mapping of optimization.graph.level onto XLA's global JIT level: -1 off, 1 and 2 its levels.
        jit = tf.compat.v1.OptimizerOptions
        level = options.graph_level
        config.graph_options.optimizer_options.global_jit_level = (
            jit.OFF if level == -1 else jit.ON_1 if level == 1 else jit.ON_2 if level > 1 else jit.DEFAULT
        )
    return config


@dataclass(slots=True)
class LoadedGraph:
    """A model loaded into a session: its tensors by config name, and how many instances use the session."""

    session: Any
    inputs: dict[str, ModelTensor]
    outputs: dict[str, ModelTensor]
    users: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def acquire(self, limit: int) -> bool:
        """Take a share of the session if fewer than `limit` instances use it and it is still open."""
        with self._lock:
            if self.session is None or self.users >= limit:
                return False
            self.users += 1
            return True

    def release(self) -> None:
        """One instance is done with the session; the last one closes it."""
        with self._lock:
            self.users -= 1
            last = self.users <= 0
        if last and self.session is not None:
            self.session.close()
            self.session = None


def _model_tensor(key: str, info: Any, where: str, kind: str) -> ModelTensor:
    from tensorflow.core.framework import types_pb2

    if info.WhichOneof("encoding") != "name":
        raise NereidError.unavailable(
            f"{where}: signature {kind} '{key}' is a sparse or composite tensor; the TensorFlow backend serves dense "
            f"tensors only"
        )
    shape = None if info.tensor_shape.unknown_rank else tuple(d.size if d.size >= 0 else -1 for d in info.tensor_shape.dim)
    return ModelTensor(key, info.name, types_pb2.DataType.Name(info.dtype), shape)


def _signature(meta_graph: Any, requested: str, where: str) -> tuple[str, Any]:
    """The SignatureDef to serve: the one named, else serving_default, else (with a warning, as Triton does) the
    first signature that is not the SavedModel's own machinery."""
    signatures = meta_graph.signature_def
    key = requested or DEFAULT_SIGNATURE
    if key in signatures:
        return key, signatures[key]
    serving = sorted(k for k in signatures if k not in _NOT_SERVING)
    if not requested and serving:
        log.warning("%s: no signature '%s'; serving signature '%s'", where, DEFAULT_SIGNATURE, serving[0])
        return serving[0], signatures[serving[0]]
    raise NereidError.unavailable(
        f"{where}: the SavedModel has no signature '{key}' (TF_SIGNATURE_DEF); it has {serving or 'none'}"
    )


def _tensors(signature: Any, where: str) -> tuple[list[ModelTensor], list[ModelTensor]]:
    inputs = [_model_tensor(k, signature.inputs[k], where, "input") for k in sorted(signature.inputs)]
    outputs = [_model_tensor(k, signature.outputs[k], where, "output") for k in sorted(signature.outputs)]
    return inputs, outputs


def _meta_graph(path: Path, tag: str, where: str) -> Any:
    """The MetaGraphDef tagged exactly `tag`, read from saved_model.pb (or .pbtxt) without loading any weights."""
    tensorflow()
    from google.protobuf import text_format
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    try:
        if (path / "saved_model.pb").is_file():
            saved.ParseFromString((path / "saved_model.pb").read_bytes())
        elif (path / "saved_model.pbtxt").is_file():
            text_format.Parse((path / "saved_model.pbtxt").read_text(), saved)
        else:
            raise NereidError.unavailable(f"{where}: '{path}' holds no saved_model.pb")
    except (OSError, text_format.ParseError, ValueError) as exc:
        raise NereidError.unavailable(f"{where}: cannot read the SavedModel '{path}': {exc}") from None
    tag_sets = [sorted(m.meta_info_def.tags) for m in saved.meta_graphs]
    for meta_graph in saved.meta_graphs:
        if set(meta_graph.meta_info_def.tags) == {tag}:
            return meta_graph
    raise NereidError.unavailable(
        f"{where}: the SavedModel has no graph tagged '{tag}' (TF_GRAPH_TAG); its tag sets are {tag_sets}"
    )


def read_signature(path: Path, options: ModelOptions, where: str) -> tuple[list[ModelTensor], list[ModelTensor]]:
    """The inputs and outputs of the SavedModel's serving signature (for auto-complete: no session, no weights)."""
    meta_graph = _meta_graph(path, options.graph_tag or DEFAULT_TAG, where)
    _key, signature = _signature(meta_graph, options.signature_def, where)
    return _tensors(signature, where)


def _device_scope(device: str | None) -> Any:
    return tensorflow().device(device) if device else contextlib.nullcontext()


def load_savedmodel(
    path: Path, options: ModelOptions, config_proto: Any, device: str | None, model: str, where: str
) -> LoadedGraph:
    """Load the SavedModel's tagged graph and variables into a new session (its init op run, as the loader does)."""
    tf = tensorflow()
    tag = options.graph_tag or DEFAULT_TAG
    _meta_graph(path, tag, where)  # this backend's own message for a missing tag or file, before TensorFlow's
    graph = tf.Graph()
    session = PROCESS_THREADS.open_session(model, options, graph, config_proto)
    try:
        with graph.as_default(), _device_scope(device):
            # A GPU instance places the graph on its own device: the devices the graph was saved with are cleared.
            meta_graph = tf.compat.v1.saved_model.loader.load(session, [tag], str(path), clear_devices=device is not None)
        _key, signature = _signature(meta_graph, options.signature_def, where)
        inputs, outputs = _tensors(signature, where)
    except BaseException:
        session.close()
        raise
    return LoadedGraph(session, {t.name: t for t in inputs}, {t.name: t for t in outputs})


def _graph_tensor(graph: Any, name: str) -> Any:
    """The tensor a config name means in a GraphDef: a node's first output ("y"), or one output ("y:1")."""
    try:
        return graph.get_tensor_by_name(name if ":" in name else f"{name}:0")
    except (KeyError, ValueError):
        return None


def _init_ops(context_paths: tuple[Path, Path], filename: str, where: str) -> list[str]:
    """TF_INIT_OPS_FILE: a JSON file {"init_ops": [...]} in the version folder, else in the model folder."""
    version_path, model_path = context_paths
    path = version_path / filename if (version_path / filename).is_file() else model_path / filename
    try:
        document = json.loads(path.read_text())
        ops = document["init_ops"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NereidError.invalid(
            f"{where}: TF_INIT_OPS_FILE '{filename}': expected a JSON file {{\"init_ops\": [...]}} in the version or "
            f"model folder ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(ops, list) or not all(isinstance(op, str) for op in ops):
        raise NereidError.invalid(f"{where}: TF_INIT_OPS_FILE '{filename}': 'init_ops' must be a list of op names")
    return ops


def load_graphdef(
    path: Path,
    options: ModelOptions,
    config_proto: Any,
    device: str | None,
    names: tuple[list[str], list[str]],
    folders: tuple[Path, Path],
    model: str,
    where: str,
) -> LoadedGraph:
    """Import a frozen GraphDef into a new session. Its inputs are Placeholder nodes and any node's output can be
    fetched, so the config's names (`names`: inputs, outputs) say which; TF_INIT_OPS_FILE's ops run once."""
    tf = tensorflow()
    graph_def = tf.compat.v1.GraphDef()
    try:
        graph_def.ParseFromString(path.read_bytes())
    except Exception as exc:  # the file, or protobuf's DecodeError
        raise NereidError.unavailable(f"{where}: cannot read the GraphDef '{path}': {exc}") from None
    graph = tf.Graph()
    with graph.as_default(), _device_scope(device):
        if device:
            for node in graph_def.node:
                node.device = ""
        tf.compat.v1.import_graph_def(graph_def, name="")
    placeholders = {op.name: op for op in graph.get_operations() if op.type in ("Placeholder", "PlaceholderV2")}
    inputs: dict[str, ModelTensor] = {}
    outputs: dict[str, ModelTensor] = {}
    input_names, output_names = names
    for name in input_names:
        op_name = name.split(":", 1)[0]
        if op_name not in placeholders:
            raise NereidError.invalid(
                f"{where}: unexpected inference input '{name}': a GraphDef's inputs are its Placeholder nodes "
                f"({', '.join(sorted(placeholders)) or 'none'})"
            )
        inputs[name] = _tensor_of(graph, name)
    for name in output_names:
        if _graph_tensor(graph, name) is None:
            raise NereidError.invalid(f"{where}: unexpected inference output '{name}': the GraphDef has no such node")
        outputs[name] = _tensor_of(graph, name)
    session = PROCESS_THREADS.open_session(model, options, graph, config_proto)
    if options.init_ops_file:
        ops = _init_ops(folders, options.init_ops_file, where)
        try:
            session.run(ops)
        except Exception as exc:
            session.close()
            raise NereidError.unavailable(f"{where}: running TF_INIT_OPS_FILE's ops {ops} failed: {exc}") from None
    return LoadedGraph(session, inputs, outputs)


def _tensor_of(graph: Any, name: str) -> ModelTensor:
    tensor = _graph_tensor(graph, name)
    dtype = tensor.dtype.base_dtype.as_datatype_enum
    from tensorflow.core.framework import types_pb2

    rank = tensor.shape.rank
    shape = None if rank is None else tuple(-1 if d is None else int(d) for d in tensor.shape.as_list())
    return ModelTensor(name, tensor.name, types_pb2.DataType.Name(dtype), shape)
