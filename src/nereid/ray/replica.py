"""A model replica of the Serve deployment: one Nereid `Server` loading models on demand under its memory budget,
multiplexed by model name. It answers the ingress's calls over deployment handles and must not open any port:
the ingress is the only door clients use."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import ray
from prometheus_client.core import Metric
from ray import serve

from nereid.config.model_config import config_to_json_dict
from nereid.core.errors import NereidError
from nereid.core.settings import ServerSettings
from nereid.metrics import TritonMetricsCollector
from nereid.ray.directory import NO_RELOAD_SECS
from nereid.ray.wire import PackedRequest, pack_error, pack_response, unpack_request
from nereid.server import Server

__all__ = ["NereidReplica", "PackedFamily", "replica_address", "REPLICA_ADDRESS_PREFIX"]

log = logging.getLogger("nereid.ray")

# A multiplexed model ID that names one replica, so a call can reach every replica in turn (statistics, index,
# load/unload, metrics). A model name is a folder name and never holds "/", so no model can take one of these.
REPLICA_ADDRESS_PREFIX = "/replica/"

# How often a replica tells the directory it is alive, and brings Serve's view of its models in line with Nereid's.
HEARTBEAT_SECS = 0.5

PackedFamily = tuple[str, str, str, list[tuple[str, dict[str, str], float]]]  # name, help, type, samples


def replica_address(replica_id: str) -> str:
    return REPLICA_ADDRESS_PREFIX + replica_id


class NereidReplica:
    """The deployment's class; `nereid.ray.app` wraps it with serve.deployment and its options."""

    async def __init__(self, settings: ServerSettings, directory: Any) -> None:  # type: ignore[misc]  # Serve awaits it
        context = serve.get_replica_context()
        self.replica_id: str = context.replica_id.unique_id
        self.address = replica_address(self.replica_id)
        self.node_ip: str = ray.util.get_node_ip_address()
        self.directory = directory
        self.server = Server(settings)
        await self._hold_as_rollouts_do()
        await self.server.start()
        self.collector = TritonMetricsCollector(self.server)
        self.loading: set[str] = set()  # models a request is loading here now
        self.dropped: dict[str, float] = {}  # model -> when this replica last dropped it (evicted, unloaded)
        self._model_queue_seen: dict[str, tuple[int, int]] = {}  # model -> (requests, queue ns) at the last beat
        self._queue_seen = (0, 0)  # (requests, queue ns) at the last autoscaling report
        await self._multiplexed(self.address)  # the replica's own address, so addressed calls find it
        self._beat = asyncio.get_running_loop().create_task(self._heartbeat())
        log.info("replica %s on %s is ready", self.replica_id, self.node_ip)

    async def _hold_as_rollouts_do(self) -> None:
        """The versions the ingresses' rollouts hold (the directory keeps them): a replica that starts during a
        rollout loads the candidate beside the primary as the others do, whatever the version policy says."""
        try:
            holds = await asyncio.wait_for(self.directory.rollout_holds.remote(), HEARTBEAT_SECS * 20)
        except Exception as exc:  # no directory yet: the ingress pushes holds to every live replica anyway
            log.debug("rollout holds not read from the directory: %s", exc)
            return
        for model, (versions, pin) in holds.items():
            self.server.repository.hold_versions(model, versions, pin)

    # -- placement ---------------------------------------------------------------------------------------------
    @serve.multiplexed(max_num_models_per_replica=-1)
    async def _multiplexed(self, model_id: str) -> str:
        """Serve's multiplexing keeps the IDs a replica holds, so the router sends a model's requests where it is
        loaded. No count limit: Nereid's memory budget decides what stays resident and evicts what must go."""
        if model_id != self.address:
            self.loading.add(model_id)
            try:
                await self.server.wait_model(model_id)
            finally:
                self.loading.discard(model_id)
        return model_id

    def _reconcile(self) -> None:
        """Serve's list of this replica's models follows Nereid's residency: an eviction or an unload drops the
        ID, a load through the repository API adds it. Serve offers no public call for this, so the multiplex
        wrapper's own table is edited and marked for the next push to the controller."""
        wrapper = getattr(self, "__serve_multiplex_wrapper", None)
        if wrapper is None:
            return
        resident = {mv.name for mv in self.server.repository.ready_versions()} | {self.address}
        held = set(wrapper.models)
        if held == resident:
            return
        now = time.monotonic()
        for gone in held - resident:
            wrapper.models.pop(gone, None)
            self.dropped[gone] = now
        for new in resident - held:
            wrapper.models[new] = new
        wrapper._push_multiplexed_replica_info = True

    async def _heartbeat(self) -> None:
        while True:
            try:
                self._reconcile()
                models = sorted({mv.name for mv in self.server.repository.ready_versions()} | self.loading)
                now = time.monotonic()
                dropped = [m for m, at in self.dropped.items() if now - at < NO_RELOAD_SECS]
                call = self.directory.heartbeat.remote(
                    self.replica_id, self.node_ip, models, self._model_queues(), dropped
                )
                for hot in await asyncio.wait_for(call, HEARTBEAT_SECS * 4):
                    # A hot model whose holders all queue: this replica loads it too, and Serve's multiplexing
                    # then spreads its requests over one more replica.
                    log.info("replica %s takes a copy of the hot model '%s'", self.replica_id, hot)
                    asyncio.get_running_loop().create_task(self._take_copy(hot))
            except Exception as exc:  # the directory may be restarting elsewhere; the next beat finds it
                log.debug("heartbeat failed: %s", exc)
            await asyncio.sleep(HEARTBEAT_SECS)

    async def _take_copy(self, model: str) -> None:
        try:
            await self._multiplexed(model)
        except NereidError as exc:
            log.warning("replica %s could not take a copy of '%s': %s", self.replica_id, model, exc.message)

    def _model_queues(self) -> dict[str, float]:
        """Per model, the mean queue time (us) of the requests this replica finished since the last beat."""
        means: dict[str, float] = {}
        for mv in self.server.repository.ready_versions():
            queue = mv.stats.as_dict()["inference_stats"]["queue"]
            count, ns = self._model_queue_seen.get(mv.name, (0, 0))
            self._model_queue_seen[mv.name] = (queue["count"], queue["ns"])
            if queue["count"] > count:
                means[mv.name] = (queue["ns"] - ns) / (queue["count"] - count) / 1000
        return means

    # -- inference ---------------------------------------------------------------------------------------------
    async def infer(self, packed: PackedRequest) -> tuple[str, Any]:
        request = unpack_request(packed)
        try:
            await self._multiplexed(request.model_name)
            response = await self.server.infer(request, raise_error=False)
        except NereidError as exc:
            return ("error", pack_error(exc))
        return ("ok", pack_response(response))

    async def infer_stream(self, packed: PackedRequest) -> AsyncIterator[tuple[str, Any]]:
        request = unpack_request(packed)
        try:
            await self._multiplexed(request.model_name)
            async for response in self.server.infer_stream(request):
                yield ("ok", pack_response(response))
        except NereidError as exc:
            yield ("error", pack_error(exc))

    async def describe(self, name: str, version: str, load: bool) -> tuple[str, Any]:
        """What the ingress needs to decode requests and answer metadata/config: the version's config (as
        serialized protobuf), its metadata, decoupled flag and version. `load`: load it on demand first."""
        try:
            if load:
                await self._multiplexed(name)
                await self.server.wait_model(name, version)
            return ("ok", self._description(name, version))
        except NereidError as exc:
            return ("error", pack_error(exc))

    def _description(self, name: str, version: str) -> dict[str, Any]:
        mv = self.server.model(name, version)
        return {
            "replica": self.replica_id,
            "version": mv.version_str,
            "decoupled": mv.decoupled,
            "config": mv.config.SerializeToString(),
            "metadata": self.server.model_metadata(name, version),
            "config_json": config_to_json_dict(mv.config),
        }

    # -- calls addressed to each replica -------------------------------------------------------------------------
    async def call(self, what: str, *args: Any) -> tuple[str, str, Any]:
        """One replica's part of a call that concerns all of them: (this replica's ID, "ok" or "error", value).
        The ID lets the caller tell which replica answered: Serve may route an addressed call elsewhere when
        its replica is busy past the matching timeout."""
        server = self.server
        try:
            if what == "statistics":
                value: Any = server.statistics(*args)
            elif what == "index":
                value = server.repository_index(*args)
            elif what == "ready":
                value = await server.model_is_ready(*args)
            elif what == "load":
                await server.load_model(*args)
                self._reconcile()
                value = None
            elif what == "unload":
                await server.unload_model(*args)
                self._reconcile()
                value = None
            elif what == "metrics":
                value = self._metric_families()
            elif what == "describe":
                value = self._description(*args)
            elif what == "hold":
                value = await self._hold(*args)
            elif what == "versions":
                value = self._versions(*args)
            elif what == "where":
                value = {
                    "node_ip": self.node_ip,
                    "models": sorted(mv.name for mv in server.repository.ready_versions()),
                }
            else:
                raise NereidError.invalid(f"unknown replica call '{what}'")
        except NereidError as exc:
            return (self.replica_id, "error", pack_error(exc))
        return (self.replica_id, "ok", value)

    async def _hold(self, model: str, versions: list[str], pin: bool, apply: bool) -> list[str]:
        """A rollout's versions held here beside the version policy's (`pin`: never evicted meanwhile); with
        `apply`, loaded or retired now where the model is loaded (a replica without it loads them with it). The
        model's ready versions after."""
        repository = self.server.repository
        repository.hold_versions(model, versions, pin)
        if apply and any(mv.name == model for mv in repository.ready_versions()):
            await repository.apply_held(model)
            self._reconcile()
        return self._versions(model)["ready"]

    def _versions(self, model: str) -> dict[str, Any]:
        """What the ingress's rollouts need of a model here: its ready versions, the one that takes requests naming
        no version, its version folders, and its config's parameters (the rollout objectives)."""
        repository = self.server.repository
        default = repository.find_any(model, "")
        parameters = {} if default is None else {k: v.string_value for k, v in default.config.parameters.items()}
        return {
            "ready": sorted((mv.version_str for mv in repository.ready_versions() if mv.name == model), key=int),
            "default": default.version_str if default is not None else None,
            "folders": [str(v) for v in repository.version_folders(model)],
            "parameters": parameters,
        }

    def _metric_families(self) -> list[PackedFamily]:
        families: list[PackedFamily] = []
        for metric in self.collector.collect():
            family: Metric = metric
            samples = [(s.name, {**s.labels, "replica": self.replica_id}, float(s.value)) for s in family.samples]
            families.append((family.name, family.documentation, family.type, samples))
        return families

    # -- autoscaling -------------------------------------------------------------------------------------------
    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics: the mean queue time of the requests this replica finished since
        the last report (Triton's queue duration), and the requests it holds now."""
        requests = queue_ns = 0
        for mv in self.server.repository.ready_versions():
            queue = mv.stats.as_dict()["inference_stats"]["queue"]
            requests += queue["count"]
            queue_ns += queue["ns"]
        seen_requests, seen_ns = self._queue_seen
        self._queue_seen = (requests, queue_ns)
        finished = requests - seen_requests
        mean_us = (queue_ns - seen_ns) / finished / 1000 if finished > 0 else 0.0
        return {"queue_time_us": max(mean_us, 0.0), "inflight": float(self.server._inflight), "at": time.time()}

    async def check_health(self) -> None:
        if not self.server.live:
            raise RuntimeError("the Nereid server of this replica has stopped")

    async def __del__(self) -> None:
        self._beat.cancel()
        await self.server.stop()
