"""The one settings object built from Triton's command-line flags and handed to the rest of the code."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nereid.core.request_memory import default_request_memory_limit

__all__ = [
    "AzureRepository",
    "GcsRepository",
    "GrpcConnectionOptions",
    "GrpcTls",
    "MemoryBudget",
    "RestrictedApi",
    "S3Repository",
    "SagemakerSettings",
    "SchedulerDelay",
    "ServerSettings",
    "TransportLimits",
    "VertexAiSettings",
    "parse_boolean",
]


def parse_boolean(value: str) -> bool:
    """A flag's or backend setting's yes/no word, as tritonserver accepts them; ValueError for any other word."""
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (true/false), got '{value}'")


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
class MemoryBudget:
    """--model-memory-budget: bytes of host memory the resident models may take (0: no host limit), and bytes of
    GPU memory per device index (measured through NVML)."""

    host_bytes: int = 0
    gpu_bytes: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class SagemakerSettings:
    """--allow-sagemaker's endpoint (/ping, /invocations, /models) and the SAGEMAKER_* variables Triton's
    SageMaker frontend reads: the model /invocations serves and what /ping reports (ready or live)."""

    address: str = "0.0.0.0"
    port: int = 8080
    safe_port_range: tuple[int, int] | None = None  # --sagemaker-safe-port-range: the ports every service must use
    thread_count: int = 8
    default_model: str = "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"  # SAGEMAKER_TRITON_DEFAULT_MODEL_NAME
    ping_mode: str = "ready"  # SAGEMAKER_TRITON_PING_MODE
    inference_type: str = "infer"  # SAGEMAKER_TRITON_INFERENCE_TYPE: what /invocations runs (infer | generate | generate_stream)


@dataclass(slots=True, frozen=True)
class VertexAiSettings:
    """--allow-vertex-ai's endpoint: AIP_PREDICT_ROUTE forwards a v2 inference body to the default model (or to
    the API the X-Vertex-Ai-Triton-Redirect header names), AIP_HEALTH_ROUTE answers readiness."""

    address: str = "0.0.0.0"
    port: int = 8080  # --vertex-ai-port, else AIP_HTTP_PORT
    thread_count: int = 8
    default_model: str = ""  # --vertex-ai-default-model; empty: the only model the repository holds
    predict_route: str = ""  # AIP_PREDICT_ROUTE
    health_route: str = ""  # AIP_HEALTH_ROUTE


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
    # Bytes that the requests in progress on all ports may hold while they are received and decoded (bodies,
    # messages, decoded tensors; core/request_memory.py). Default: a quarter of the memory the server may use.
    request_memory_limit: int = field(default_factory=default_request_memory_limit)


@dataclass(slots=True, frozen=True)
class S3Repository:
    """One --model-repository s3://[http(s)://host:port/]bucket/path: where it is, the local folder its files are
    fetched into (the path that the rest of the server reads as the repository), and the credentials that came
    from the environment (empty: the S3 library's own default chain, e.g. an instance or pod role)."""

    url: str
    bucket: str
    prefix: str  # the path inside the bucket, without leading or trailing slashes ("" for the whole bucket)
    endpoint_url: str  # "" for AWS itself; http(s)://host:port for an S3-compatible server
    local_path: Path
    access_key_id: str = field(default="", repr=False)
    secret_access_key: str = field(default="", repr=False)
    session_token: str = field(default="", repr=False)
    region: str = ""
    profile: str = ""  # a named profile of the AWS config files (Triton's credential file can name one)


@dataclass(slots=True, frozen=True)
class GcsRepository:
    """One --model-repository gs://bucket/path on Google Cloud Storage: where it is, the local folder its files are
    fetched into, and how to reach it (the CLI took both from the environment or Triton's credential file)."""

    url: str
    bucket: str
    prefix: str  # the path inside the bucket, without leading or trailing slashes ("" for the whole bucket)
    local_path: Path
    # A credentials JSON file (a service account's key or an authorized user's); "": the attached service account
    # where there is one, else anonymous access (a public bucket), the order Triton tries.
    credentials_file: str = ""
    endpoint_url: str = ""  # "" for Google itself; http(s)://host:port for an emulator (anonymous access)


@dataclass(slots=True, frozen=True)
class AzureRepository:
    """One --model-repository as://account/container/path on Azure Blob Storage: where it is, the local folder its
    files are fetched into, and the credentials the CLI took from the environment or Triton's credential file."""

    url: str
    account: str  # the storage account that is read (AZURE_STORAGE_ACCOUNT overrides the URL's, as in Triton)
    container: str
    prefix: str  # the path inside the container, without leading or trailing slashes
    local_path: Path
    account_key: str = field(default="", repr=False)  # "": anonymous access (a public container)
    # AZURE_STORAGE_CONNECTION_STRING: the endpoint (BlobEndpoint, e.g. Azurite's) and the credential in one string;
    # when set it is used instead of the account's public endpoint and account_key.
    connection_string: str = field(default="", repr=False)


@dataclass(slots=True, frozen=True)
class SchedulerDelay:
    """tritonserver's testing hook, kept because Triton's own QA suite (L0_sequence_batcher) relies on it: with
    TRITONSERVER_DELAY_SCHEDULER=N a sequence batcher's instances start executing only once N requests wait in its
    slots, and with TRITONSERVER_BACKLOG_DELAY_SCHEDULER=M also M in the backlog of unended sequences, so that tests
    can make known batches."""

    queued: int = 0
    backlogged: int = 0


@dataclass(slots=True)
class ServerSettings:
    model_repositories: list[Path] = field(default_factory=list)
    model_control_mode: str = "none"  # none | poll | explicit
    repository_poll_secs: float = 15.0
    load_models: list[str] = field(default_factory=list)
    model_config_name: str = ""
    repoagent_directory: Path | None = None  # where a user's own repository agents live (DIR/<name>/agent.py)
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
    scheduler_delay: SchedulerDelay = field(default_factory=SchedulerDelay)
    metrics_config: dict[str, str] = field(default_factory=dict)
    pinned_memory_pool_byte_size: int = 268_435_456  # --pinned-memory-pool-byte-size, for the pinned-memory metrics
    # --backend-config: backend name ("" for global settings) -> key -> value.
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    # --trace-config (and the older --trace-* flags) as trace settings: trace_file, trace_level, trace_rate, ...
    trace_config: dict[str, Any] = field(default_factory=dict)
    # The cloud endpoints, None unless --allow-sagemaker / --allow-vertex-ai (or AIP_MODE=PREDICTION) turn them on.
    sagemaker: SagemakerSettings | None = None
    vertex_ai: VertexAiSettings | None = None
    # tritonserver flags given on the command line that Nereid accepts but does not act on.
    ignored_flags: list[str] = field(default_factory=list)
    # -- model orchestration: loading on demand, the memory budget, eviction, pins and groups ----------------
    model_load_on_demand: bool = False
    model_load_on_demand_timeout_secs: float = 60.0
    model_load_failure_backoff_secs: float = 10.0  # a failed load on demand is not retried for this long
    model_memory_budget: MemoryBudget | None = None
    model_eviction_policy: str = "frequency"  # frequency (decayed request counts, per byte under a budget; then recency) | lru
    model_idle_unload_secs: float = 0.0  # 0: never
    model_group_limits: dict[str, int] = field(default_factory=dict)  # group name -> most resident at once
    model_footprint_state_file: str = ""  # "": footprints are not remembered across restarts
    model_footprint_resample_secs: float = 10.0
    # -- rollouts (rollouts/): where their state survives restarts; "": rollouts end with the server -----------------
    rollout_state_file: str = ""
    # -- monitoring (monitoring/): drift, data quality and the payload log over sampled requests ------------------
    monitoring_samples_per_second: float = 50.0  # 0: monitoring off
    monitoring_window_secs: float = 60.0
    monitoring_reference_requests: int = 500
    payload_log_dir: str = ""  # "": no payload log
    payload_log_share: float = 1.0  # of the monitored samples
    payload_log_max_bytes: int = 64 << 20
    payload_log_backups: int = 5
    # -- the operator dashboard (/dashboard on the HTTP port) ---------------------------------------------------
    allow_dashboard: bool = True
    dashboard_reports_dir: str = ""  # where `nereid analyze` reports are listed from; "": no reports view
    # -- model repositories in object stores: each is fetched into its local_path, which is also in
    # model_repositories (repository/remote_copy.py) ------------------------------------------------------------
    s3_repositories: list[S3Repository] = field(default_factory=list)
    gcs_repositories: list[GcsRepository] = field(default_factory=list)
    azure_repositories: list[AzureRepository] = field(default_factory=list)
