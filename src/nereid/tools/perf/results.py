"""`PerfResult`: what one load level measured, client side and server side, in a shape `nereid analyze`, the
CSV/JSON writers and tests all read."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from nereid.tools.perf.server_stats import ServerBreakdown

__all__ = ["LatencySummary", "PerfResult"]


@dataclass(slots=True)
class LatencySummary:
    """Client-observed latencies in microseconds."""

    avg_us: float = 0.0
    p50_us: float = 0.0
    p90_us: float = 0.0
    p95_us: float = 0.0
    p99_us: float = 0.0
    extra: dict[int, float] = field(default_factory=dict)  # --percentile N when not one of the above

    def percentile(self, p: int) -> float:
        named = {50: self.p50_us, 90: self.p90_us, 95: self.p95_us, 99: self.p99_us}
        return named[p] if p in named else self.extra[p]


@dataclass(slots=True)
class PerfResult:
    mode: str  # concurrency | request_rate
    concurrency: int  # the concurrency asked for (0 in request-rate mode)
    request_rate: float  # the rate asked for (0.0 in concurrency mode)
    batch_size: int
    protocol: str
    model: str
    throughput: float  # inferences per second (requests x batch size), perf_analyzer's "Inferences/Second"
    requests_per_s: float
    request_count: int  # requests completed in the measured windows
    error_count: int
    window_s: float  # measured time (the last windows, merged)
    latency: LatencySummary
    client_send_us: float  # writing the request
    client_recv_us: float  # reading and parsing the response
    server: ServerBreakdown | None  # None when the statistics endpoint gave nothing
    stable: bool
    windows: int  # measurement windows taken at this level
    client_cpu_percent: float  # all load workers together; 100 = one core busy
    workers: int
    sent_total: int  # every request sent at this level, warm-up and in-between windows included
    completed_total: int
    delayed_requests: int = 0  # request-rate mode: sent more than 2 ms after their scheduled time
    first_response: LatencySummary | None = None  # streaming: time to first response
    responses_per_request: float | None = None  # streaming: average responses per request

    @property
    def level(self) -> float:
        return float(self.concurrency) if self.mode == "concurrency" else self.request_rate

    @property
    def network_server_us(self) -> float:
        """perf_analyzer's "Network+Server Send/Recv": latency not explained by client send/recv or server
        queue and compute (so network, and the server's own overhead)."""
        server = self.server
        accounted = self.client_send_us + self.client_recv_us
        if server is not None:
            accounted += server.queue_us + server.compute_input_us + server.compute_infer_us + server.compute_output_us
        return max(0.0, self.latency.avg_us - accounted)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["latency"]["extra"] = {str(k): v for k, v in self.latency.extra.items()}
        if self.first_response is not None:
            data["first_response"]["extra"] = {str(k): v for k, v in self.first_response.extra.items()}
        data["network_server_us"] = self.network_server_us
        return data
