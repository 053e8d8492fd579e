"""The one settings object built from Triton's command-line flags and handed to the rest of the code."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["GrpcTls", "ServerSettings"]


@dataclass(slots=True, frozen=True)
class GrpcTls:
    """--grpc-use-ssl and friends: PEM files; `mutual` also requires client certificates signed by `root_cert`."""

    server_cert: str
    server_key: str
    root_cert: str = ""
    mutual: bool = False


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
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    openai_address: str = "0.0.0.0"
    openai_port: int = 0  # the OpenAI-compatible API on its own port; 0: only under /v1 on the HTTP port
    metrics_interval_ms: int = 2000
    http_max_input_size: int = 64 * 1024 * 1024
    http_thread_count: int = 8
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
