"""The one settings object built from Triton's command-line flags and handed to the rest of the code."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["GrpcConnectionOptions", "GrpcTls", "RestrictedApi", "ServerSettings", "TransportLimits"]


@dataclass(slots=True, frozen=True)
class GrpcTls:
    """--grpc-use-ssl and friends: PEM files; `mutual` also requires client certificates signed by `root_cert`."""

    server_cert: str
    server_key: str
    root_cert: str = ""
    mutual: bool = False


@dataclass(slots=True, frozen=True)
class RestrictedApi:
    """One --http-restricted-api / --grpc-restricted-protocol item: requests of these API categories (health,
    metadata, inference, shared-memory, model-config, model-repository, statistics, trace, logging) must carry
    the header `header` with the value `value`."""

    apis: frozenset[str]
    header: str
    value: str


@dataclass(slots=True, frozen=True)
class GrpcConnectionOptions:
    """Triton's gRPC channel flags, with tritonserver's defaults (times in milliseconds; 0 age: no limit)."""

    keepalive_time_ms: int = 7_200_000
    keepalive_timeout_ms: int = 20_000
    keepalive_permit_without_calls: bool = False
    http2_max_pings_without_data: int = 2
    http2_min_recv_ping_interval_without_data_ms: int = 300_000
    http2_max_ping_strikes: int = 2
    max_connection_age_ms: int = 0
    max_connection_age_grace_ms: int = 0
    infer_response_compression_level: str = "none"  # none | low | medium | high


@dataclass(slots=True, frozen=True)
class TransportLimits:
    """What one client may make the server hold, on both ports (sizes in bytes, times in seconds). Each is a
    flag; docs/security.md explains them. The defaults let every ordinary client through."""

    # HTTP/1.1 (the request body limit is --http-max-input-size, in ServerSettings).
    http_max_header_size: int = 64 * 1024  # request line and headers together
    http_max_header_count: int = 256
    http_max_pipelined_requests: int = 32  # parsed requests waiting behind the one running, per connection
    http_header_timeout_secs: float = 30.0  # a request's headers must all arrive within this
    http_idle_timeout_secs: float = 75.0  # no request, no body byte, or a client not reading, for this long
    http_write_buffer_size: int = 64 * 1024  # response bytes a connection buffers before its producer waits
    # Open connections per HTTP port (inference, metrics, OpenAI): past it the oldest idle one is closed for a
    # new one, or the new one is closed when none is idle.
    http_max_connections: int = 10_000
    # HTTP/2 (gRPC).
    grpc_max_concurrent_streams: int = 1024
    grpc_max_header_list_size: int = 64 * 1024
    grpc_max_receive_message_size: int = 2**31 - 1  # as Triton: INT32_MAX
    grpc_max_send_message_size: int = 2**31 - 1
    grpc_max_reset_streams: int = 1000  # resets over completions, per connection, before GOAWAY (rapid reset)
    grpc_max_control_frames: int = 10_000  # SETTINGS/PING/RST from the client not yet answered by our reads
    grpc_max_connections: int = 10_000  # open connections on the gRPC port; past it new ones are closed
    # Server-wide.
    max_inflight_requests: int = 10_000  # inference requests at once; past it 503 / UNAVAILABLE at once
    # A unary request still unanswered after this long ends with UNAVAILABLE "Request timeout expired" (streams
    # are exempt); the client's own timeout and the model's queue policy can end it sooner. 0: no default.
    default_request_timeout_secs: float = 600.0


@dataclass(slots=True)
class ServerSettings:
    model_repositories: list[Path] = field(default_factory=list)
    model_control_mode: str = "none"  # none | poll | explicit
    repository_poll_secs: float = 15.0
    load_models: list[str] = field(default_factory=list)
    model_config_name: str = ""
    auto_complete_config: bool = True
    exit_on_error: bool = True
    strict_readiness: bool = True
    exit_timeout_secs: float = 30.0
    server_id: str = "triton"
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    grpc_tls: GrpcTls | None = None
    grpc_options: GrpcConnectionOptions = field(default_factory=GrpcConnectionOptions)
    reuse_http_port: bool = False
    reuse_grpc_port: bool = False
    http_header_forward_pattern: str = ""  # headers whose names match become request parameters
    grpc_header_forward_pattern: str = ""
    http_restricted_apis: list[RestrictedApi] = field(default_factory=list)
    grpc_restricted_protocols: list[RestrictedApi] = field(default_factory=list)
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    openai_address: str = "0.0.0.0"
    openai_port: int = 0  # the OpenAI-compatible API on its own port; 0: only under /v1 on the HTTP port
    metrics_interval_ms: int = 2000
    http_max_input_size: int = 64 * 1024 * 1024
    http_thread_count: int = 8
    # --allow-client-shm: clients may register and use system shared memory (off by default, as in Triton).
    allow_client_shm: bool = False
    limits: TransportLimits = field(default_factory=TransportLimits)
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"
    log_file: str = ""
    # (cache name, options) from --cache-config, e.g. ("local", {"size": "1048576"}).
    cache_config: tuple[str, dict[str, str]] | None = None
    rate_limit: str = "off"  # off | execution_count
    rate_limit_resources: list[str] = field(default_factory=list)  # NAME:COUNT[:DEVICE]
    metrics_config: dict[str, str] = field(default_factory=dict)
    # --backend-config: backend name ("" for global settings) -> key -> value.
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    # --trace-config (and the older --trace-* flags) as trace settings: trace_file, trace_level, trace_rate, ...
    trace_config: dict[str, Any] = field(default_factory=dict)
    # tritonserver flags given on the command line that Nereid accepts but does not act on.
    ignored_flags: list[str] = field(default_factory=list)
