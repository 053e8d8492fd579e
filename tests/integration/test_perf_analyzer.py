"""NVIDIA's perf_analyzer (from the tritonclient 2.51.0 wheel) against a real Nereid server, in every mode Triton's
users run it: concurrency (sync and async) and request-rate load, system shared memory, sequences, and streaming a
decoupled model, over HTTP and gRPC. Each run is bounded (count windows of 100 requests, at most 3 trials) and must
end cleanly."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.perf_analyzer import PerfAnalyzer, PerfAnalyzerUnavailable, install_perf_analyzer
from tests.perf_analyzer_models import ADD_SUB, ADD_SUB_BATCHED, DECOUPLED, SEQUENCE, build_perf_analyzer_repository
from tests.servers import RunningServer, start_nereid

# 100 requests per window, stable by construction after 3 windows: a few hundred requests per run.
_BOUNDED = ["--measurement-mode", "count_windows", "--measurement-request-count", "100", "--max-trials", "3"]
_BOUNDED += ["--stability-percentage", "999"]
# The CSV's server-side columns, each an average in microseconds taken from the server's statistics.
_SERVER_COLUMNS = ["Server Queue", "Server Compute Input", "Server Compute Infer", "Server Compute Output"]

MODES: dict[str, list[str]] = {
    "concurrency": ["-m", ADD_SUB, "--concurrency-range", "2"],
    "dynamic-batching": ["-m", ADD_SUB_BATCHED, "--concurrency-range", "8"],
    # Async mode: a few threads keep the requests in flight, each request with an id of its own.
    "async": ["-m", ADD_SUB_BATCHED, "--concurrency-range", "8", "--async"],
    "shared-memory": ["-m", ADD_SUB, "--shared-memory", "system", "--output-shared-memory-size", "64"],
    "request-rate": ["-m", ADD_SUB, "--request-rate-range", "200"],
    "sequence": ["-m", SEQUENCE, "--sequence-length", "5", "--concurrency-range", "2"],
    "streaming": ["-m", DECOUPLED, "--streaming"],
}
CASES = [
    (mode, protocol) for mode in MODES for protocol in ("http", "grpc") if (mode, protocol) != ("streaming", "http")
]


@pytest.fixture(scope="module")
def perf_analyzer() -> PerfAnalyzer:
    try:
        return install_perf_analyzer()
    except PerfAnalyzerUnavailable as exc:
        pytest.skip(f"perf_analyzer cannot be installed here: {exc}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = build_perf_analyzer_repository(tmp_path_factory.mktemp("perf-analyzer") / "repo")
    running = start_nereid(repo, "--allow-client-shm=true", "--log-verbose=0")
    yield running
    running.stop()


@pytest.mark.parametrize(("mode", "protocol"), CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_perf_analyzer_mode_runs_cleanly_against_nereid(
    perf_analyzer: PerfAnalyzer, server: RunningServer, tmp_path: Path, mode: str, protocol: str
) -> None:
    url = server.http_url if protocol == "http" else server.grpc_url
    result = perf_analyzer.measure(
        *MODES[mode], "-i", protocol, "-u", url, *_BOUNDED, csv_path=tmp_path / "report.csv", timeout=120
    )
    assert result.throughput > 0, result.output
    # perf_analyzer counts failed requests and prints them; a clean run has none.
    assert not re.search(r"(?i)\berror\b|failed", result.output), result.output
    # Its server-side section comes from Nereid's statistics extension: the model's compute was counted there, and
    # the server's part of a request (queue and compute, microseconds) fits inside the latency its client saw:
    # "Network+Server Send/Recv" is that latency less the client's and the server's parts, floored at 0.
    server_us = {column: int(result.row[column]) for column in _SERVER_COLUMNS}
    assert "Server:" in result.output and server_us["Server Compute Infer"] > 0, result.output
    assert int(result.row["Network+Server Send/Recv"]) > 0, (server_us, result.row)
    assert sum(server_us.values()) <= int(result.row["p99 latency"]), (server_us, result.row)
    assert re.search(r"Inference count: [1-9]", result.output), result.output
    if mode == "streaming":
        responses = re.search(r"Response Throughput: ([\d.]+)", result.output)
        assert responses is not None and float(responses.group(1)) > result.throughput, result.output


def test_shared_memory_mode_needs_allow_client_shm(perf_analyzer: PerfAnalyzer, tmp_path: Path) -> None:
    """Without --allow-client-shm, perf_analyzer's region registration is refused with the flag's name."""
    repo = build_perf_analyzer_repository(tmp_path / "repo")
    running = start_nereid(repo, "--log-verbose=0")
    try:
        done = perf_analyzer.run(*MODES["shared-memory"], "-i", "http", "-u", running.http_url, *_BOUNDED, timeout=120)
    finally:
        running.stop()
    assert done.returncode != 0
    assert "--allow-client-shm" in done.stdout + done.stderr
