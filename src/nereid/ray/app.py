"""The Serve application of `nereid ray serve`: the replica directory, the model replicas (fixed count or
autoscaled on queue time) and the per-node ingress, with the options each deployment takes. It builds the
application; starting Ray and Serve is the CLI's work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from ray import serve
from ray.serve.deployment import Deployment

from nereid.core.settings import ServerSettings
from nereid.ray.directory import NereidDirectory
from nereid.ray.ingress import NereidIngress
from nereid.ray.replica import NereidReplica

__all__ = ["RayServeOptions", "build_application", "ingress_count_options", "replica_deployment_options"]

# Serve logs every call at INFO; heartbeats and addressed calls would drown the models' own lines.
_LOGGING = {"enable_access_log": False, "log_level": "WARNING"}
# The ingress follows the alive nodes (one per node): at most this many, which no cluster here comes near.
_MAX_INGRESS_NODES = 4096


@dataclass(slots=True)
class RayServeOptions:
    replica_settings: ServerSettings  # each replica's Server: loading on demand, its memory budget
    ingress_settings: ServerSettings  # the frontends on every node: ports, limits, restricted APIs
    num_replicas: int = 1
    min_replicas: int | None = None  # autoscaling when min/max are given
    max_replicas: int | None = None
    target_queue_time_us: float = 5000.0
    replicate_queue_time_us: float = 5000.0  # a model queueing longer on every holder gets one more (0: never)
    upscale_delay_s: float = 3.0
    downscale_delay_s: float = 30.0
    look_back_period_s: float = 5.0
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    # GPUs reserved next to each replica for vLLM's tensor/pipeline-parallel workers (model.json's
    # distributed_executor_backend "ray"): a placement group of the replica's CPU bundle and one bundle per GPU.
    placement_group_gpus: int = 0
    max_ongoing_requests: int = 256  # past this Serve queues at the handle; Nereid's own batcher queues below
    ingress_replicas: int = 0  # 0: one per alive node, following nodes that join or leave; N: exactly N
    nodes_alive: int = 1  # alive nodes at deployment: the ingress's first replica count when it follows them

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None


def replica_deployment_options(options: RayServeOptions) -> dict[str, Any]:
    """serve.deployment options of the model replicas."""
    deployment: dict[str, Any] = {
        "name": "NereidReplica",
        "logging_config": _LOGGING,
        "ray_actor_options": {"num_cpus": options.cpus_per_replica, "num_gpus": options.gpus_per_replica},
        "max_ongoing_requests": options.max_ongoing_requests,
        # A replica whose Server stopped, or whose node went, is replaced within seconds, not Serve's default 10.
        "health_check_period_s": 1.0,
        "health_check_timeout_s": 10.0,
        "graceful_shutdown_timeout_s": max(options.replica_settings.exit_timeout_secs, 1.0),
    }
    if options.placement_group_gpus:
        deployment["placement_group_bundles"] = [
            {"CPU": options.cpus_per_replica},
            *({"GPU": 1.0} for _ in range(options.placement_group_gpus)),
        ]
        deployment["placement_group_strategy"] = "PACK"  # one node where it fits: tensor parallelism wants NVLink
    if options.autoscaling:
        low = options.min_replicas if options.min_replicas is not None else 1
        high = options.max_replicas if options.max_replicas is not None else max(low, options.num_replicas)
        deployment["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": high,
            "initial_replicas": min(max(options.num_replicas, low), high),
            "upscale_delay_s": options.upscale_delay_s,
            "downscale_delay_s": options.downscale_delay_s,
            "look_back_period_s": options.look_back_period_s,
            "metrics_interval_s": options.look_back_period_s / 2,
            "policy": {
                "policy_function": "nereid.ray.autoscaling:QueueTimePolicy",
                "policy_kwargs": {"target_queue_time_us": options.target_queue_time_us},
            },
        }
    else:
        deployment["num_replicas"] = options.num_replicas
    return deployment


def build_application(options: RayServeOptions) -> Any:
    directory = _deployment(NereidDirectory, name="NereidDirectory", num_replicas=1, ray_actor_options={"num_cpus": 0},
                            health_check_period_s=1.0, logging_config=_LOGGING).bind(options.replicate_queue_time_us)  # fmt: skip
    replicas = _deployment(NereidReplica, **replica_deployment_options(options)).bind(
        options.replica_settings, directory
    )
    ingress = _deployment(
        NereidIngress,
        name="NereidIngress",
        **ingress_count_options(options),
        max_replicas_per_node=1,  # its ports are the node's: two on one node would collide
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=10_000,  # only requests through Serve's proxy count here; the frontends' own do not
        health_check_period_s=1.0,
        logging_config=_LOGGING,
    )
    return ingress.bind(options.ingress_settings, replicas, directory)


def ingress_count_options(options: RayServeOptions) -> dict[str, Any]:
    """A fixed ingress count, or one per alive node through the OnePerNodePolicy (Serve starts an ingress on a node
    that joins within about a second, and drops the one of a node that left)."""
    if options.ingress_replicas:
        return {"num_replicas": options.ingress_replicas}
    nodes = max(1, options.nodes_alive)
    return {
        "autoscaling_config": {
            "min_replicas": 1,
            "max_replicas": max(_MAX_INGRESS_NODES, nodes),
            "initial_replicas": nodes,
            "upscale_delay_s": 1.0,
            "downscale_delay_s": 5.0,  # a node's ingress that died with it is not started again meanwhile
            "policy": {"policy_function": "nereid.ray.autoscaling:OnePerNodePolicy"},
        }
    }


def _deployment(cls: type, **options: Any) -> Deployment:
    return cast(Deployment, serve.deployment(cls, **options))  # its overloads hide the class form
