"""The in-process server API, like Triton's C API: every frontend (and any embedding program) goes through it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

from prometheus_client.core import Metric

from nereid import __version__
from nereid.cache.codec import cache_key, decode_outputs, encode_outputs
from nereid.cache.response_cache import ResponseCache, create_cache
from nereid.config.model_config import ModelConfig, config_to_json_dict, mc, platform_of
from nereid.core.admission import InflightLimit
from nereid.core.capabilities import ReadinessCheck
from nereid.core.classification import classify
from nereid.core.dtypes import config_to_triton
from nereid.core.errors import NereidError, Status
from nereid.core.polling_policy import PollingPolicy
from nereid.core.request_memory import RequestMemoryBudget
from nereid.core.settings import ServerSettings
from nereid.core.shared_memory import SharedMemoryRegistry
from nereid.core.trace_settings import TraceSettings
from nereid.core.tracing import FrontendTrace, RequestTrace, TraceParent, Tracer
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor, RequestedOutput
from nereid.monitoring.monitor import Monitor, MonitorConfig
from nereid.repository.manager import ModelRepositoryManager, check_version_string, decode_file_overrides
from nereid.repository.model_version import ModelVersion
from nereid.rollouts.controller import RolloutController, Routing
from nereid.rollouts.shadow import ShadowComparisons, ShadowPair
from nereid.server.base import ServerBase, decoupled_refusal
from nereid.server.version_cost import version_cost

__all__ = ["Server", "EXTENSIONS", "decoupled_refusal"]

log = logging.getLogger("nereid.server")

_monotonic = time.monotonic

# How a request that can have only one response names itself in the decoupled refusal.
_ONE_RESPONSE = "ModelInfer RPC"
# Shadow copies are shed first: none goes to a candidate version with this many requests in flight.
_SHADOW_BACKLOG = 16

EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]


def _settle(future: asyncio.Future[InferenceResponse], response: InferenceResponse) -> None:
    if not future.done():
        future.set_result(response)


def _released(
    done: Callable[[InferenceResponse], None], shared_memory: SharedMemoryRegistry, held: tuple[str, ...], response: InferenceResponse
) -> None:
    """A request's answer, then its shared-memory regions let go (see SharedMemoryRegistry.hold)."""
    try:
        done(response)
    finally:
        shared_memory.release(held)


async def _releasing(
    responses: AsyncIterator[InferenceResponse], shared_memory: SharedMemoryRegistry, held: tuple[str, ...]
) -> AsyncIterator[InferenceResponse]:
    """A request's responses, its shared-memory regions held until the last one (or the caller's leaving)."""
    try:
        async for response in responses:
            yield response
    finally:
        await responses.aclose()  # type: ignore[attr-defined]
        shared_memory.release(held)


def _as_error(exc: BaseException) -> NereidError:
    if isinstance(exc, NereidError):
        return exc
    if isinstance(exc, asyncio.CancelledError):
        return NereidError(Status.CANCELLED, "Request was cancelled")
    return NereidError.internal(f"{type(exc).__name__}: {exc}")


class _Ending:
    """The respond callback of a request of one response (Server._start sets it): the end of the request's lifecycle
    (counted out, the first response's statistics, its trace finished, the output options applied), then the
    caller's `done`, once, whatever path the request came by."""

    __slots__ = ("server", "mv", "arrival_ns", "outputs", "done", "trace", "routing", "shadow", "sample")

    def __init__(
        self,
        server: Server,
        mv: ModelVersion,
        arrival_ns: int,
        outputs: list[RequestedOutput] | None,
        done: Callable[[InferenceResponse], None],
        trace: RequestTrace | None,
        routing: Routing | None = None,
    ) -> None:
        self.server = server
        self.mv = mv
        self.arrival_ns = arrival_ns
        self.outputs = outputs
        self.done: Callable[[InferenceResponse], None] | None = done
        self.trace = trace
        self.routing = routing  # a request a rollout routed: its outcome counts in the rollout's window
        self.shadow: InferenceRequest | None = None  # the request's copy for a shadow, sent once it is answered
        self.sample: tuple[str, list[InputTensor]] | None = None  # a request the monitor sampled: its id and inputs

    def __call__(self, response: InferenceResponse) -> None:
        done = self.done
        if done is None:
            return  # answered already
        self.done = None
        server = self.server
        mv = self.mv
        server._request_ended(mv)
        if mv.stats.first_response is not None:
            mv.stats.record_first_response(time.monotonic_ns() - self.arrival_ns)
        if self.trace is not None:
            _trace_response(self.trace, response)
            server.tracer.finish(self.trace, mv.version_str)
        if self.routing is not None:
            self.routing.rollout.record(mv.version_str, time.monotonic_ns() - self.arrival_ns, response.error is not None)
        if self.sample is not None:
            request_id, inputs = self.sample
            server.monitor.observe(mv.name, mv.version_str, mv.context.version_path, request_id, inputs, response,
                                   time.monotonic_ns() - self.arrival_ns)  # fmt: skip
        # The shadow's answer is compared with the model's own, not with what output options made of it (classes,
        # outputs written to the client's shared memory): those replace outputs in place, so the list is kept.
        answered = response
        if response.error is None and self.outputs:
            if self.shadow is not None:
                answered = replace(response, outputs=list(response.outputs))
            try:
                server._apply_output_options(mv, self.outputs, response)
            except NereidError as exc:
                response = InferenceResponse(response.model_name, response.model_version, response.id, error=exc)
        done(response)
        if self.shadow is not None and self.routing is not None:
            server._start_shadow(self.shadow, self.routing, answered)


def _trace_response(trace: RequestTrace, response: InferenceResponse) -> None:
    """A traced request's response is complete: its stamp (a BLS request's trace has none, as Triton's), and its
    outputs at the TENSORS level."""
    if not trace.parent_id:
        trace.stamp("INFER_RESPONSE_COMPLETE")
    if trace.tensors and response.error is None:
        for output in response.outputs:
            trace.tensor("TENSOR_BACKEND_OUTPUT", output.name, output.datatype, output.shape, output.data)


class _RepositoryVersions:
    """The repository as the rollout controller sees it (rollouts.controller.VersionsView)."""

    def __init__(self, repository: ModelRepositoryManager) -> None:
        self._repository = repository

    def ready_versions(self, model: str) -> list[str]:
        return sorted((mv.version_str for mv in self._repository.ready_versions() if mv.name == model), key=int)

    def default_version(self, model: str) -> str | None:
        mv = self._repository.find_any(model, "")
        return mv.version_str if mv is not None else None

    def parameters(self, model: str, version: str) -> Any:
        return self._repository.resolve(model, version).config.parameters

    def in_repository(self, model: str, version: str) -> bool:
        return version.isdigit() and int(version) in self._repository.version_folders(model)

    def hold(self, model: str, versions: list[str], pin: bool) -> None:
        self._repository.hold_versions(model, versions, pin)

    async def apply_held(self, model: str) -> None:
        await self._repository.apply_held(model)


class Server(ServerBase):
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        # When the event loop polls rather than sleeps: the schedulers and instances get it through their context.
        self.polling = PollingPolicy()
        self.repository = ModelRepositoryManager(settings, self.polling)
        self.repository.server = self
        self.shared_memory = SharedMemoryRegistry(settings.allow_client_shm)
        self.inflight = InflightLimit(settings.limits.max_inflight_requests)  # shared by HTTP and gRPC
        # --request-memory-limit: what requests hold while they arrive and are decoded, on every port
        self.request_memory = RequestMemoryBudget(settings.limits.request_memory_limit)
        self.live = False
        self._started = False
        self._stopping = False
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.cache: ResponseCache | None = (
            create_cache(*settings.cache_config) if settings.cache_config is not None else None
        )
        self.trace_settings = TraceSettings(settings.trace_config)
        self.tracer = Tracer(self.trace_settings)
        # --model-load-on-demand: a request for a model of the repository that is not loaded loads it first.
        self.loads_on_demand = settings.model_load_on_demand
        # Monitoring samples finished requests for drift, data quality and the payload log (monitoring/).
        self.monitor = Monitor(MonitorConfig(
            settings.monitoring_samples_per_second, settings.monitoring_window_secs, settings.monitoring_reference_requests,
            settings.payload_log_dir, settings.payload_log_share, settings.payload_log_max_bytes, settings.payload_log_backups,
        ))  # fmt: skip
        # Rollouts choose the version of requests naming none, for the models they cover (rollouts/).
        self.rollouts = RolloutController(
            _RepositoryVersions(self.repository), settings.rollout_state_file,
            input_drift=self.monitor.input_drift, compare_with=self.monitor.compare_with, cost=self._version_cost,
        )  # fmt: skip
        self._comparisons = ShadowComparisons()
        self._shadow_streams: set[asyncio.Task[None]] = set()  # decoupled shadow copies being drained

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the start-up models; raises when one fails and --exit-on-error is set."""
        self.live = True
        self.rollouts.restore()  # before the first loads: they load the versions open rollouts hold
        failures = await self.repository.load_initial()
        for failure in failures:
            log.error("%s", failure)
        if failures and self.settings.exit_on_error:
            raise NereidError.invalid("failed to load all models: " + "; ".join(failures))
        self.rollouts.start()
        self._started = True

    async def stop(self) -> None:
        """Refuse new work, let in-flight requests finish (bounded by --exit-timeout-secs), unload all."""
        self._stopping = True
        timeout = self.settings.exit_timeout_secs
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            log.warning("exit timeout expired with %d requests in flight", self._inflight)
        await self.rollouts.close()
        self._comparisons.close()
        self.monitor.close()
        await self.repository.unload_all(timeout)
        self.shared_memory.unregister()
        if self.cache is not None:
            await self.cache.close()
        self.tracer.close()
        self.live = False

    def ready(self) -> bool:
        if not self._started or self._stopping:
            return False
        return self.repository.all_ready() if self.settings.strict_readiness else True

    def metadata(self) -> dict[str, Any]:
        return {"name": self.settings.server_id, "version": __version__, "extensions": EXTENSIONS}

    # -- models --------------------------------------------------------------------------------
    def model(self, name: str, version: str = "") -> ModelVersion:
        return self.repository.resolve(name, version)

    async def wait_model(self, name: str, version: str = "") -> ModelVersion:
        """The ready version of a model; loading on demand, a model of the repository that is not loaded is loaded
        first (one load shared by every caller), up to --model-load-on-demand-timeout-secs."""
        try:
            return self.repository.resolve(name, version)
        except NereidError:
            if not self.loads_on_demand:
                raise
        return await self.repository.residency.acquire(name, version)

    def model_ready(self, name: str, version: str = "") -> bool:
        check_version_string(version)
        return self.repository.find_any(name, version) is not None

    async def model_is_ready(self, name: str, version: str = "") -> bool:
        """model_ready, and then the instances' own readiness checks where a backend has one (a Python model's
        optional is_ready()): what the model-ready endpoints answer."""
        if not self.model_ready(name, version):
            return False
        mv = self.repository.find_any(name, version)
        for instance in mv.instances if mv is not None else ():
            if isinstance(instance, ReadinessCheck) and not await instance.ready():
                return False
        return True

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        mv = self.model(name, version)
        config = mv.config
        batch = [-1] if config.max_batch_size > 0 else []

        def tensors(items: Any) -> list[dict[str, Any]]:
            return [
                {
                    "name": t.name,
                    "datatype": config_to_triton(mc.DataType.Name(t.data_type)),
                    "shape": batch + list(t.dims),
                }
                for t in items
            ]

        versions = sorted(self.repository.resolve_versions(name), key=int)
        return {
            "name": name,
            "versions": versions,
            "platform": platform_of(config),
            "inputs": tensors(config.input),
            "outputs": tensors(config.output),
        }

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        return self.model(name, version).config

    def model_config_json(self, name: str, version: str = "") -> dict[str, Any]:
        return config_to_json_dict(self.model_config(name, version))

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        if not name:
            return [mv.stats.as_dict() for mv in self.repository.ready_versions()]
        check_version_string(version)
        try:
            if version:
                return [self.model(name, version).stats.as_dict()]
            return [mv.stats.as_dict() for mv in self.repository.ready_versions() if mv.name == name] or [
                self.model(name).stats.as_dict()
            ]
        except NereidError:
            if version and self.repository.resolve_versions(name):
                raise NereidError.invalid(f"requested model version is not available for model '{name}'") from None
            raise NereidError.invalid(f"requested model '{name}' is not available") from None

    def custom_metric_families(self) -> Iterator[Metric]:
        """The metric families models registered themselves (pb_utils.MetricFamily), for the metrics endpoint: the
        ones this server's backends report."""
        return self.repository.backends.metric_families()

    # -- repository ----------------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.repository.index(ready_only)

    def _check_explicit(self) -> None:
        if self.settings.model_control_mode != "explicit":
            raise NereidError.unavailable("explicit model load / unload is not allowed if polling is enabled")

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        self._check_explicit()
        parameters = parameters or {}
        config = parameters.get("config")
        if config is not None and not isinstance(config, str):
            raise NereidError.invalid(f"failed to load '{name}': the 'config' parameter must be a JSON string")
        files = decode_file_overrides(parameters)
        self.repository.residency.forget_failure(name)
        await self.repository.remote.refresh()  # as Triton, a load reads the repository as it is now
        await self.repository.load(name, config, files or None)

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        self._check_explicit()
        dependents = bool((parameters or {}).get("unload_dependents", False))
        await self.repository.unload(name, self.settings.exit_timeout_secs, unload_dependents=dependents)

    # -- rollouts (Nereid's own API: /v2/nereid/rollouts, `nereid rollout`) -------------------------------------------
    async def start_rollout(self, model: str, version: str, steps: str, sticky_key: str = "") -> dict[str, Any]:
        """Start moving `version` of `model` through `steps` (the rollout grammar), loading it first where it is
        not loaded; its status."""
        await self.rollouts.begin(model, version, steps, sticky_key)
        return self.rollouts.status(model)

    def rollout_status(self, model: str = "") -> dict[str, Any]:
        return self.rollouts.report(model)

    async def rollout_action(self, model: str, action: str) -> dict[str, Any]:
        """pause, resume, abort, promote or undo; the status after it."""
        await self.rollouts.act(model, action)
        return self.rollouts.status(model)

    def rollout_history(self, model: str) -> dict[str, Any]:
        return self.rollouts.history_report(model)

    # -- inference: one lifecycle for every request -------------------------------------------------------------
    # Every way in (submit, infer, infer_stream; every frontend, BLS, ensembles, Ray) takes the same steps:
    # _loaded_version / _version (refused while stopping; loaded on demand), _admit (the decoupled refusal,
    # validation, the trace, counted in flight) and an ending (_Ending, or infer_stream's for many responses).
    def submit(self, request: InferenceRequest, done: Callable[[InferenceResponse], None]) -> bool:
        """Start one request of a non-decoupled model without awaiting it: `done` gets its response (errors of the
        execution inside it) from the scheduler's own callback, so a caller on the loop (a BLS call, a frontend's
        fast path) spends no task and no loop iteration waiting. Errors before execution raise. False, with nothing
        started: this request needs the coroutine path (`infer`: a load on demand first, or the response cache)."""
        routing = self._route(request) if self.rollouts.routing and not request.model_version else None
        mv = self._loaded_version(request)
        if mv is None or (self.cache is not None and mv.cache_enabled):
            if routing is not None:
                request.model_version = ""  # the coroutine path routes it again
            return False
        held = self.shared_memory.hold(request)
        if not held:
            self._start(mv, request, done, routing)
            return True
        try:
            self._start(mv, request, partial(_released, done, self.shared_memory, held), routing)
        except BaseException:
            self.shared_memory.release(held)
            raise
        return True

    async def infer(self, request: InferenceRequest, *, raise_error: bool = True) -> InferenceResponse:
        """Run one request of a non-decoupled model and return its single response: `submit` and a future, after a
        load on demand when the model needs one. An error of the execution raises, or with `raise_error=False`
        comes back inside the response (a BLS call's errors do)."""
        held = self.shared_memory.hold(request)
        try:
            routing = self._route(request) if self.rollouts.routing and not request.model_version else None
            response = await self._infer_on(await self._version(request), request, routing)
        finally:
            if held:
                self.shared_memory.release(held)
        if response.error is not None and raise_error:
            raise response.error
        return response

    async def _infer_on(
        self, mv: ModelVersion, request: InferenceRequest, routing: Routing | None = None
    ) -> InferenceResponse:
        future: asyncio.Future[InferenceResponse] = asyncio.get_running_loop().create_future()
        settle = partial(_settle, future)
        if self.cache is not None and mv.cache_enabled:
            trace = self._admit(mv, request, _ONE_RESPONSE)
            ending = _Ending(self, mv, request.arrival_ns, request.outputs, settle, trace, routing)
            try:
                ending(await self._infer_cached(mv, request, self.cache))
            except BaseException as exc:  # the request is over for the server whatever ended it
                ending(InferenceResponse(request.model_name, mv.version_str, request.id, error=_as_error(exc)))
                raise
        else:
            self._start(mv, request, settle, routing)
        try:
            return await future
        except asyncio.CancelledError:
            # The caller went away (gRPC cancel, HTTP disconnect): a queued request is dropped unexecuted, and its
            # ending comes with the scheduler's answer.
            request.cancelled = True
            raise

    def _loaded_version(self, request: InferenceRequest) -> ModelVersion | None:
        """The version a request names, if loaded; None when it must be loaded on demand first (`_version`). Refused
        while the server stops, and when the model is unknown or not loaded and nothing loads on demand."""
        if self._stopping:
            raise NereidError.unavailable("Server is stopping, no new requests are accepted")
        try:
            return self.repository.resolve(request.model_name, request.model_version)
        except NereidError:
            if not self.loads_on_demand:
                raise
        return None

    async def _version(self, request: InferenceRequest) -> ModelVersion:
        """`_loaded_version`, loading the model on demand (--model-load-on-demand) when it is not loaded."""
        mv = self._loaded_version(request)
        if mv is None:
            mv = await self.repository.residency.acquire(request.model_name, request.model_version)
        return mv

    def _admit(self, mv: ModelVersion, request: InferenceRequest, endpoint: str) -> RequestTrace | None:
        """A request on its version: refused if it needs one response (`endpoint` names how) from a decoupled
        model; validated; traced; counted in flight until its ending calls _request_ended."""
        if endpoint and mv.decoupled:
            raise decoupled_refusal(endpoint)
        mv.validator.validate(request)
        request.model_version = mv.version_str
        # A request a frontend holds a FrontendTrace for goes to _start_trace even if tracing was just turned off.
        trace = self._start_trace(mv, request) if self.tracer.enabled or request.trace is not None else None
        self._request_started(mv)
        return trace

    def _start(
        self,
        mv: ModelVersion,
        request: InferenceRequest,
        done: Callable[[InferenceResponse], None],
        routing: Routing | None = None,
    ) -> None:
        """Admit a request of one response and hand it to its scheduler; its answer goes through _Ending to `done`."""
        trace = self._admit(mv, request, _ONE_RESPONSE)
        # The callback carries what it needs of the request, never the request itself: a request holding a callback
        # that holds the request is a reference cycle, left to the garbage collector's pauses.
        ending = request.respond = _Ending(self, mv, request.arrival_ns, request.outputs, done, trace, routing)
        if self.monitor.active and self.monitor.wants():
            ending.sample = (request.id, request.inputs)
        try:
            mv.scheduler.submit(request)  # type: ignore[union-attr]
        except BaseException:
            self._request_ended(mv)
            raise
        if routing is not None and routing.shadow is not None:
            ending.shadow = self._shadow_copy(request)

    # -- rollouts: the version choice and shadow copies --------------------------------------------------------------
    def _route(self, request: InferenceRequest) -> Routing | None:
        """A request naming no version of a model under a rollout gets the version the rollout chooses, when that
        version is ready (otherwise Triton's default stands)."""
        rollout = self.rollouts.routing.get(request.model_name)
        if rollout is None:
            return None
        route, routing = self.rollouts.route(rollout, request.parameters)
        if not self.repository.routes.is_ready(request.model_name, route.version):
            return None
        request.model_version = route.version
        return routing

    def _version_cost(self, name: str, version: str) -> tuple[int, int] | None:
        mv = self.repository.find_any(name, version)
        return version_cost(mv) if mv is not None else None

    @staticmethod
    def _shadow_copy(request: InferenceRequest) -> InferenceRequest:
        """A request's copy for the candidate. Inputs read from a shared-memory region are copied: the client may
        write the region again once it has the primary's answer, before the copy runs."""
        inputs = [
            replace(tensor, data=tensor.data.copy()) if "shared_memory_region" in tensor.parameters else tensor
            for tensor in request.inputs
        ]
        return InferenceRequest(
            request.model_name, "", inputs, request.id, request.outputs, dict(request.parameters),
            request.priority, request.timeout_us, request.correlation_id, request.flags, request.arrival_ns,
        )  # fmt: skip

    def _shadow_target(self, copy: InferenceRequest, routing: Routing, decoupled: bool) -> ModelVersion | None:
        """The candidate a shadow copy goes to, or None where the copy is shed: the candidate is backed up, or is
        not of the primary's kind (decoupled or not)."""
        mv = self.repository.find_any(copy.model_name, routing.shadow or "")
        if mv is None or mv.decoupled is not decoupled or mv.inflight >= _SHADOW_BACKLOG:
            self.rollouts.shadows_shed += 1
            return None
        copy.model_version = mv.version_str
        return mv

    def _start_stream_shadow(self, request: InferenceRequest, routing: Routing) -> None:
        """A decoupled request's shadow copy: its stream is drained off the request path, and its time to the final
        response and its errors count in the candidate's window. Streams are not compared: how many responses a
        decoupled model sends, and when, is its own business."""
        copy = self._shadow_copy(request)
        if self._shadow_target(copy, routing, decoupled=True) is not None:
            task = asyncio.get_running_loop().create_task(self._drain_shadow(copy, routing))
            self._shadow_streams.add(task)
            task.add_done_callback(self._shadow_streams.discard)

    async def _drain_shadow(self, copy: InferenceRequest, routing: Routing) -> None:
        failed = False
        try:
            async for response in self.infer_stream(copy):
                failed = failed or response.error is not None
        except NereidError:
            failed = True
        routing.rollout.record(copy.model_version, time.monotonic_ns() - copy.arrival_ns, failed)

    def _start_shadow(self, copy: InferenceRequest, routing: Routing, primary: InferenceResponse) -> None:
        """A request's copy to the candidate, sent once the primary has answered the client (so the primary never
        waits on its copy), its answer compared with the primary's and never sent anywhere. Shed first when the
        candidate is backed up."""
        mv = self._shadow_target(copy, routing, decoupled=False)
        if mv is None:
            return
        copy.arrival_ns = time.monotonic_ns()
        pair = ShadowPair(routing.rollout, self._comparisons)
        pair.primary_answered(primary)
        try:
            mv.validator.validate(copy)
        except NereidError:
            routing.rollout.record(mv.version_str, 0, True)
            return
        self._request_started(mv)
        copy.respond = _Ending(self, mv, copy.arrival_ns, None, pair.shadow_answered, None, Routing(routing.rollout, None))
        try:
            mv.scheduler.submit(copy)  # type: ignore[union-attr]
        except BaseException:
            self._request_ended(mv)
            raise

    def _start_trace(self, mv: ModelVersion, request: InferenceRequest) -> RequestTrace | None:
        given = request.trace
        held = given if type(given) is FrontendTrace else None
        if type(given) is TraceParent:  # a BLS request: traced under its caller's trace or not at all
            trace = self.tracer.start_child(given.parent, mv.name, request.id) if given.parent is not None else None
        else:
            trace = self.tracer.start(mv.name, request.id, request.trace_context)
        request.trace = trace
        if trace is None:
            return None
        if held is not None:  # the frontend's stamps come first; it releases the trace after sending
            trace.stamps += held.stamps
            held.trace = trace
            trace.waiting += 1
        trace.stamp("REQUEST_START", request.arrival_ns)
        trace.stamp("QUEUE_START")
        if trace.tensors:
            for tensor in request.inputs:
                trace.tensor("TENSOR_QUEUE_INPUT", tensor.name, tensor.datatype, tensor.shape, tensor.data)
        if request.report_compute is None:
            request.report_compute = trace.report_compute
        return trace

    def _request_started(self, mv: ModelVersion) -> None:
        """A request in flight from here: stop() drains it, and eviction leaves its version alone until it is
        answered."""
        if not self._inflight:
            self._idle.clear()  # only as the server stops being idle: Event.clear is a Python call
        self._inflight += 1
        self.polling.request_started()
        mv.inflight += 1
        mv.requests += 1
        mv.last_used = _monotonic()

    def _request_ended(self, mv: ModelVersion) -> None:
        mv.inflight -= 1
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()
        self.polling.request_ended()

    async def _schedule(self, mv: ModelVersion, request: InferenceRequest) -> InferenceResponse:
        future: asyncio.Future[InferenceResponse] = asyncio.get_running_loop().create_future()
        request.respond = partial(_settle, future)
        mv.scheduler.submit(request)  # type: ignore[union-attr]
        try:
            return await future
        except asyncio.CancelledError:
            request.cancelled = True
            raise

    async def _infer_cached(self, mv: ModelVersion, request: InferenceRequest, cache: ResponseCache) -> InferenceResponse:
        """A hit skips the scheduler entirely; a miss executes, then stores the outputs."""
        start = time.monotonic_ns()
        key = cache_key(request)
        blob = await cache.get(key)
        stats = mv.stats
        if blob is not None:
            outputs = decode_outputs(blob)
            now = time.monotonic_ns()
            stats.cache_hit.add(now - start)
            stats.record_success(now - request.arrival_ns, 0)
            return InferenceResponse(request.model_name, request.model_version, request.id, outputs)
        lookup_ns = time.monotonic_ns() - start
        response = await self._schedule(mv, request)
        if response.error is None:
            insert_start = time.monotonic_ns()
            await cache.put(key, encode_outputs(response.outputs))
            stats.cache_miss.add(lookup_ns + time.monotonic_ns() - insert_start)
        return response

    def _apply_output_options(self, mv: ModelVersion, outputs: list[RequestedOutput], response: InferenceResponse) -> None:
        """The per-output extensions that are not wire formats: classification and shared-memory outputs."""
        options = {o.name: o.parameters for o in outputs if o.parameters}
        if not options:
            return
        for i, output in enumerate(response.outputs):
            params = options.get(output.name)
            if not params:
                continue
            k = params.get("classification")
            if k:
                output = response.outputs[i] = classify(
                    output, int(k), mv.labels.get(output.name) or output.labels or [], mv.config.max_batch_size > 0
                )
            if params.get("shared_memory_region"):
                self.shared_memory.write_output(output, params)

    def infer_stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """Every response of a request, decoupled or not; the last one has final=True. Errors of a decoupled model
        arrive as responses carrying `error`; errors before execution raise. The same lifecycle as `infer`, with an
        ending after the last response."""
        held = self.shared_memory.hold(request)
        responses = self._responses(request)
        return _releasing(responses, self.shared_memory, held) if held else responses

    async def _responses(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        routing = self._route(request) if self.rollouts.routing and not request.model_version else None
        mv = await self._version(request)
        if not mv.decoupled:
            response = await self._infer_on(mv, request, routing)
            if response.error is not None:
                raise response.error
            yield response
            return
        queue: asyncio.Queue[InferenceResponse] = asyncio.Queue()
        trace = self._admit(mv, request, "")
        request.respond = queue.put_nowait
        ended_well = False
        try:
            mv.scheduler.submit(request)  # type: ignore[union-attr]
            if routing is not None and routing.shadow is not None:
                self._start_stream_shadow(request, routing)
            first = True
            while True:
                response = await queue.get()
                if first:
                    first = False
                    mv.stats.record_first_response(time.monotonic_ns() - request.arrival_ns)
                    if trace is not None and not trace.parent_id:
                        trace.stamp("INFER_RESPONSE_COMPLETE")  # Triton's trace has it once, for the first
                if trace is not None and trace.tensors and response.error is None:
                    for output in response.outputs:
                        trace.tensor("TENSOR_BACKEND_OUTPUT", output.name, output.datatype, output.shape, output.data)
                if response.final:
                    ended_well = response.error is None
                response.decoupled = True
                yield response
                if response.final:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            request.cancelled = True
            raise
        finally:
            self._request_ended(mv)
            if routing is not None:
                routing.rollout.record(mv.version_str, time.monotonic_ns() - request.arrival_ns, not ended_well)
            if trace is not None:
                if trace.computed or not ended_well:
                    self.tracer.finish(trace, mv.version_str)
                else:  # responses sent from inside execute(): its compute times are still to come
                    trace.on_computed = partial(self.tracer.finish, trace, mv.version_str)
