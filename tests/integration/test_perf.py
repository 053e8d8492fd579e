"""`nereid perf` against real servers: a local Nereid (HTTP, gRPC, streaming, shared memory, request rate,
CLI outputs and bad-input messages) and, where it is here, real Triton (decoupled streaming, sequences)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from nereid.tools.perf import CSV_COLUMNS, PerfConfig, PerfResult, main, run_perf
from tests.conftest import EXAMPLES, WITHOUT_LLM
from tests.reference_triton import ReferenceTriton
from tests.servers import ROOT, RunningServer, start_nereid, start_real_triton

FAST: dict[str, Any] = {"measurement_interval_ms": 250, "max_trials": 3, "stability_percentage": 50.0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_nereid(EXAMPLES, *WITHOUT_LLM, "--log-info=false", "--allow-client-shm=true", log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    running.stop()


def _success_count(server: RunningServer, model: str = "simple") -> int:
    stats = requests.get(f"{server.base}/v2/models/{model}/stats", timeout=5).json()["model_stats"]
    return sum(item["inference_stats"]["success"]["count"] for item in stats)


def _check_against_server(results: list[PerfResult], before: int, after: int) -> None:
    # Over the whole run the server saw exactly the requests the workers completed (all stop before returning).
    assert after - before == sum(r.completed_total for r in results)
    for result in results:
        assert result.error_count == 0 and result.request_count > 0
        assert result.sent_total == result.completed_total
        server = result.server
        assert server is not None
        # In the measured windows, client and server counts differ by at most the requests in flight at the two
        # window edges (plus a few for the time between cutting the window and reading the statistics).
        slack = 2 * max(result.concurrency, 1) + 0.05 * result.request_count
        assert abs(server.request_count - result.request_count) <= slack, (server.request_count, result.request_count)
        assert server.inference_count == server.request_count * result.batch_size
        assert server.compute_infer_us > 0 and server.avg_request_us < result.latency.avg_us
        assert result.throughput == pytest.approx(result.request_count * result.batch_size / result.window_s)
        assert 0 < result.latency.p50_us <= result.latency.p90_us <= result.latency.p95_us <= result.latency.p99_us
        assert result.client_cpu_percent > 0


def test_http_concurrency_counts_agree_with_server_statistics(server: RunningServer) -> None:
    before = _success_count(server)
    results = run_perf(PerfConfig("simple", url=server.http_url, concurrency_range=(1, 3, 2), batch_size=2, **FAST))
    _check_against_server(results, before, _success_count(server))
    assert [r.concurrency for r in results] == [1, 3]
    assert results[0].protocol == "http" and results[0].workers == 1


def test_grpc_unary_counts_agree_with_server_statistics(server: RunningServer) -> None:
    before = _success_count(server)
    results = run_perf(PerfConfig("simple", url=server.grpc_url, protocol="grpc", concurrency_range=(2, 2, 1), **FAST))
    _check_against_server(results, before, _success_count(server))


def test_grpc_streaming_reports_first_response_and_one_response_per_request(server: RunningServer) -> None:
    before = _success_count(server)
    (result,) = run_perf(PerfConfig("simple", url=server.grpc_url, protocol="grpc", streaming=True, concurrency_range=(2, 2, 1), **FAST))
    _check_against_server([result], before, _success_count(server))
    assert result.responses_per_request == 1.0 and result.first_response is not None
    assert result.first_response.avg_us <= result.latency.avg_us
    before = _success_count(server)
    (rated,) = run_perf(PerfConfig("simple", url=server.grpc_url, protocol="grpc", streaming=True, request_rate_range=(200.0, 200.0, 1.0), **FAST))
    assert rated.requests_per_s == pytest.approx(200, rel=0.15) and rated.responses_per_request == 1.0
    assert _success_count(server) - before == rated.completed_total


def test_request_rate_mode_keeps_the_asked_rate(server: RunningServer) -> None:
    before = _success_count(server)
    results = run_perf(
        PerfConfig("simple", url=server.http_url, request_rate_range=(150.0, 300.0, 150.0), measurement_interval_ms=500, max_trials=3, stability_percentage=50.0)
    )
    _check_against_server(results, before, _success_count(server))
    for result in results:
        assert result.mode == "request_rate" and result.requests_per_s == pytest.approx(result.request_rate, rel=0.1)
        assert result.client_cpu_percent < 50  # the scheduler sleeps between sends, it does not spin
    (poisson,) = run_perf(
        PerfConfig("simple", url=server.grpc_url, protocol="grpc", request_rate_range=(200.0, 200.0, 1.0), request_distribution="poisson", measurement_interval_ms=500, max_trials=3, stability_percentage=100.0)
    )
    assert poisson.requests_per_s == pytest.approx(200, rel=0.3)


def test_system_shared_memory_inputs_and_outputs_are_registered_and_cleaned(server: RunningServer) -> None:
    before = _success_count(server)
    for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
        results = run_perf(PerfConfig("simple", url=url, protocol=protocol, shared_memory="system", concurrency_range=(2, 2, 1), **FAST))
        assert results[0].completed_total > 0
    assert _success_count(server) - before > 0
    assert requests.get(f"{server.base}/v2/systemsharedmemory/status", timeout=5).json() == []
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(f"nereid_perf_{os.getpid()}_")]


def test_cli_prints_a_table_and_writes_perf_analyzer_csv_and_json(server: RunningServer, tmp_path: Path) -> None:
    csv_path, json_path = tmp_path / "perf.csv", tmp_path / "perf.json"
    completed = subprocess.run(
        [sys.executable, "-m", "nereid", "perf", "-m", "simple", "-u", server.http_url, "--concurrency-range", "1:2",
         "-p", "300", "-r", "4", "-s", "50", "-f", str(csv_path), "--json", str(json_path), "--input-tensor-format", "json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert "concurrency 1: window 1/4" in completed.stderr  # live progress
    assert completed.stdout.splitlines()[0].split()[:2] == ["Concurrency", "Infer/s"]
    rows = list(csv.reader(io.StringIO(csv_path.read_text())))
    assert rows[0] == ["Concurrency", *CSV_COLUMNS]
    assert sorted(r[0] for r in rows[1:]) == ["1", "2"]
    assert [float(r[1]) for r in rows[1:]] == sorted(float(r[1]) for r in rows[1:])  # by increasing throughput
    doc = json.loads(json_path.read_text())
    assert doc["model"] == "simple" and [r["concurrency"] for r in doc["results"]] == [1, 2]
    assert doc["results"][0]["server"]["request_count"] > 0 and doc["results"][0]["latency"]["p99_us"] > 0


def test_json_to_stdout_parses(server: RunningServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-m", "simple_string", "-u", server.grpc_url, "-i", "grpc", "--shape", "INPUT0:3", "--json", "-q", "-p", "300", "-r", "4", "-s", "50"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["protocol"] == "grpc" and doc["results"][0]["throughput"] > 0
    assert "Concurrency" in captured.err  # the table moves to stderr


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (["--concurrency-range", "4:x"], "--concurrency-range: expected whole numbers start[:end[:step]], got '4:x'", 2),
        (["--request-rate-range", "0"], "--request-rate-range: expected start[:end[:step]] with start > 0", 2),
        (["-m", "no_such_model"], "model 'no_such_model' is not available on", 1),
        (["-m", "simple", "-b", "64"], "-b 64: exceeds max_batch_size 8 of model 'simple'", 1),
        (["-m", "identity_fp32"], "input 'INPUT0' has variable dimensions [-1]: give its shape with --shape INPUT0:N", 1),
        (["-m", "simple", "--input-data", "/no/such.json"], "--input-data: expected random, zero, a JSON file or a directory", 1),
    ],
)
def test_bad_input_gets_one_clear_line(server: RunningServer, capsys: pytest.CaptureFixture[str], args: list[str], message: str, code: int) -> None:
    argv = ["-u", server.http_url, *args] if "-m" in args else ["-m", "simple", "-u", server.http_url, *args]
    assert main(argv) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("nereid perf: error: ")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unreachable_server_gets_one_clear_line(capsys: pytest.CaptureFixture[str], protocol: str) -> None:
    from tests.servers import free_port

    assert main(["-m", "simple", "-i", protocol, "-u", f"127.0.0.1:{free_port()}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("nereid perf: error: cannot reach the server at 127.0.0.1:") and f"over {'gRPC' if protocol == 'grpc' else 'HTTP'}" in err
    assert err.count("\n") == 1 and "Traceback" not in err


# -- real Triton: decoupled streaming and sequence models (its Python backend has both) -------------------------

_DECOUPLED = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for _ in range(3):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

_SEQUENCE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
'''

_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {max_batch}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{extra}
"""


@pytest.fixture(scope="module")
def triton(reference_triton: ReferenceTriton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = tmp_path_factory.mktemp("triton_repository")
    models = {
        "repeat3": (_DECOUPLED, 0, "model_transaction_policy { decoupled: true }"),
        "seq": (_SEQUENCE, 4, "sequence_batching { max_sequence_idle_microseconds: 1000000 }"),
    }
    for name, (code, max_batch, extra) in models.items():
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(_CONFIG.format(name=name, max_batch=max_batch, extra=extra))
        (repository / name / "1" / "model.py").write_text(code)
    running = start_real_triton(repository, "--log-info=false", "--exit-timeout-secs=2")
    yield running
    running.stop()


def test_decoupled_model_streams_three_responses_per_request_on_real_triton(triton: RunningServer) -> None:
    before = _success_count(triton, "repeat3")
    (result,) = run_perf(PerfConfig("repeat3", url=triton.grpc_url, protocol="grpc", streaming=True, concurrency_range=(2, 2, 1), **FAST))
    assert result.responses_per_request == 3.0
    assert result.first_response is not None and result.first_response.avg_us < result.latency.avg_us
    assert _success_count(triton, "repeat3") - before == result.completed_total
    with pytest.raises(Exception, match="decoupled .* use -i grpc --streaming"):
        run_perf(PerfConfig("repeat3", url=triton.http_url, **FAST))


def test_sequence_model_runs_clean_on_real_triton(triton: RunningServer) -> None:
    # Triton refuses a request for an unknown sequence without START: no error means the flags are right.
    before = _success_count(triton, "seq")
    for protocol, url in (("http", triton.http_url), ("grpc", triton.grpc_url)):
        (result,) = run_perf(PerfConfig("seq", url=url, protocol=protocol, concurrency_range=(3, 3, 1), sequence_length=5, **FAST))
        assert result.error_count == 0 and result.completed_total > 0
        before += result.completed_total
        assert _success_count(triton, "seq") == before
