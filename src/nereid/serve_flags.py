"""`nereid serve`'s flags: Triton's tritonserver flags, names and meanings, parsed into the one ServerSettings the rest
of the server receives (also for `nereid ray serve` and the PyTriton API). It must not start anything."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from nereid import cloud_env
from nereid.cache.response_cache import parse_cache_config
from nereid.cloud_storage_env import model_repositories
from nereid.core.otel_tracing import OtelConfig
from nereid.core.request_memory import DEFAULT_SHARE_OF_MEMORY, format_size, usable_memory
from nereid.core.request_parameters import header_pattern
from nereid.core.settings import (
    GrpcConnectionOptions,
    GrpcTls,
    RestrictedApi,
    SagemakerSettings,
    SchedulerDelay,
    ServerSettings,
    TransportLimits,
    VertexAiSettings,
    parse_boolean,
)
from nereid.repository.memory_sizes import parse_memory_size

__all__ = ["check_port_collisions", "parse_request_memory_limit", "parse_serve_args"]


def _bool(value: str) -> bool:
    try:
        return parse_boolean(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("unrecognized arguments"):
            flags = message.split(":", 1)[1].strip()
            message = f"unknown flag(s): {flags}. Run `nereid serve --help` for the supported tritonserver flags"
        self.exit(2, f"nereid {self.prog.split()[-1]}: error: {message}\n")


# tritonserver flags that existing launch scripts pass but that have no effect in Nereid (memory pools,
# backend directories, SSL and keepalive tuning, other frontends): accepted with a warning, so the scripts
# keep working, instead of being refused as unknown.
_COMPATIBILITY_ONLY_FLAGS = (
    "--backend-directory",
    "--cache-directory",
    "--model-load-thread-count",
    "--model-load-retry-count",
    "--model-namespacing",
    "--enable-peer-access",
    "--model-load-gpu-limit",
    "--cuda-memory-pool-byte-size",
    "--cuda-virtual-address-size",
    "--min-supported-compute-capability",
    "--buffer-manager-thread-count",
    "--host-policy",
    "--grpc-infer-allocation-pool-size",
    "--grpc-max-response-pool-size",
)


def _serve_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nereid serve", description="Serve Triton model repositories over HTTP and gRPC.", allow_abbrev=False)
    add = p.add_argument
    add("--model-repository", "--model-store", dest="model_repository", action="append", default=[], metavar="PATH", help="model repository folder, or s3://[host:port/]bucket/path, gs://bucket/path, as://account/container/path (repeatable)")
    add("--model-control-mode", choices=["none", "poll", "explicit"], default="none")
    add("--repository-poll-secs", type=float, default=15.0)
    add("--load-model", action="append", default=[], metavar="NAME", help="model to load at start in explicit mode ('*' for all)")
    add("--model-config-name", default="", help="use configs/<name>.pbtxt when a model has it")
    add("--repoagent-directory", type=Path, default=None, metavar="DIR",
        help="repository agents of your own: DIR/<name>/agent.py (docs/compatibility.md)")  # fmt: skip
    add("--disable-auto-complete-config", action="store_true")
    add("--strict-model-config", type=_bool, nargs="?", const=True, default=None, help="deprecated: true means --disable-auto-complete-config")
    add("--exit-on-error", type=_bool, nargs="?", const=True, default=True)
    add("--strict-readiness", type=_bool, nargs="?", const=True, default=True)
    add("--exit-timeout-secs", type=float, default=30.0)
    add("--id", default="triton", help="server identifier reported by server metadata")
    for proto, port in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        add(f"--allow-{proto}", type=_bool, nargs="?", const=True, default=True)
        add(f"--{proto}-port", type=int, default=port)
        add(f"--{proto}-address", default="0.0.0.0")
    add("--grpc-use-ssl", type=_bool, nargs="?", const=True, default=False, help="serve gRPC over TLS")
    add("--grpc-use-ssl-mutual", type=_bool, nargs="?", const=True, default=False, help="TLS with client certificates")
    add("--grpc-server-cert", default="", metavar="PEM")
    add("--grpc-server-key", default="", metavar="PEM")
    add("--grpc-root-cert", default="", metavar="PEM", help="CA that client certificates must chain to")
    add("--reuse-http-port", type=_bool, nargs="?", const=True, default=False, help="SO_REUSEPORT: several servers share the port")
    add("--reuse-grpc-port", type=_bool, nargs="?", const=True, default=False, help="SO_REUSEPORT: several servers share the port")
    add("--http-header-forward-pattern", default="", metavar="REGEX", help="forward matching HTTP headers as request parameters")
    add("--grpc-header-forward-pattern", default="", metavar="REGEX", help="forward matching gRPC metadata as request parameters")
    add("--http-restricted-api", action="append", default=[], metavar="API[,API]:KEY=VALUE", help="these APIs need header KEY: VALUE")
    add("--grpc-restricted-protocol", action="append", default=[], metavar="API[,API]:KEY=VALUE", help="these APIs need metadata KEY: VALUE")
    add("--grpc-infer-response-compression-level", choices=["none", "low", "medium", "high"], default="none")
    add("--grpc-keepalive-time", type=int, default=7_200_000, metavar="MS")
    add("--grpc-keepalive-timeout", type=int, default=20_000, metavar="MS")
    add("--grpc-keepalive-permit-without-calls", type=_bool, nargs="?", const=True, default=False)
    add("--grpc-http2-max-pings-without-data", type=int, default=2)
    add("--grpc-http2-min-recv-ping-interval-without-data", type=int, default=300_000, metavar="MS")
    add("--grpc-http2-max-ping-strikes", type=int, default=2)
    add("--grpc-max-connection-age", type=int, default=0, metavar="MS")
    add("--grpc-max-connection-age-grace", type=int, default=0, metavar="MS")
    add("--trace-config", action="append", default=[], metavar="[triton,]KEY=VALUE", help="file=, log-frequency=, level=, rate=, count=, mode=")
    add("--trace-file", default=None, help="deprecated: --trace-config triton,file=")
    add("--trace-level", action="append", default=[], help="deprecated: --trace-config level=")
    add("--trace-rate", default=None, help="deprecated: --trace-config rate=")
    add("--trace-count", default=None, help="deprecated: --trace-config count=")
    add("--trace-log-frequency", default=None, help="deprecated: --trace-config triton,log-frequency=")
    add("--allow-cpu-metrics", type=_bool, nargs="?", const=True, default=True)
    add("--allow-gpu-metrics", type=_bool, nargs="?", const=True, default=True)
    add("--metrics-interval-ms", type=int, default=2000)
    add("--http-max-input-size", type=int, default=64 * 1024 * 1024)
    add("--openai-port", type=int, default=0, help="serve the OpenAI-compatible API on this port too (it is always under /v1 on the HTTP port)")
    add("--openai-address", default="0.0.0.0")
    add("--http-thread-count", type=int, default=8, help="accepted for compatibility; the event loop serves HTTP")
    add("--cache-config", action="append", default=[], metavar="CACHE,KEY=VALUE", help="response cache: local,size=N or redis,host=H / redis,port=P (repeatable)")
    add("--rate-limit", choices=["off", "execution_count"], default="off")
    add("--rate-limit-resource", action="append", default=[], metavar="NAME:COUNT[:DEVICE]")
    add("--metrics-config", action="append", default=[], metavar="KEY=VALUE",
        help="counter_latencies=false, summary_latencies=true, summary_quantiles=<q>:<error>,..., histogram_latencies=true")
    add("--pinned-memory-pool-byte-size", type=int, default=268_435_456,
        help="reported as nv_pinned_memory_pool_total_bytes (Nereid pins no memory, like a CPU-only Triton)")
    add("--backend-config", action="append", default=[], metavar="BACKEND,KEY=VALUE", help="e.g. onnxruntime,default-max-batch-size=8")
    add("--response-cache-byte-size", type=int, default=None, help="deprecated: same as --cache-config=local,size=N")
    _add_cloud_endpoint_flags(p)
    for flag in _COMPATIBILITY_ONLY_FLAGS:
        add(flag, action="append", default=None, help=argparse.SUPPRESS)
    add("--log-verbose", type=int, default=0)
    add("--log-info", type=_bool, nargs="?", const=True, default=True)
    add("--log-warning", type=_bool, nargs="?", const=True, default=True)
    add("--log-error", type=_bool, nargs="?", const=True, default=True)
    add("--log-format", choices=["default", "ISO8601"], default="default")
    add("--log-file", default="")
    _add_orchestration_flags(p)
    _add_limit_flags(p)
    _add_dashboard_flags(p)
    return p


# -- the operator dashboard at /dashboard on the HTTP port (docs/dashboard.md) ----------------------------------
def _add_dashboard_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-dashboard", type=_bool, nargs="?", const=True, default=True,
                   help="serve the operator dashboard at /dashboard on the HTTP port")
    p.add_argument("--dashboard-reports-dir", default="", metavar="PATH",
                   help="folder whose `nereid analyze` reports the dashboard lists")  # fmt: skip


# -- model orchestration: loading on demand, the memory budget, eviction, pins and groups ----------------------
def _add_orchestration_flags(p: argparse.ArgumentParser) -> None:
    add = p.add_argument
    add("--model-load-on-demand", type=_bool, nargs="?", const=True, default=False,
        help="load a model of the repository when a request names it (explicit and poll modes)")
    add("--model-load-on-demand-timeout-secs", type=float, default=60.0, metavar="SECONDS",
        help="how long a request waits for a load on demand before 503 / UNAVAILABLE")
    add("--model-load-failure-backoff-secs", type=float, default=10.0, metavar="SECONDS",
        help="a failed load on demand is not retried for this long; its requests get the load error")
    add("--model-memory-budget", action="append", default=[], metavar="SIZE",
        help="memory the resident models may take: bytes, 512MiB, 8GiB, N%% of RAM; gpuN:SIZE per GPU (NVML)")
    add("--model-eviction-policy", choices=["frequency", "lru"], default="frequency",
        help="which idle model goes first when a load needs room (see docs/orchestration.md)")
    add("--model-idle-unload-secs", type=float, default=0.0, metavar="SECONDS", help="unload models unused this long (0: never)")
    add("--model-group-limit", action="append", default=[], metavar="NAME:N",
        help="at most N models of the config parameter group NAME resident at once (repeatable)")
    add("--model-footprint-state-file", default="", metavar="PATH",
        help="remember measured model footprints across restarts in this JSON file")
    add("--model-footprint-resample-secs", type=float, default=10.0, metavar="SECONDS",
        help="how often the footprints of worker-process models are measured again")  # fmt: skip
    add("--rollout-state-file", default="", metavar="PATH",
        help="keep rollouts (their step, or the version a finished one chose) across restarts in this JSON file")
    add("--monitoring-samples-per-second", type=float, default=50.0, metavar="N",
        help="requests a second sampled for drift, data quality and the payload log (0: monitoring off)")
    add("--monitoring-window-secs", type=float, default=60.0, metavar="SECONDS", help="the sliding window drift is measured over")
    add("--monitoring-reference-requests", type=int, default=500, metavar="N",
        help="sampled requests that make a version's reference when its folder has no reference.npz")
    add("--payload-log-dir", default="", metavar="PATH", help="write sampled requests and responses as JSON lines here")
    add("--payload-log-share", type=float, default=1.0, metavar="SHARE", help="of the monitored samples, the share logged")
    add("--payload-log-max-bytes", type=int, default=64 << 20, metavar="BYTES", help="rotate the payload log at this size")
    add("--payload-log-backups", type=int, default=5, metavar="N", help="rotated payload logs kept")


def _non_negative(flag: str, value: float) -> float:
    if value < 0:
        _serve_parser().error(f"{flag} must be 0 or more, got {value:g}")
    return value


def _positive(flag: str, value: float) -> float:
    if value <= 0:
        _serve_parser().error(f"{flag} must be above 0, got {value:g}")
    return value


def _share(flag: str, value: float) -> float:
    if not 0 <= value <= 1:
        _serve_parser().error(f"{flag} must be between 0 and 1, got {value:g}")
    return value


def _orchestration_settings(args: argparse.Namespace) -> dict[str, Any]:
    from nereid.repository.footprints import Nvml
    from nereid.repository.memory_sizes import parse_group_limit, parse_memory_budget

    if args.model_load_on_demand and args.model_control_mode not in ("explicit", "poll"):
        _serve_parser().error("--model-load-on-demand needs --model-control-mode=explicit or poll")
    for flag, value, low in (("--model-load-on-demand-timeout-secs", args.model_load_on_demand_timeout_secs, 0.0),
                             ("--model-footprint-resample-secs", args.model_footprint_resample_secs, 0.0)):  # fmt: skip
        if not value > low:
            _serve_parser().error(f"{flag}: expected a number of seconds above 0, got {value:g}")
    for flag, value in (("--model-load-failure-backoff-secs", args.model_load_failure_backoff_secs),
                        ("--model-idle-unload-secs", args.model_idle_unload_secs)):  # fmt: skip
        if value < 0:
            _serve_parser().error(f"{flag}: expected 0 or more seconds, got {value:g}")
    try:
        gpu_items = any("gpu" in item for item in args.model_memory_budget)
        nvml = Nvml() if gpu_items else None
        budget = (
            parse_memory_budget(args.model_memory_budget, nvml.device_count if nvml and nvml.available else None)
            if args.model_memory_budget
            else None
        )
        groups = parse_group_limit(args.model_group_limit)
    except ValueError as exc:
        _serve_parser().error(str(exc))
    return {
        "model_load_on_demand": args.model_load_on_demand,
        "model_load_on_demand_timeout_secs": args.model_load_on_demand_timeout_secs,
        "model_load_failure_backoff_secs": args.model_load_failure_backoff_secs,
        "model_memory_budget": budget,
        "model_eviction_policy": args.model_eviction_policy,
        "model_idle_unload_secs": args.model_idle_unload_secs,
        "model_group_limits": groups,
        "model_footprint_state_file": args.model_footprint_state_file,
        "model_footprint_resample_secs": args.model_footprint_resample_secs,
        "rollout_state_file": args.rollout_state_file,
        "monitoring_samples_per_second": _non_negative("--monitoring-samples-per-second", args.monitoring_samples_per_second),
        "monitoring_window_secs": _positive("--monitoring-window-secs", args.monitoring_window_secs),
        "monitoring_reference_requests": int(_positive("--monitoring-reference-requests", args.monitoring_reference_requests)),
        "payload_log_dir": args.payload_log_dir,
        "payload_log_share": _share("--payload-log-share", args.payload_log_share),
        "payload_log_max_bytes": int(_positive("--payload-log-max-bytes", args.payload_log_max_bytes)),
        "payload_log_backups": int(_non_negative("--payload-log-backups", args.payload_log_backups)),
    }
def _add_cloud_endpoint_flags(p: argparse.ArgumentParser) -> None:
    """The SageMaker and Vertex AI endpoints' flags; AIP_MODE and AIP_HTTP_PORT change some defaults (see
    cloud_env.parser_defaults). The address flags are Nereid's: tritonserver always listens on 0.0.0.0."""
    add = p.add_argument
    add("--allow-sagemaker", type=_bool, nargs="?", const=True, default=False, help="serve SageMaker's /ping, /invocations and /models")
    add("--sagemaker-port", type=int, default=8080)
    add("--sagemaker-address", default="0.0.0.0")
    add("--sagemaker-safe-port-range", default=None, metavar="FIRST-LAST", help="every service must listen inside this range")
    add("--sagemaker-thread-count", type=int, default=8, help="accepted for compatibility; the event loop serves SageMaker")
    add("--allow-vertex-ai", type=_bool, nargs="?", const=True, default=False, help="serve AIP_PREDICT_ROUTE and AIP_HEALTH_ROUTE")
    add("--vertex-ai-port", type=int, default=8080, help="default: AIP_HTTP_PORT if set, else 8080")
    add("--vertex-ai-address", default="0.0.0.0")
    add("--vertex-ai-thread-count", type=int, default=8, help="accepted for compatibility; the event loop serves Vertex AI")
    add("--vertex-ai-default-model", default="", help="the model the predict route serves (default: the only model)")


def _cloud_endpoints(args: argparse.Namespace, env: dict[str, str]) -> tuple[SagemakerSettings | None, VertexAiSettings | None]:
    sagemaker = vertex = None
    if args.allow_sagemaker:
        safe_range = None
        if args.sagemaker_safe_port_range is not None:
            first, dash, last = args.sagemaker_safe_port_range.partition("-")
            if not dash or not first.strip().isdigit() or not last.strip().isdigit():
                raise ValueError(f"--sagemaker-safe-port-range: expected <integer>-<integer>, got '{args.sagemaker_safe_port_range}'")
            safe_range = (int(first), int(last))
        sagemaker = SagemakerSettings(args.sagemaker_address, args.sagemaker_port, safe_range, args.sagemaker_thread_count,
                                      **cloud_env.sagemaker_environment(env))  # fmt: skip
    if args.allow_vertex_ai:
        predict, health = cloud_env.vertex_ai_routes(env)
        vertex = VertexAiSettings(args.vertex_ai_address, args.vertex_ai_port, args.vertex_ai_thread_count,
                                  args.vertex_ai_default_model, predict, health)  # fmt: skip
    return sagemaker, vertex


def check_port_collisions(settings: ServerSettings) -> None:
    """tritonserver's check: no two services on one address and port, and with --sagemaker-safe-port-range
    every service on the SageMaker address inside the range. Raises ValueError with Triton's message."""
    services: list[tuple[str, str, int, tuple[int, int] | None]] = []
    if settings.allow_http:
        services.append(("HTTP", settings.http_address, settings.http_port, None))
    if settings.allow_grpc:
        services.append(("GRPC", settings.grpc_address, settings.grpc_port, None))
    if settings.allow_metrics:
        services.append(("metrics", settings.metrics_address, settings.metrics_port, None))
    if settings.sagemaker is not None:
        sm = settings.sagemaker
        services.append(("SageMaker", sm.address, sm.port, sm.safe_port_range))
    if settings.vertex_ai is not None:
        services.append(("Vertex AI", settings.vertex_ai.address, settings.vertex_ai.port, None))
    for index, (name, address, port, safe_range) in enumerate(services):
        for other_index, (other, other_address, other_port, _) in enumerate(services):
            if other_index == index or other_address != address:
                continue
            if safe_range is not None and not safe_range[0] <= other_port <= safe_range[1]:
                raise ValueError(
                    f"The server cannot listen to {other} requests at port {other_port}, allowed port range is "
                    f"[{safe_range[0]}, {safe_range[1]}]"
                )
            if other_index > index and port == other_port:
                raise ValueError(
                    f"The server cannot listen to {name} requests and {other} requests at the same address and port "
                    f"{address}:{port}"
                )
# -- limits that hold the ports against hostile clients (docs/security.md) ------------------------------------
_LIMIT_FLAGS: tuple[tuple[str, type], ...] = (
    ("http-max-header-size", int),
    ("http-max-header-count", int),
    ("http-max-pipelined-requests", int),
    ("http-header-timeout-secs", float),
    ("http-idle-timeout-secs", float),
    ("http-write-buffer-size", int),
    ("http-max-connections", int),
    ("grpc-max-concurrent-streams", int),
    ("grpc-max-header-list-size", int),
    ("grpc-max-receive-message-size", int),
    ("grpc-max-send-message-size", int),
    ("grpc-max-reset-streams", int),
    ("grpc-max-control-frames", int),
    ("grpc-max-connections", int),
    ("max-inflight-requests", int),
    ("default-request-timeout-secs", float),
)


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    defaults = TransportLimits()
    for flag, kind in _LIMIT_FLAGS:
        field_name = flag.replace("-", "_")
        p.add_argument(f"--{flag}", dest=f"limit_{field_name}", type=kind, default=getattr(defaults, field_name))
    p.add_argument("--request-memory-limit", default=f"{DEFAULT_SHARE_OF_MEMORY}%", metavar="SIZE",
                   help="bytes all requests in progress may hold while received and decoded: bytes, 512MiB, 4GiB, "
                        "N%% of RAM, 0 for no limit (default: %(default)s)")  # fmt: skip
    p.add_argument("--allow-client-shm", type=_bool, nargs="?", const=True, default=False, help="let clients register and use shared memory (default false, as in Triton)")


def _limits(args: argparse.Namespace) -> TransportLimits:
    values: dict[str, Any] = {
        flag.replace("-", "_"): getattr(args, "limit_" + flag.replace("-", "_")) for flag, _ in _LIMIT_FLAGS
    }
    for name, value in values.items():
        if value < 0 or (value == 0 and name not in ("default_request_timeout_secs",)):
            _serve_parser().error(f"--{name.replace('_', '-')} must be greater than 0, got {value}")
    try:
        values["request_memory_limit"] = parse_request_memory_limit(args.request_memory_limit)
    except ValueError as exc:
        _serve_parser().error(str(exc))
    return TransportLimits(**values)


def parse_request_memory_limit(text: str, total: int | None = None) -> int:
    """--request-memory-limit: bytes from `536870912`, `512MiB`, `4GiB`, `512M`, or `N%` of the memory the server
    may use (`total`, by default the RAM or the container's limit); 0 for no limit. ValueError says what is wrong."""
    if text.strip() == "0":
        return 0
    flag = "--request-memory-limit"
    size = parse_memory_size(text, flag, usable_memory() if total is None else total)
    if size < _MIN_REQUEST_MEMORY:
        raise ValueError(f"{flag}: '{text}' is {format_size(size)}, below the 1 MiB that one request may need; give 0 for no limit")
    return size


_MIN_REQUEST_MEMORY = 1 << 20


_TRACE_KEYS = {"file": "trace_file", "log-frequency": "log_frequency", "level": "trace_level", "rate": "trace_rate",
               "count": "trace_count", "mode": "trace_mode"}


def parse_trace_config(args: argparse.Namespace) -> dict[str, Any]:
    """--trace-config's `[mode,]key=value` items and the older --trace-* flags, as trace settings."""
    config: dict[str, Any] = {}
    levels: list[str] = list(args.trace_level)
    for flag, key in (("trace_file", "trace_file"), ("trace_rate", "trace_rate"), ("trace_count", "trace_count"),
                      ("trace_log_frequency", "log_frequency")):
        if getattr(args, flag) is not None:
            config[key] = getattr(args, flag)
    otel: list[tuple[str, str]] = []
    for item in args.trace_config:
        mode, _, setting = item.partition(",") if "," in item else ("", "", item)
        if mode == "opentelemetry":
            # url, resource, bsp_*: checked by OtelConfig, which names the setting it refuses.
            key, _, value = setting.partition("=")
            otel.append((key, value))
            continue
        name, eq, value = setting.partition("=")
        if not eq or name not in _TRACE_KEYS:
            raise ValueError(f"--trace-config: unknown setting {item!r}; expected one of {sorted(_TRACE_KEYS)}")
        if name == "level":
            levels.append(value.upper())
        elif name == "mode" and value not in ("triton", "opentelemetry"):
            raise ValueError(f"--trace-config: trace mode {value!r} is not supported; use triton or opentelemetry")
        else:
            config[_TRACE_KEYS[name]] = value
    if levels:
        config["trace_level"] = levels
    if otel:
        try:
            OtelConfig.from_items(otel)
        except ValueError as exc:
            raise ValueError(f"--trace-config: {exc}") from None
        config["opentelemetry"] = otel
    opentelemetry = config.get("trace_mode") == "opentelemetry"
    if any(level != "OFF" for level in levels) and not config.get("trace_file") and not opentelemetry:
        raise ValueError("--trace-config: tracing needs a trace file (triton,file=PATH)")
    return config


RESTRICTABLE_APIS = frozenset(
    {"health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics", "trace", "logging"}
    | {"dashboard"}  # Nereid's operator page (docs/dashboard.md)
)


def parse_restricted_apis(flag: str, items: list[str]) -> list[RestrictedApi]:
    """`API[,API...]:KEY=VALUE` items; an API may be restricted by one item only, as in tritonserver."""
    restricted: list[RestrictedApi] = []
    seen: set[str] = set()
    kind = "protocol" if flag == "--grpc-restricted-protocol" else "api"  # tritonserver's words for each flag
    for item in items:
        names, colon, pair = item.partition(":")
        header, eq, value = pair.partition("=")
        apis = {name.strip() for name in names.split(",") if name.strip()}
        if not colon or not eq or not header or not apis:
            raise ValueError(f"{flag} '{item}': expected <API>[,<API>...]:<key>=<value>")
        unknown = sorted(apis - RESTRICTABLE_APIS)
        if unknown:
            raise ValueError(f"{flag} '{item}': unknown restricted {kind} '{unknown[0]}' (one of: {', '.join(sorted(RESTRICTABLE_APIS))})")
        twice = sorted(apis & seen)
        if twice:
            raise ValueError(f"{flag}: restricted {kind} '{twice[0]}' can not be specified in multiple config groups")
        seen |= apis
        restricted.append(RestrictedApi(frozenset(apis), header.strip(), value))  # errors name it as written
    return restricted


def _count(text: str) -> int:
    """C's atoi, as tritonserver reads its variables: leading digits, anything else 0."""
    digits = re.match(r"\s*(\d+)", text)
    return int(digits.group(1)) if digits else 0


def _scheduler_delay(env: dict[str, str]) -> SchedulerDelay:
    """tritonserver's sequence-batcher testing hook (see SchedulerDelay): read from the environment, as it reads it."""
    return SchedulerDelay(_count(env.get("TRITONSERVER_DELAY_SCHEDULER", "")), _count(env.get("TRITONSERVER_BACKLOG_DELAY_SCHEDULER", "")))


def parse_serve_args(argv: list[str], env: dict[str, str] | None = None) -> ServerSettings:
    env = dict(os.environ if env is None else env)
    parser = _serve_parser()
    try:
        parser.set_defaults(**cloud_env.parser_defaults(env))
    except ValueError as exc:
        parser.error(str(exc))
    args = parser.parse_args(argv)
    if not args.model_repository and cloud_env.aip_storage_uri(env):
        args.model_repository = [cloud_env.aip_storage_uri(env)]  # tritonserver's default inside Vertex AI
    if not args.model_repository:
        _serve_parser().error("--model-repository is required")
    try:
        sagemaker, vertex_ai = _cloud_endpoints(args, env)
    except ValueError as exc:
        _serve_parser().error(str(exc))
    try:
        cache_config = parse_cache_config(args.cache_config)
    except ValueError as exc:
        _serve_parser().error(str(exc))
    if args.response_cache_byte_size and cache_config is None:
        cache_config = ("local", {"size": str(args.response_cache_byte_size)})
    ignored = [f for f in _COMPATIBILITY_ONLY_FLAGS if getattr(args, f[2:].replace("-", "_")) is not None]
    backend_config: dict[str, dict[str, str]] = {}
    for item in args.backend_config:
        backend, _, setting = item.partition(",")
        key, eq, value = setting.partition("=")
        if not eq:
            # Triton also takes a global "<key>=<value>" without a backend name.
            key, _, value = backend.partition("=")
            backend = ""
        backend_config.setdefault(backend, {})[key] = value
    try:
        trace_config = parse_trace_config(args)
    except ValueError as exc:
        _serve_parser().error(str(exc))
    grpc_tls = args.grpc_use_ssl or args.grpc_use_ssl_mutual
    if grpc_tls and not (args.grpc_server_cert and args.grpc_server_key):
        _serve_parser().error("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if args.grpc_use_ssl_mutual and not args.grpc_root_cert:
        _serve_parser().error("--grpc-use-ssl-mutual needs --grpc-root-cert")
    if args.http_max_input_size <= 0:
        _serve_parser().error("Error: --http-max-input-size must be greater than 0.")  # tritonserver's message, as it is
    try:
        http_restricted = parse_restricted_apis("--http-restricted-api", args.http_restricted_api)
        grpc_restricted = parse_restricted_apis("--grpc-restricted-protocol", args.grpc_restricted_protocol)
    except ValueError as exc:
        _serve_parser().error(str(exc))
    for flag, pattern in (("--http-header-forward-pattern", args.http_header_forward_pattern),
                          ("--grpc-header-forward-pattern", args.grpc_header_forward_pattern)):  # fmt: skip
        try:
            header_pattern(pattern)
        except re.error as exc:
            _serve_parser().error(f"{flag}: bad regular expression '{pattern}': {exc}")
    grpc_options = GrpcConnectionOptions(
        keepalive_time_ms=args.grpc_keepalive_time,
        keepalive_timeout_ms=args.grpc_keepalive_timeout,
        keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        http2_max_pings_without_data=args.grpc_http2_max_pings_without_data,
        http2_min_recv_ping_interval_without_data_ms=args.grpc_http2_min_recv_ping_interval_without_data,
        http2_max_ping_strikes=args.grpc_http2_max_ping_strikes,
        max_connection_age_ms=args.grpc_max_connection_age,
        max_connection_age_grace_ms=args.grpc_max_connection_age_grace,
        infer_response_compression_level=args.grpc_infer_response_compression_level,
    )
    try:
        repositories = model_repositories(args.model_repository, env)
    except ValueError as exc:
        _serve_parser().error(str(exc))
    auto_complete = not args.disable_auto_complete_config
    if args.strict_model_config is not None:
        auto_complete = not args.strict_model_config
    settings = ServerSettings(
        model_repositories=repositories.local,
        model_control_mode=args.model_control_mode,
        repository_poll_secs=args.repository_poll_secs,
        load_models=args.load_model,
        model_config_name=args.model_config_name,
        repoagent_directory=args.repoagent_directory,
        auto_complete_config=auto_complete,
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        exit_timeout_secs=args.exit_timeout_secs,
        server_id=args.id,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        allow_cpu_metrics=args.allow_cpu_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        http_address=args.http_address,
        http_port=args.http_port,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        grpc_tls=GrpcTls(args.grpc_server_cert, args.grpc_server_key, args.grpc_root_cert, args.grpc_use_ssl_mutual) if grpc_tls else None,
        grpc_options=grpc_options,
        reuse_http_port=args.reuse_http_port,
        reuse_grpc_port=args.reuse_grpc_port,
        http_header_forward_pattern=args.http_header_forward_pattern,
        grpc_header_forward_pattern=args.grpc_header_forward_pattern,
        http_restricted_apis=http_restricted,
        grpc_restricted_protocols=grpc_restricted,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        metrics_interval_ms=args.metrics_interval_ms,
        http_max_input_size=args.http_max_input_size,
        http_thread_count=args.http_thread_count,
        allow_client_shm=args.allow_client_shm,
        limits=_limits(args),
        log_verbose=args.log_verbose,
        log_info=args.log_info,
        log_warning=args.log_warning,
        log_error=args.log_error,
        log_format=args.log_format,
        log_file=args.log_file,
        cache_config=cache_config,
        rate_limit=args.rate_limit,
        rate_limit_resources=args.rate_limit_resource,
        scheduler_delay=_scheduler_delay(env),
        metrics_config=dict(item.partition("=")[::2] for item in args.metrics_config),
        pinned_memory_pool_byte_size=args.pinned_memory_pool_byte_size,
        openai_address=args.openai_address,
        openai_port=args.openai_port,
        backend_config=backend_config,
        trace_config=trace_config,
        ignored_flags=ignored,
        **_orchestration_settings(args),
        sagemaker=sagemaker,
        vertex_ai=vertex_ai,
        allow_dashboard=args.allow_dashboard,
        dashboard_reports_dir=args.dashboard_reports_dir,
        s3_repositories=repositories.s3,
        gcs_repositories=repositories.gcs,
        azure_repositories=repositories.azure,
    )
    try:
        check_port_collisions(settings)
    except ValueError as exc:
        _serve_parser().error(str(exc))
    return settings
