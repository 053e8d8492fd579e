"""The ingress's server: what Nereid's HTTP/gRPC frontends call on a `Server`, answered over deployment handles
by the model replicas. Inference goes to the replica Serve's multiplexing picks for the model; calls that
concern every replica (statistics, index, load/unload, readiness) go to each and are merged as one Triton would
answer. It holds no model: configs it caches only to decode requests and answer metadata."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from nereid import __version__
from nereid.config.model_config import mc
from nereid.core.admission import InflightLimit
from nereid.core.errors import NereidError, Status
from nereid.core.request_memory import RequestMemoryBudget
from nereid.core.settings import ServerSettings
from nereid.core.shared_memory import SharedMemoryRegistry
from nereid.core.trace_settings import TraceSettings
from nereid.core.tracing import Tracer
from nereid.core.types import InferenceRequest, InferenceResponse, RequestedOutput
from nereid.ray.aggregate import merge_index, merge_statistics
from nereid.ray.replica import replica_address
from nereid.ray.rollouts import ReplicaVersions, SharedRollouts
from nereid.ray.wire import PackedRequest, pack_request, unpack_error, unpack_response
from nereid.rollouts.controller import Routing
from nereid.rollouts.shadow import ShadowComparisons, ShadowPair
from nereid.rollouts.steps import parse_steps
from nereid.server.base import ServerBase
from nereid.server.in_process import EXTENSIONS

__all__ = ["RemoteModel", "RemoteServer"]

log = logging.getLogger("nereid.ray")

T = TypeVar("T")

# A control-plane call the frontends make synchronously (metadata, statistics, index) waits at most this long.
_SYNC_TIMEOUT_SECS = 15.0
# After a cold start, the replica that loaded the model takes its requests for this long: Serve's routers learn
# where a model is from the controller a moment later, and would meanwhile load it a second time elsewhere.
_AFFINITY_SECS = 3.0
# How often a request is sent when the replica it went to dies under it.
_TRIES_ON_REPLICA_LOSS = 3
# An addressed call that Serve routed to another replica (its own was busy) is tried again this many times.
_ADDRESS_TRIES = 4
# Shadow copies are shed first: none goes to a model with this many copies in flight from this ingress.
_SHADOW_BACKLOG = 16


@dataclass(slots=True)
class RemoteModel:
    """A model version as the frontends see it (ServedModel), described by the replica that loaded it."""

    name: str
    version_str: str
    decoupled: bool
    config: Any
    metadata: dict[str, Any]
    config_json: dict[str, Any]
    validator: Any = None
    scheduler: Any = None
    inflight: int = 0


class _NoRepository:
    """The ingress holds no models: the OpenAI listing and the dashboard see none here."""

    def ready_versions(self) -> list[Any]:
        return []


def _replica_lost(exc: BaseException) -> bool:
    from ray.exceptions import ActorUnavailableError, RayActorError

    return isinstance(exc, RayActorError | ActorUnavailableError)


# The requested-output parameters that name a client's shared-memory region: the region is registered at this
# ingress, so the ingress writes the output there and the replica must not see them.
_SHM_KEYS = frozenset({"shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"})


def _outputs_for_shared_memory(request: InferenceRequest) -> dict[str, dict[str, Any]]:
    """Take the shared-memory parameters off the request's requested outputs (the output is still asked for,
    with its other options, such as classification) and return them by output name; none: an empty dict."""
    if not request.outputs:
        return {}
    into: dict[str, dict[str, Any]] = {}
    for i, output in enumerate(request.outputs):
        if output.parameters.get("shared_memory_region"):
            into[output.name] = output.parameters
            kept = {k: v for k, v in output.parameters.items() if k not in _SHM_KEYS}
            request.outputs[i] = RequestedOutput(output.name, kept)
    return into


def _remote_error(exc: BaseException) -> NereidError:
    """A replica (or its node) that died under a request, or a handle that found no replica, as Triton's
    UNAVAILABLE: the client may retry, and the next attempt goes to a live replica."""
    return NereidError.unavailable(f"model replica unavailable: {type(exc).__name__}: {exc}")


class RemoteServer(ServerBase):
    """Duck-types the in-process Server for the frontends (see nereid.server.in_process.Server)."""

    def __init__(self, settings: ServerSettings, replicas: Any, directory: Any) -> None:
        self.settings = settings
        self.replicas = replicas  # DeploymentHandle of the replica deployment
        self.directory = directory  # DeploymentHandle of the replica directory
        self.shared_memory = SharedMemoryRegistry(settings.allow_client_shm)
        self.inflight = InflightLimit(settings.limits.max_inflight_requests)
        # --request-memory-limit: what requests hold while they arrive and are decoded, on every port
        self.request_memory = RequestMemoryBudget(settings.limits.request_memory_limit)
        self.trace_settings = TraceSettings(settings.trace_config)
        self.tracer = Tracer(self.trace_settings)
        self.cache = None
        self.repository = _NoRepository()
        self.loads_on_demand = True  # every model of the repository is a request away on some replica
        self.live = False
        self.models: dict[tuple[str, str], RemoteModel] = {}
        self.affinity: dict[str, tuple[str, float]] = {}  # model -> (replica ID, until when, monotonic)
        self.node_ip = settings.http_address
        # Rollouts: this ingress chooses the version of requests naming none, for every replica (ray/rollouts.py).
        self.versions = ReplicaVersions(self)
        self.rollouts = SharedRollouts(self.versions, directory, settings.rollout_state_file)
        self._comparisons = ShadowComparisons()
        self._shadows: dict[str, int] = {}  # model -> shadow copies in flight from here
        self._shadow_tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle -----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.live = True
        self.rollouts.restore()
        self.rollouts.start()

    async def stop(self) -> None:
        await self.rollouts.close()
        for task in list(self._shadow_tasks):
            task.cancel()
        self._comparisons.close()
        self.shared_memory.unregister()
        self.tracer.close()
        self.live = False

    def ready(self) -> bool:
        """Ready once some replica is alive to take requests."""
        if not self.live:
            return False
        try:
            return bool(self._blocking(self._replica_ids()))
        except NereidError:
            return False

    def metadata(self) -> dict[str, Any]:
        return {"name": self.settings.server_id, "version": __version__, "extensions": EXTENSIONS}

    # -- calling replicas ----------------------------------------------------------------------------------------
    def _blocking(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a handle call to its end from a synchronous frontend method. The handles' router runs on a loop of
        its own, so the frontend's loop waiting here cannot stall the call; only control-plane calls come here."""
        result: list[Any] = []

        async def run() -> None:
            result.append(await coroutine)

        future = asyncio.run_coroutine_threadsafe(run(), _background_loop())
        try:
            future.result(_SYNC_TIMEOUT_SECS)
        except TimeoutError:
            raise NereidError.unavailable("the model replicas did not answer in time") from None
        return result[0]

    async def _replica_ids(self) -> dict[str, str]:
        try:
            return await self.directory.replicas.remote()
        except Exception as exc:
            raise _remote_error(exc) from None

    async def each_replica(self, what: str, *args: Any, node_ip: str = "") -> dict[str, tuple[str, Any]]:
        """Call every live replica (or every one on `node_ip`): replica ID -> ("ok" | "error", value). A replica
        that dies meanwhile is left out, as it has left the deployment."""
        known = await self._replica_ids()
        pending = {rid for rid, node in known.items() if not node_ip or node == node_ip}
        answers: dict[str, tuple[str, Any]] = {}
        for _ in range(_ADDRESS_TRIES):
            if not pending:
                break
            calls = [
                self.replicas.options(multiplexed_model_id=replica_address(rid)).call.remote(what, *args)
                for rid in pending
            ]
            for call in calls:
                try:
                    who, status, value = await call
                except Exception as exc:
                    log.debug("a replica left during '%s': %s", what, exc)
                    continue
                if who in pending:
                    answers[who] = (status, value)
                    pending.discard(who)
        return answers

    async def _first_ok(self, what: str, *args: Any) -> list[Any]:
        answers = await self.each_replica(what, *args)
        errors = [value for status, value in answers.values() if status == "error"]
        if errors and len(errors) == len(answers):
            raise unpack_error(errors[0])
        return [value for status, value in answers.values() if status == "ok"]

    # -- models --------------------------------------------------------------------------------------------------
    def model(self, name: str, version: str = "") -> RemoteModel:
        try:
            return self.models[(name, version)]
        except KeyError:
            raise NereidError.unavailable(f"Request for unknown model: '{name}' is not found") from None

    def _route(self, model: str) -> str:
        """The multiplexed model ID a request for `model` goes with: the model's own, or the address of the
        replica that has just loaded it (see _AFFINITY_SECS)."""
        pinned = self.affinity.get(model)
        if pinned is not None:
            if time.monotonic() < pinned[1]:
                return replica_address(pinned[0])
            del self.affinity[model]
        return model

    async def _describe(self, name: str, version: str, load: bool) -> RemoteModel:
        """Asked of a replica that holds the model where there is one (this node's first), else of the replica
        Serve's multiplexing picks, which loads it (a cold start goes to a replica with the fewest models)."""
        route = name
        try:
            holders = await self.directory.holders.remote(name)
            if holders:
                local = [rid for rid, node in holders.items() if node == self.node_ip]
                route = replica_address((local or sorted(holders))[0])
            status, value = await self.replicas.options(multiplexed_model_id=route).describe.remote(name, version, load)
        except Exception as exc:
            raise _remote_error(exc) from None
        if status == "error":
            raise unpack_error(value)
        described = self._remember(name, version, value)
        if load:
            self.affinity[name] = (value["replica"], time.monotonic() + _AFFINITY_SECS)
        return described

    async def wait_model(self, name: str, version: str = "") -> RemoteModel:
        """The model's description, loading it on a replica first where none holds it. Every /infer and generate
        asks this before decoding; once described, the cached description answers without a round trip (a replica
        that no longer holds the model loads it on demand when the request reaches it), and no request renews the
        cold start's affinity, so Serve's router spreads the model over every replica holding it."""
        cached = self.models.get((name, version))
        if cached is not None:
            return cached
        return await self._describe(name, version, load=True)

    def model_ready(self, name: str, version: str = "") -> bool:
        return any(self._blocking(self._first_ok("ready", name, version)))

    async def model_is_ready(self, name: str, version: str = "") -> bool:
        return any(await self._first_ok("ready", name, version))

    def _described(self, name: str, version: str) -> RemoteModel:
        """The cached description, or one from any replica holding the model (none holding it: the error a
        single server gives for a model it has not loaded)."""
        cached = self.models.get((name, version))
        if cached is not None:
            return cached
        found = self._blocking(self._first_ok("describe", name, version))
        if not found:
            raise NereidError.unavailable(f"no model replica is alive to describe '{name}'")
        return self._remember(name, version, found[0])

    def _remember(self, name: str, version: str, value: dict[str, Any]) -> RemoteModel:
        config = mc.ModelConfig()
        config.ParseFromString(value["config"])
        described = RemoteModel(
            name, value["version"], value["decoupled"], config, value["metadata"], value["config_json"]
        )
        self.models[(name, version)] = described
        return described

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        return self._described(name, version).metadata

    def model_config(self, name: str, version: str = "") -> Any:
        return self._described(name, version).config

    def model_config_json(self, name: str, version: str = "") -> dict[str, Any]:
        return self._described(name, version).config_json

    def statistics(self, name: str = "", version: str = "") -> list[dict[str, Any]]:
        """Every replica's statistics of the model (of every model), summed per version as one server's."""
        answers = self._blocking(self.each_replica("statistics", name, version))
        found = [value for status, value in answers.values() if status == "ok"]
        if not found and name:
            errors = [value for status, value in answers.values() if status == "error"]
            if errors:
                raise unpack_error(errors[0])
        return merge_statistics(found)

    def custom_metric_families(self) -> list[Any]:
        return []  # the node's metrics endpoint gathers the replicas' own

    # -- repository ----------------------------------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return merge_index(self._blocking(self._first_ok("index", ready_only)), ready_only)

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Load (or reload) where the model is resident, or on the replica Serve's multiplexing picks for it
        when none holds it; the ingress's cached description is replaced."""
        for key in [key for key in self.models if key[0] == name]:
            del self.models[key]
        answers = await self.each_replica("where")
        holders = [rid for rid, (status, value) in answers.items() if status == "ok" and name in value["models"]]
        if holders:
            results = []
            for rid in holders:
                handle = self.replicas.options(multiplexed_model_id=replica_address(rid))
                try:
                    results.append(await handle.call.remote("load", name, parameters))
                except Exception as exc:
                    raise _remote_error(exc) from None
        else:
            try:
                results = [await self.replicas.options(multiplexed_model_id=name).call.remote("load", name, parameters)]
            except Exception as exc:
                raise _remote_error(exc) from None
        for _, status, value in results:
            if status == "error":
                raise unpack_error(value)

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Unload from every replica; the first refusal is the answer."""
        for key in [key for key in self.models if key[0] == name]:
            del self.models[key]
        answers = await self.each_replica("unload", name, parameters)
        for status, value in answers.values():
            if status == "error":
                raise unpack_error(value)

    # -- rollouts (the in-process Server's contract, over every replica) ----------------------------------------
    async def start_rollout(self, model: str, version: str, steps: str, sticky_key: str = "") -> dict[str, Any]:
        """Start moving `version` of `model` through `steps` on every replica, the model loaded first where no
        replica holds it (its versions are then known), the candidate beside the primary; its status."""
        parse_steps(steps)  # a malformed step is refused before anything loads
        try:
            await self.wait_model(model)
        except NereidError:
            pass  # the rollout's own refusal names what is missing
        await self.versions.refresh(model)
        await self.rollouts.begin(model, version, steps, sticky_key)
        return self.rollouts.status(model)

    def rollout_status(self, model: str = "") -> dict[str, Any]:
        return self.rollouts.report(model)

    async def rollout_action(self, model: str, action: str) -> dict[str, Any]:
        await self.rollouts.act(model, action)
        return self.rollouts.status(model)

    def rollout_history(self, model: str) -> dict[str, Any]:
        return self.rollouts.history_report(model)

    def _routed(self, request: InferenceRequest) -> Routing | None:
        """A request naming no version of a model under a rollout names the version the rollout chooses, so that
        whichever replica serves it serves the split alike (every replica holds the rollout's versions)."""
        rollout = self.rollouts.routing.get(request.model_name)
        if rollout is None:
            return None
        route, routing = self.rollouts.route(rollout, request.parameters)
        request.model_version = route.version
        return routing

    def _start_shadow(self, packed: PackedRequest, routing: Routing) -> ShadowPair | None:
        """A copy of the request to the candidate, whose answer is compared with the primary's and never reaches
        the client; shed when this ingress has too many copies of the model in flight."""
        model, version = packed[0], routing.shadow or ""
        if self._shadows.get(model, 0) >= _SHADOW_BACKLOG:
            self.rollouts.shadows_shed += 1
            return None
        pair = ShadowPair(routing.rollout, self._comparisons)
        self._shadows[model] = self._shadows.get(model, 0) + 1
        task = asyncio.get_running_loop().create_task(self._shadow(model, (model, version, *packed[2:]), routing, pair))
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)
        return pair

    async def _shadow(self, model: str, packed: PackedRequest, routing: Routing, pair: ShadowPair) -> None:
        started = time.monotonic_ns()
        try:
            response = await self._forward(model, packed, 0)
        except NereidError as exc:
            response = InferenceResponse(model, packed[1], packed[2], error=exc)
        finally:
            self._shadows[model] -= 1
        routing.rollout.record(packed[1], time.monotonic_ns() - started, response.error is not None)
        pair.shadow_answered(response)

    # -- inference -----------------------------------------------------------------------------------------------
    def submit(self, request: InferenceRequest, done: Callable[[InferenceResponse], None]) -> bool:
        return False  # every request takes the coroutine path (infer)

    def _write_shared_memory(self, response: InferenceResponse, into: dict[str, dict[str, Any]]) -> InferenceResponse:
        """The replica's outputs copied into the client's regions, as one server does after execution (an output
        that does not fit fails the response with Triton's error)."""
        try:
            for output in response.outputs:
                params = into.get(output.name)
                if params is not None:
                    self.shared_memory.write_output(output, params)
        except NereidError as exc:
            return InferenceResponse(response.model_name, response.model_version, response.id, error=exc,
                                     final=response.final)  # fmt: skip
        return response

    async def infer(self, request: InferenceRequest, *, raise_error: bool = True) -> InferenceResponse:
        into_shm = _outputs_for_shared_memory(request)
        routing = self._routed(request) if self.rollouts.routing and not request.model_version else None
        packed = pack_request(request)
        if routing is None:
            response = await self._forward(request.model_name, packed, request.correlation_id)
        else:
            started = time.monotonic_ns()
            try:
                response = await self._forward(request.model_name, packed, request.correlation_id)
            except NereidError as exc:
                if exc.status is not Status.INVALID_ARG:  # a request the client got wrong says nothing of a version
                    routing.rollout.record(request.model_version, time.monotonic_ns() - started, True)
                raise
            routing.rollout.record(request.model_version, time.monotonic_ns() - started, response.error is not None)
            if routing.shadow is not None:  # the copy goes once the primary has answered: never in its way
                pair = self._start_shadow(packed, routing)
                if pair is not None:
                    pair.primary_answered(response)
        if into_shm and response.error is None:
            response = self._write_shared_memory(response, into_shm)
        if response.error is not None and raise_error:
            raise response.error
        return response

    async def _forward(self, model: str, packed: PackedRequest, correlation_id: int | str) -> InferenceResponse:
        """A packed request to the replica Serve's multiplexing picks for its model; the replica's refusal raises."""
        for attempt in range(_TRIES_ON_REPLICA_LOSS):
            handle = self.replicas.options(multiplexed_model_id=self._route(model))
            try:
                status, value = await handle.infer.remote(packed)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # A replica that died under the request (its node went): a request outside a sequence is tried
                # again once the router can see another replica; a sequence's state died with the replica.
                if attempt + 1 < _TRIES_ON_REPLICA_LOSS and not correlation_id and _replica_lost(exc):
                    self.affinity.pop(model, None)
                    await asyncio.sleep(0.25 * (attempt + 1))
                    continue
                raise _remote_error(exc) from None
        if status == "error":
            raise unpack_error(value)
        return unpack_response(value)

    async def infer_stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """Every response of a request; under a rollout, split as `infer` is (no shadow copy: a stream's
        responses are not compared), its outcome counted when the stream ends."""
        into_shm = _outputs_for_shared_memory(request)
        routing = self._routed(request) if self.rollouts.routing and not request.model_version else None
        handle = self.replicas.options(multiplexed_model_id=self._route(request.model_name), stream=True)
        stream = handle.infer_stream.remote(pack_request(request))
        started, ended_well, counted = time.monotonic_ns(), False, routing is not None
        try:
            async for status, value in stream:
                if status == "error":
                    error = unpack_error(value)
                    counted = counted and error.status is not Status.INVALID_ARG
                    raise error
                response = unpack_response(value)
                if response.final:
                    ended_well = response.error is None
                if into_shm and response.error is None and response.outputs:
                    response = self._write_shared_memory(response, into_shm)
                yield response
        except (NereidError, asyncio.CancelledError, GeneratorExit):
            stream.cancel()
            raise
        except Exception as exc:
            raise _remote_error(exc) from None
        finally:
            if routing is not None and counted:
                routing.rollout.record(request.model_version, time.monotonic_ns() - started, not ended_well)


_LOOP: asyncio.AbstractEventLoop | None = None


def _background_loop() -> asyncio.AbstractEventLoop:
    """A loop on a thread of its own for the synchronous control-plane calls (started once per process)."""
    global _LOOP
    if _LOOP is None:
        import threading

        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="nereid-ray-sync", daemon=True).start()
        _LOOP = loop
    return _LOOP
