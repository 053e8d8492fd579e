"""`Triton`: PyTriton's server object, served by Nereid in this process. `bind` makes a Python function a model
(written as a config.pbtxt into a workspace repository, run by the `python_function` backend), `run` starts the
server on a thread of its own with its own event loop and returns, `serve` blocks until stopped.

Everything the server does goes through Nereid's own settings and Server API: nothing here serves requests.
"""

from __future__ import annotations

import asyncio
import atexit
import copy
import dataclasses
import logging
import os
import pathlib
import re
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from nereid.core.errors import NereidError
from nereid.core.settings import ServerSettings
from nereid.pytriton import backend as function_backend
from nereid.pytriton._model_spec import check_model_name, config_text, model_spec
from nereid.pytriton._settings import server_settings
from nereid.pytriton._warmup import warm_up
from nereid.pytriton.decorators import TritonContext
from nereid.pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonInvalidOperationError,
    PyTritonRuntimeError,
    PyTritonValidationError,
)
from nereid.pytriton.model_config import ModelConfig, Tensor

__all__ = [
    "DEFAULT_PROTECTED_ENDPOINTS",
    "TRITON_ACCESS_HEADER",
    "RemoteTriton",
    "Triton",
    "TritonConfig",
    "TritonLifecyclePolicy",
    "TritonSecurityConfig",
]

log = logging.getLogger("nereid.pytriton")

MONITORING_PERIOD_S = 10.0
_START_TIMEOUT_S = 120.0
BINDING_FILE = "binding.pkl"  # read by _process_model in the worker
_LOAD_TIMEOUT_S = 120.0

VALID_TRITON_ENDPOINTS = frozenset(
    {"health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics", "trace", "logging"}
)
DEFAULT_PROTECTED_ENDPOINTS = ["shared-memory", "model-repository", "statistics", "trace", "logging"]
TRITON_ACCESS_HEADER = "triton-access-token"


@dataclasses.dataclass
class TritonConfig:
    """The server's settings, named as tritonserver's flags (PyTriton's TritonConfig); None keeps the default."""

    model_repository: pathlib.Path | None = None
    id: str | None = None
    log_verbose: int | None = None
    log_file: pathlib.Path | None = None
    exit_timeout_secs: int | None = None
    exit_on_error: bool | None = None
    strict_readiness: bool | None = None
    allow_http: bool | None = None
    http_address: str | None = None
    http_port: int | None = None
    http_header_forward_pattern: str | None = None
    http_thread_count: int | None = None
    http_restricted_api: str | None = None
    allow_grpc: bool | None = None
    grpc_address: str | None = None
    grpc_port: int | None = None
    grpc_header_forward_pattern: str | None = None
    grpc_infer_allocation_pool_size: int | None = None
    grpc_use_ssl: bool | None = None
    grpc_use_ssl_mutual: bool | None = None
    grpc_server_cert: pathlib.Path | None = None
    grpc_server_key: pathlib.Path | None = None
    grpc_root_cert: pathlib.Path | None = None
    grpc_infer_response_compression_level: str | None = None
    grpc_keepalive_time: int | None = None
    grpc_keepalive_timeout: int | None = None
    grpc_keepalive_permit_without_calls: bool | None = None
    grpc_http2_max_pings_without_data: int | None = None
    grpc_http2_min_recv_ping_interval_without_data: int | None = None
    grpc_http2_max_ping_strikes: int | None = None
    grpc_restricted_protocol: str | None = None
    allow_metrics: bool | None = None
    allow_gpu_metrics: bool | None = None
    allow_cpu_metrics: bool | None = None
    metrics_interval_ms: int | None = None
    metrics_port: int | None = None
    metrics_address: str | None = None
    allow_sagemaker: bool | None = None
    sagemaker_port: int | None = None
    sagemaker_safe_port_range: str | None = None
    sagemaker_thread_count: int | None = None
    allow_vertex_ai: bool | None = None
    vertex_ai_port: int | None = None
    vertex_ai_thread_count: int | None = None
    vertex_ai_default_model: str | None = None
    metrics_config: list[str] | None = None
    trace_config: list[str] | None = None
    cache_config: list[str] | None = None
    cache_directory: str | None = None
    buffer_manager_thread_count: int | None = None

    def __post_init__(self) -> None:
        if self.allow_http not in (True, None) and self.allow_grpc not in (True, None):
            raise PyTritonValidationError("The `http` or `grpc` endpoint has to be allowed.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TritonConfig:
        """Values converted to each field's type (lists from comma-separated text); unknown names are ignored."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, value in config.items():
            if name not in fields:
                log.warning("Ignoring %s=%s as could not find matching config field. Available fields: %s",
                            name, value, ", ".join(fields))  # fmt: skip
        values: dict[str, Any] = {}
        for name, value in config.items():
            if name not in fields or value is None:
                continue
            values[name] = _cast(name, value)
        return cls(**values)

    @classmethod
    def from_env(cls) -> TritonConfig:
        """Fields from PYTRITON_TRITON_CONFIG_<FIELD> variables; list fields from <FIELD>_<index> variables."""
        prefix = "PYTRITON_TRITON_CONFIG_"
        config: dict[str, Any] = {}
        indexed = re.compile(r"^(.+?)_(\d+)$")
        lists: dict[str, dict[int, str]] = {}
        for name, value in os.environ.items():
            if not name.startswith(prefix):
                continue
            key = name[len(prefix) :].lower()
            match = indexed.match(key)
            if match and match.group(1) in _LIST_FIELDS:
                lists.setdefault(match.group(1), {})[int(match.group(2))] = value
            else:
                config[key] = value
        for key, items in lists.items():
            config[key] = [items[i] for i in sorted(items)]
        return cls.from_dict(config)


_LIST_FIELDS = ("metrics_config", "trace_config", "cache_config")
_BOOL_FIELDS = {f.name for f in dataclasses.fields(TritonConfig) if "bool" in str(f.type)}
_INT_FIELDS = {f.name for f in dataclasses.fields(TritonConfig) if "int" in str(f.type)}
_PATH_FIELDS = {f.name for f in dataclasses.fields(TritonConfig) if "Path" in str(f.type)}


def _cast(name: str, value: Any) -> Any:
    if name in _LIST_FIELDS:
        return value.split(",") if isinstance(value, str) else list(value)
    if name in _BOOL_FIELDS:
        return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")
    if name in _INT_FIELDS:
        return int(value)
    if name in _PATH_FIELDS:
        return pathlib.Path(value)
    return str(value)


@dataclasses.dataclass
class TritonLifecyclePolicy:
    """PyTriton's lifecycle policy. Nereid always starts its server with the Triton object's context or run()."""

    launch_triton_on_startup: bool = True
    local_model_store: bool = False


DefaultTritonLifecyclePolicy = TritonLifecyclePolicy()


@dataclasses.dataclass
class TritonSecurityConfig:
    """Token-based restriction: requests to `restricted_endpoints` must carry the header triton-access-token with
    `access_token` (generated when not given). None keeps PyTriton's default set; [] restricts nothing."""

    access_token: str | None = None
    restricted_endpoints: list[str] | None = None

    def __post_init__(self) -> None:
        if self.restricted_endpoints is None:
            self.restricted_endpoints = list(DEFAULT_PROTECTED_ENDPOINTS)
        invalid = set(self.restricted_endpoints) - VALID_TRITON_ENDPOINTS
        if invalid:
            raise PyTritonValidationError(
                f"Invalid endpoint names: {', '.join(sorted(invalid))}. "
                f"Valid endpoints are: {', '.join(sorted(VALID_TRITON_ENDPOINTS))}"
            )
        if self.access_token is None and self.restricted_endpoints:
            self.access_token = secrets.token_urlsafe(32)


@dataclasses.dataclass
class _Model:
    name: str
    version: int
    callables: list[Callable[..., Any]]
    inputs: Sequence[Tensor]
    outputs: Sequence[Tensor]
    config: ModelConfig
    strict: bool
    loaded: bool = False


class _ServerThread:
    """The Nereid server on a daemon thread with its own event loop; other threads call into it with `call`."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: Any = None
        self.exit_code: int | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name="nereid-server", daemon=True)

    def _main(self) -> None:
        loop: asyncio.AbstractEventLoop
        try:
            import uvloop

            loop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        try:
            self.exit_code = loop.run_until_complete(self._run())
        except BaseException:
            log.exception("the Nereid server thread failed")
            self.exit_code = 1
        finally:
            self._started.set()
            loop.close()

    async def _run(self) -> int:
        from nereid.serve import serve_until

        self._stop = asyncio.Event()
        return await serve_until(self.settings, self._stop, self._on_started)

    def _on_started(self, server: Any) -> None:
        self.server = server
        self._started.set()

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(_START_TIMEOUT_S) or self.server is None:
            raise PyTritonRuntimeError(
                f"Nereid server failed to start (exit status {self.exit_code}); its log above says why"
            )

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout: float = _LOAD_TIMEOUT_S) -> Any:
        if self.loop is None or not self.alive:
            coroutine.close()
            raise PyTritonRuntimeError("the Nereid server is not running")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.server is not None and self.exit_code is None

    def stop(self, timeout: float) -> None:
        loop, stop = self.loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)


class Triton:
    """Serve Python functions as Triton models, in this process (PyTriton's `Triton`)."""

    def __init__(
        self,
        *,
        config: TritonConfig | None = None,
        workspace: str | pathlib.Path | None = None,
        triton_lifecycle_policy: TritonLifecyclePolicy | None = None,
        security_config: TritonSecurityConfig | None = None,
    ) -> None:
        def given(values: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in values.items() if v is not None}

        merged = {**given(TritonConfig.from_env().to_dict()), **given(config.to_dict() if config else {})}
        self._config = TritonConfig(**merged)
        if self._config.allow_vertex_ai:
            raise PyTritonValidationError("TritonConfig.allow_vertex_ai is not supported by Nereid's PyTriton API")
        policy = triton_lifecycle_policy or DefaultTritonLifecyclePolicy
        if not policy.launch_triton_on_startup:
            raise PyTritonValidationError(
                "TritonLifecyclePolicy(launch_triton_on_startup=False) is not supported: Nereid serves in-process"
            )
        self._security_config = security_config or TritonSecurityConfig()
        if workspace is None:
            self._workspace = pathlib.Path(tempfile.mkdtemp(prefix="nereid-pytriton-"))
            self._owns_workspace = True
        else:
            self._workspace = pathlib.Path(workspace).resolve()
            self._workspace.mkdir(parents=True)
            self._owns_workspace = False
        self._model_store = self._workspace / "model-store"
        self._model_store.mkdir(parents=True)
        security = self._security_config
        restricted = (
            (list(security.restricted_endpoints or ()), TRITON_ACCESS_HEADER, security.access_token)
            if security.access_token and security.restricted_endpoints
            else None
        )
        self._settings = server_settings(self._config, self._model_store, restricted)  # type: ignore[arg-type]
        self._triton_context = TritonContext()
        self._models: dict[tuple[str, int], _Model] = {}
        self._server: _ServerThread | None = None
        self._cv = threading.Condition()
        self._stopped = True
        self._connected = False
        self._cleaned = False
        atexit.register(self.stop)

    # -- binding -----------------------------------------------------------------------------------------
    def bind(
        self,
        model_name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: ModelConfig | None = None,
        strict: bool = False,
        trace_config: list[str] | None = None,
        *,
        execution: str = "thread",
    ) -> None:
        """Serve `infer_func` (a list: one callable per instance) as model `model_name`; loaded at once when the
        server runs already, else when it starts. `trace_config` is accepted for PyTriton's signature; tracing
        follows the server's --trace-config (TritonConfig.trace_config).

        `execution` (Nereid's own): "thread" runs each instance's callable on a thread in this process; "process"
        runs it in a Python-backend worker process per instance, for functions that hold the GIL. Those callables
        must pickle (module-level functions, objects of importable classes; the main script is re-run as
        `__mp_main__` in the workers, as multiprocessing's spawn does)."""
        if execution not in ("thread", "process"):
            raise PyTritonBadParameterError(f"execution must be 'thread' or 'process', got {execution!r}")
        check_model_name(model_name)
        callables = [infer_func] if callable(infer_func) else list(infer_func)
        if not callables or not all(callable(f) for f in callables):
            raise PyTritonValidationError("inference_fn has to be either callable or sequence of callables")
        key = (model_name.lower(), model_version)
        if key in self._models:
            raise PyTritonInvalidOperationError("Cannot add model with the same name twice.")
        config = config or ModelConfig()
        spec = model_spec(model_name, model_version, len(callables), inputs, outputs, config)
        text = config_text(spec)
        for function in callables:
            self._triton_context.model_configs[function] = copy.deepcopy(spec)
            # A bound method's context goes on its object, where decorators look for it (as in PyTriton).
            target: Any = function.__self__ if hasattr(function, "__self__") else function
            target.__triton_context__ = self._triton_context
        model = _Model(model_name, model_version, callables, inputs, outputs, config, strict)
        self._models[key] = model
        folder = self._model_store / model_name
        (folder / str(model_version)).mkdir(parents=True, exist_ok=True)
        (folder / "config.pbtxt").write_text(text)
        if execution == "process":
            write_process_model(folder / str(model_version), callables, spec, strict)
        function_backend.register(
            function_backend.Binding(model_name, model_version, callables, spec, strict, self._on_unrecoverable, execution)
        )
        if self.is_connected():
            self._load(model)

    def _load(self, model: _Model) -> None:
        server = self._server
        assert server is not None
        if model.config.model_warmup:
            warm_up(model.name, model.callables, model.config.model_warmup)
        if server.server.model_ready(model.name, str(model.version)):
            model.loaded = True
            return
        try:
            server.call(server.server.load_model(model.name))
        except NereidError as exc:
            raise PyTritonRuntimeError(f"model '{model.name}' failed to load: {exc.message}") from None
        model.loaded = True

    # -- lifecycle ---------------------------------------------------------------------------------------
    def __enter__(self) -> Triton:
        self.connect()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def _run_server(self) -> None:
        if self._server is not None and self._server.alive:
            return
        if self._cleaned:
            raise PyTritonInvalidOperationError("this Triton object was stopped; create a new one to serve again")
        server = _ServerThread(self._settings)
        server.start()
        self._server = server
        with self._cv:
            self._stopped = False

    def run(self) -> None:
        """Start the server (on a thread of its own) and load the bound models; returns once they are ready."""
        self.connect()

    def connect(self) -> None:
        with self._cv:
            if self._connected:
                return
        self._run_server()
        for model in self._models.values():
            if not model.loaded:
                self._load(model)
        with self._cv:
            self._connected = True

    def serve(self, monitoring_period_s: float = MONITORING_PERIOD_S) -> None:
        """Run, then block until the server stops (stop() from another thread, an unrecoverable error, Ctrl+C)."""
        self.connect()
        with self._cv:
            try:
                while self.is_alive():
                    self._cv.wait(timeout=monitoring_period_s)
            except KeyboardInterrupt:
                log.info("SIGINT received, exiting.")
        self.stop()

    def stop(self) -> bool:
        """Stop the server (in-flight requests finish within exit_timeout_secs), unload the models and remove
        the workspace. False when it was stopped already."""
        with self._cv:
            if self._cleaned:
                return False
            self._cleaned = True
            self._stopped = True
            self._connected = False
        atexit.unregister(self.stop)
        if self._server is not None:
            self._server.stop(self._settings.exit_timeout_secs + 5.0)
        for name, version in self._models:
            model = self._models[(name, version)]
            function_backend.unregister(model.name, model.version)
        if self._owns_workspace:
            shutil.rmtree(self._workspace, ignore_errors=True)
        else:
            shutil.rmtree(self._model_store, ignore_errors=True)
        with self._cv:
            self._cv.notify_all()
        return True

    def is_alive(self) -> bool:
        return self._server is not None and self._server.alive and not self._stopped

    def is_connected(self) -> bool:
        with self._cv:
            return self._connected

    def get_access_token(self) -> str | None:
        """The token that restricted endpoints require in the triton-access-token header."""
        return self._security_config.access_token

    def _on_unrecoverable(self, message: str) -> None:
        # From an instance thread: stopping waits for that very batch to finish, so it runs on a thread of its own.
        threading.Thread(target=self.stop, name="nereid-pytriton-stop", daemon=True).start()


def write_process_model(folder: pathlib.Path, callables: list[Callable[..., Any]], spec: Any, strict: bool) -> None:
    """A version folder the Python backend serves: a model.py that loads the pickled callables (see _process_model)."""
    import pickle
    import sys

    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    uses_main = any(getattr(f, "__module__", None) == "__main__" or
                    getattr(getattr(f, "__self__", None), "__module__", None) == "__main__" for f in callables)  # fmt: skip
    try:
        payload = pickle.dumps({"callables": callables, "spec": spec, "strict": strict})
    except Exception as exc:
        raise PyTritonBadParameterError(
            f"execution='process' needs callables that pickle (module-level functions, objects of importable "
            f"classes): {type(exc).__name__}: {exc}"
        ) from None
    header = {"sys_path": [p for p in sys.path if p], "main_file": main_file if uses_main else None}
    with open(folder / BINDING_FILE, "wb") as handle:
        pickle.dump(header, handle)
        handle.write(payload)
    (folder / "model.py").write_text("from nereid.pytriton._process_model import TritonPythonModel  # noqa: F401\n")


class RemoteTriton:
    """PyTriton's client of a Triton server in another process; Nereid serves bound functions in-process only."""

    def __init__(self, url: str, workspace: str | pathlib.Path | None = None, access_token: str | None = None) -> None:
        raise PyTritonValidationError(
            "RemoteTriton is not supported by Nereid's PyTriton API: bind functions with Triton(), which serves them "
            "in this process"
        )
