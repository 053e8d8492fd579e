"""`nereid ray serve`: deploy Nereid onto a running Ray cluster as a Serve application and keep it there until
SIGTERM/SIGINT. Flags it does not know are `nereid serve` flags for every replica (--model-eviction-policy,
--model-group-limit, --log-verbose ...). It parses and deploys; the deployments do the serving."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import threading
from typing import Any

from nereid.core.settings import ServerSettings

__all__ = ["main", "parse_ray_serve_args"]

log = logging.getLogger("nereid.ray")

APP_NAME = "nereid"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nereid ray serve", description=__doc__)
    add = p.add_argument
    add(
        "--model-repository",
        "--model-store",
        dest="model_repository",
        action="append",
        default=[],
        required=True,
        metavar="PATH",
        help="model repository every replica reads (a shared folder, or s3://..., gs://..., as://...)",
    )
    add("--address", default="auto", help="Ray cluster address (ray.init's address; 'auto': the local cluster)")
    add("--node-ip-address", default="", help="this driver's address in the cluster (ray.init's _node_ip_address)")
    add("--num-replicas", type=int, default=1, help="model replicas (the initial count when autoscaling)")
    add("--min-replicas", type=int, default=None, help="autoscale: at least this many replicas")
    add("--max-replicas", type=int, default=None, help="autoscale: at most this many replicas")
    add(
        "--target-queue-time-us",
        type=float,
        default=5000.0,
        help="autoscale: add a replica while the replicas' mean queue time is above this",
    )
    add(
        "--replicate-queue-time-us",
        type=float,
        default=5000.0,
        help="give a model one more replica while its queue time is above this on every replica holding it (0: never)",
    )
    add("--upscale-delay-secs", type=float, default=3.0, help="autoscale: how long the queue must stay long")
    add("--downscale-delay-secs", type=float, default=30.0, help="autoscale: how long replicas must stay idle")
    add("--autoscaling-window-secs", type=float, default=5.0, help="autoscale: the look-back window of the metrics")
    add(
        "--replica-memory-budget",
        action="append",
        default=[],
        metavar="SIZE",
        help="each replica's --model-memory-budget (bytes, 512MiB, 8GiB, N%% of RAM, gpuN:SIZE)",
    )
    add("--cpus-per-replica", type=float, default=1.0, help="Ray CPUs each replica reserves")
    add("--gpus-per-replica", type=float, default=0.0, help="Ray GPUs each replica reserves")
    add(
        "--placement-group-gpus",
        type=int,
        default=0,
        metavar="N",
        help="reserve N GPUs beside each replica for vLLM's tensor/pipeline-parallel workers (a placement group)",
    )
    add("--max-ongoing-requests", type=int, default=256, help="requests one replica takes at once")
    add("--ingress-replicas", type=int, default=0,
        help="nodes running the ingress (0: every alive node, nodes that join later included)")  # fmt: skip
    add("--http-port", type=int, default=8000, help="the ingress's HTTP port on every node")
    add("--grpc-port", type=int, default=8001, help="the ingress's gRPC port on every node")
    add(
        "--metrics-port",
        type=int,
        default=8002,
        help="the ingress's metrics port on every node (its replicas' metrics)",
    )
    add("--serve-http-port", type=int, default=0,
        help="also open Ray Serve's own HTTP proxy on the head node at this port (0: not opened)")  # fmt: skip
    return p


def _settings(argv: list[str]) -> ServerSettings:
    from nereid.serve_flags import parse_serve_args

    return parse_serve_args(argv)


def parse_ray_serve_args(argv: list[str]) -> tuple[argparse.Namespace, Any]:
    """The flags, and the application's options (replica and ingress settings built with `nereid serve`'s own
    parser, so every Triton flag means what it means there)."""
    from nereid.ray.app import RayServeOptions

    args, serve_flags = _parser().parse_known_args(argv)
    for flag, value in (("--num-replicas", args.num_replicas), ("--cpus-per-replica", args.cpus_per_replica + 1)):
        if value < 1:
            _parser().error(f"{flag}: expected 1 or more, got {value}")
    if args.min_replicas is not None and args.max_replicas is not None and args.max_replicas < args.min_replicas:
        _parser().error(f"--max-replicas {args.max_replicas} is below --min-replicas {args.min_replicas}")
    if args.placement_group_gpus < 0:
        _parser().error(f"--placement-group-gpus: expected 0 or more, got {args.placement_group_gpus}")
    if args.placement_group_gpus and args.gpus_per_replica:
        # The replica runs in the placement group's first (CPU) bundle; the GPUs are its other bundles.
        _parser().error("--placement-group-gpus and --gpus-per-replica exclude each other: the GPUs of a "
                        "placement group are for vLLM's workers, the replica itself takes none")  # fmt: skip
    repositories = [f"--model-repository={path}" for path in args.model_repository]
    budget = [f"--model-memory-budget={size}" for size in args.replica_memory_budget]
    replica = _settings([*repositories, "--model-control-mode=explicit", "--model-load-on-demand=true",
                         "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false", "--allow-dashboard=false",
                         *budget, *serve_flags])  # fmt: skip
    # The ingress drives rollouts (and keeps their state file); the replicas serve the versions it names.
    replica = dataclasses.replace(replica, rollout_state_file="")
    ingress = _settings([*repositories, "--model-control-mode=explicit", "--allow-dashboard=false",
                         f"--http-port={args.http_port}", f"--grpc-port={args.grpc_port}",
                         f"--metrics-port={args.metrics_port}", *serve_flags])  # fmt: skip
    options = RayServeOptions(
        replica_settings=replica,
        ingress_settings=ingress,
        num_replicas=args.num_replicas,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        target_queue_time_us=args.target_queue_time_us,
        replicate_queue_time_us=args.replicate_queue_time_us,
        upscale_delay_s=args.upscale_delay_secs,
        downscale_delay_s=args.downscale_delay_secs,
        look_back_period_s=args.autoscaling_window_secs,
        cpus_per_replica=args.cpus_per_replica,
        gpus_per_replica=args.gpus_per_replica,
        placement_group_gpus=args.placement_group_gpus,
        max_ongoing_requests=args.max_ongoing_requests,
        ingress_replicas=args.ingress_replicas,
    )
    return args, options


def deploy(options: Any, serve_http_port: int = 0, serve_http_host: str = "127.0.0.1") -> Any:
    """Start Serve on the connected cluster (its own proxy only where asked) and run the application; returns the
    ingress's handle once every deployment is up."""
    import ray
    from ray import serve

    from nereid.ray.app import build_application

    options.nodes_alive = max(1, sum(1 for node in ray.nodes() if node["Alive"]))
    http_options: dict[str, Any] = (
        {"host": serve_http_host, "port": serve_http_port, "location": "HeadOnly"}
        if serve_http_port
        else {"location": "NoServer"}
    )
    serve.start(http_options=http_options)
    return serve.run(build_application(options), name=APP_NAME, route_prefix="/" if serve_http_port else None)


def ingress_addresses(ingress: Any, expected: int) -> list[dict[str, Any]]:
    """Where the ingress replicas listen (each answers `where`; a few rounds of calls reach them all)."""
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(expected * 8):
        where = ingress.where.remote().result(timeout_s=30)
        seen[where["node_ip"]] = where
        if len(seen) >= expected:
            break
    return sorted(seen.values(), key=lambda w: w["node_ip"])


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "serve":
        sys.stderr.write("usage: nereid ray serve --model-repository PATH [--address RAY_ADDRESS] [flags]\n")
        return 2
    args, options = parse_ray_serve_args(argv[1:])
    from nereid.logs import configure_logging

    configure_logging(options.ingress_settings)
    import ray
    from ray import serve

    init: dict[str, Any] = {"address": args.address, "logging_level": logging.WARNING}
    if args.node_ip_address:
        init["_node_ip_address"] = args.node_ip_address
    ray.init(**init)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        host = args.node_ip_address or ray.util.get_node_ip_address()
        ingress = deploy(options, args.serve_http_port, host)
        for where in ingress_addresses(ingress, options.ingress_replicas or options.nodes_alive):
            log.info("Started GRPCInferenceService at %s:%d", where["node_ip"], where["grpc_port"])
            log.info("Started HTTPService at %s:%d", where["node_ip"], where["http_port"])
            log.info("Started Metrics Service at %s:%d", where["node_ip"], where["metrics_port"])
        if args.serve_http_port:
            log.info("Started Ray Serve's HTTP proxy at %s:%d", host, args.serve_http_port)
        stop.wait()
        log.info("Signal received, deleting the Serve application '%s'", APP_NAME)
        serve.delete(APP_NAME)
    finally:
        ray.shutdown()
    return 0
