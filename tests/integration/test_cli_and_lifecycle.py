"""`nereid serve` takes tritonserver's flags with their meanings, refuses unknown ones, drains on SIGTERM/SIGINT
within --exit-timeout-secs, and honours --exit-on-error and --strict-readiness; checked on real processes."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from nereid.serve_flags import parse_serve_args
from tests.integration.onnx_builders import (
    add_constant,
    busy_body,
    busy_iterations,
    busy_loop,
    cpu_seconds,
    pending_requests,
    write,
)
from tests.servers import ROOT, RunningServer, free_port, start_nereid

BUSY_CONFIG = 'backend: "onnxruntime"\nparameters { key: "intra_op_thread_count" value { string_value: "1" } }\n'
ADDER_CONFIG = 'backend: "onnxruntime"\nmax_batch_size: 8\n'


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lifecycle_repo")
    busy_loop(root / "busy" / "1" / "model.onnx")
    write(root / "busy" / "config.pbtxt", BUSY_CONFIG)
    add_constant(root / "adder" / "1" / "model.onnx", 1.0)
    write(root / "adder" / "config.pbtxt", ADDER_CONFIG)
    add_constant(root / "auto" / "1" / "model.onnx", 2.0)  # no config.pbtxt
    return root


@pytest.fixture(scope="module")
def second_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("second_repo")
    add_constant(root / "elsewhere" / "1" / "model.onnx", 3.0)
    write(root / "elsewhere" / "config.pbtxt", ADDER_CONFIG)
    return root


@pytest.fixture(scope="module")
def broken_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("broken_repo")
    add_constant(root / "adder" / "1" / "model.onnx", 1.0)
    write(root / "adder" / "config.pbtxt", ADDER_CONFIG)
    write(root / "broken" / "config.pbtxt", ADDER_CONFIG)
    (root / "broken" / "1").mkdir()  # no model file
    return root


def _add(server: RunningServer, model: str) -> float:
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    return float(httpclient.InferenceServerClient(server.http_url).infer(model, [inp]).as_numpy("OUTPUT0")[0, 0])


def _refused(url: str) -> bool:
    try:
        requests.get(url, timeout=5)
    except requests.ConnectionError:
        return True
    return False


def _wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "nereid", "serve", *args]


# ================================================ flags ================================================
def test_every_tritonserver_flag_is_accepted_and_applied(repo: Path, second_repo: Path, tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    server = start_nereid(
        [],
        f"--model-store={repo}",  # the old name of --model-repository
        "--model-repository", str(second_repo),  # repeatable, space-separated form
        "--model-control-mode=explicit",
        "--load-model=auto",
        "--load-model", "elsewhere",
        "--repository-poll-secs=5",
        "--model-config-name=production",
        "--strict-model-config=false",
        "--exit-on-error=true",
        "--strict-readiness", "true",
        "--exit-timeout-secs=10",
        "--allow-http=true",
        "--allow-grpc=true",
        "--allow-metrics=true",
        "--allow-cpu-metrics=false",
        "--metrics-interval-ms=500",
        "--http-max-input-size=4096",
        "--http-thread-count=2",
        "--log-verbose=1",
        "--log-info=true",
        "--log-warning=true",
        "--log-error=true",
        "--log-format=ISO8601",
        f"--log-file={log_file}",
        "--id", "nereid-under-test",
        log_dir=tmp_path,
    )
    try:
        http = httpclient.InferenceServerClient(server.http_url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        # --id names the server in its metadata.
        assert http.get_server_metadata()["name"] == "nereid-under-test"
        assert grpc.get_server_metadata().name == "nereid-under-test"
        # Both repositories are served; explicit mode loaded only the --load-model models.
        assert _add(server, "auto") == 2.0  # no config.pbtxt: auto-complete is on (--strict-model-config=false)
        assert _add(server, "elsewhere") == 3.0
        assert not http.is_model_ready("adder")
        assert {e["name"] for e in http.get_model_repository_index()} == {"adder", "auto", "busy", "elsewhere"}
        # The logging flags are the logging settings, and the log goes to --log-file in ISO8601.
        settings = http.get_log_settings()
        assert settings["log_verbose_level"] == 1
        assert settings["log_format"] == "ISO8601"
        assert settings["log_file"] == str(log_file)
        _wait_for(lambda: "auto" in log_file.read_text(), 10, "the log file to be written")
        lines = log_file.read_text().splitlines()
        iso = [line for line in lines if re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWE] \d+ \S+:\d+\] ", line)]
        assert iso and any("auto" in line for line in iso)
        assert not [line for line in lines if re.match(r"[IWE]\d{4} ", line)]  # no default-format lines
        assert "successfully loaded" not in server.log()  # stdout/stderr stay quiet with --log-file
        # --http-max-input-size bounds request bodies.
        big = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}], "pad": "x" * 5000}
        reply = requests.post(f"{server.base}/v2/models/auto/infer", json=big)
        assert reply.status_code == 400
        assert "4096" in reply.json()["error"]
    finally:
        assert server.stop() == 0, server.log()


def test_flags_map_onto_settings_with_tritons_defaults(repo: Path) -> None:
    defaults = parse_serve_args(["--model-repository", str(repo)])
    assert (defaults.http_port, defaults.grpc_port, defaults.metrics_port) == (8000, 8001, 8002)
    assert defaults.model_control_mode == "none"
    assert defaults.exit_on_error and defaults.strict_readiness and defaults.auto_complete_config
    assert defaults.exit_timeout_secs == 30
    assert defaults.repository_poll_secs == 15
    assert defaults.server_id == "triton"
    assert defaults.model_repositories == [repo.resolve()]
    assert not parse_serve_args(["--model-store", str(repo), "--strict-model-config=true"]).auto_complete_config
    assert not parse_serve_args(["--model-store", str(repo), "--strict-model-config"]).auto_complete_config
    assert not parse_serve_args(["--model-store", str(repo), "--disable-auto-complete-config"]).auto_complete_config
    two = parse_serve_args(["--model-store", "a", "--model-repository=b", "--load-model=*", "--exit-on-error=false"])
    assert [p.name for p in two.model_repositories] == ["a", "b"]
    assert two.load_models == ["*"]
    assert not two.exit_on_error
    quiet = parse_serve_args(["--model-store=a", "--log-info=false", "--log-warning=0", "--log-error", "no", "--log-verbose=2"])
    assert (quiet.log_info, quiet.log_warning, quiet.log_error, quiet.log_verbose) == (False, False, False, 2)


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--no-such-flag=1"], "--no-such-flag"),
        (["--model-control-mode=sometimes"], "sometimes"),
        (["--exit-on-error=maybe"], "maybe"),
        (["--http-port=eighty"], "eighty"),
    ],
)
def test_unknown_or_malformed_flag_fails_with_a_clear_message(repo: Path, args: list[str], phrase: str) -> None:
    result = subprocess.run(
        _serve_command("--model-repository", str(repo), *args), capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode != 0
    assert phrase in result.stderr
    assert "nereid serve" in result.stderr


def test_missing_model_repository_flag_fails_with_a_clear_message() -> None:
    result = subprocess.run(_serve_command("--http-port=0"), capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode != 0
    assert "--model-repository" in result.stderr


def test_allow_flags_turn_grpc_and_metrics_off_and_log_info_false_silences_info(repo: Path, tmp_path: Path) -> None:
    server = start_nereid(repo, "--allow-grpc=false", "--allow-metrics=false", "--log-info=false", log_dir=tmp_path)
    try:
        assert _add(server, "adder") == 1.0
        with pytest.raises(Exception):  # noqa: B017 - any connection error will do
            grpcclient.InferenceServerClient(server.grpc_url).is_server_live(client_timeout=5)
        assert _refused(f"http://127.0.0.1:{server.metrics_port}/metrics")
        assert not [line for line in server.log().splitlines() if line.startswith("I")]
    finally:
        assert server.stop() == 0, server.log()


def test_allow_http_false_serves_grpc_only(repo: Path, tmp_path: Path) -> None:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log = tmp_path / "grpc-only.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            _serve_command(
                "--model-repository", str(repo), "--allow-http=false", f"--http-port={http_port}",
                f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}", "--grpc-address=127.0.0.1",
                "--metrics-address=127.0.0.1", "--http-address=127.0.0.1",
            ),
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")

        def ready() -> bool:
            assert process.poll() is None, log.read_text()
            try:
                return bool(client.is_server_ready(client_timeout=1))
            except Exception:
                return False

        _wait_for(ready, 60, "the gRPC endpoint")
        inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
        assert client.infer("adder", [inp]).as_numpy("OUTPUT0")[0, 0] == 1.0
        assert _refused(f"http://127.0.0.1:{http_port}/v2/health/live")
        assert requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.read_text()


# ============================================ shutdown =============================================
class _InFlight:
    """Requests to the busy model sent from threads (raw HTTP and gRPC); results kept by name."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.results: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []

    def http(self, name: str, iterations: int) -> None:
        def run() -> None:
            try:
                reply = requests.post(f"{self.server.base}/v2/models/busy/infer", json=busy_body(iterations), timeout=120)
                self.results[name] = (reply.status_code, reply.json()["outputs"][1]["data"][0] if reply.ok else reply.text)
            except requests.RequestException as exc:
                self.results[name] = ("error", str(exc))

        self._start(run)

    def grpc(self, name: str, iterations: int) -> None:
        def run() -> None:
            client = grpcclient.InferenceServerClient(self.server.grpc_url)
            inp = grpcclient.InferInput("ITERS", [1], "INT64")
            inp.set_data_from_numpy(np.array([iterations], dtype=np.int64))
            try:
                self.results[name] = (200, int(client.infer("busy", [inp], client_timeout=120).as_numpy("ITERS_OUT")[0]))
            except Exception as exc:
                self.results[name] = ("error", str(exc))

        self._start(run)

    def _start(self, target: Any) -> None:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(120)


@pytest.fixture
def busy_server(repo: Path, tmp_path: Path) -> Iterator[RunningServer]:
    server = start_nereid(repo, "--exit-timeout-secs=30", log_dir=tmp_path)
    yield server
    server.stop(signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_drains_requests_in_flight_then_exits_0(busy_server: RunningServer, sig: signal.Signals) -> None:
    server = busy_server
    iterations = busy_iterations(server.base, "busy", 1.2)
    flight = _InFlight(server)
    baseline = cpu_seconds(server.process.pid)
    flight.grpc("executing", iterations)
    _wait_for(lambda: cpu_seconds(server.process.pid) - baseline > 0.15, 30, "the first request to execute")
    flight.http("queued", iterations)
    _wait_for(lambda: pending_requests(server.metrics_port, "busy") == 1, 30, "a request queued behind the first")
    signalled = time.monotonic()
    server.process.send_signal(sig)
    # New work is refused at once while the accepted requests finish.
    _wait_for(lambda: _not_ready(server), 10, "readiness to drop")
    late = requests.post(f"{server.base}/v2/models/busy/infer", json=busy_body(1), timeout=30) if not _refused(
        server.base + "/v2/health/live"
    ) else None
    assert late is None or late.status_code != 200
    assert server.process.wait(30) == 0, server.log()
    assert time.monotonic() - signalled < 30
    flight.join()
    assert flight.results == {"executing": (200, iterations), "queued": (200, iterations)}, server.log()


def test_exit_timeout_bounds_the_drain_and_exits_1_like_triton(repo: Path, tmp_path: Path) -> None:
    server = start_nereid(repo, "--exit-timeout-secs=1", log_dir=tmp_path)
    try:
        long_run = busy_iterations(server.base, "busy", 30.0)
        flight = _InFlight(server)
        baseline = cpu_seconds(server.process.pid)
        flight.http("executing", long_run)
        _wait_for(lambda: cpu_seconds(server.process.pid) - baseline > 0.15, 30, "the long request to execute")
        flight.http("queued", 1)
        _wait_for(lambda: pending_requests(server.metrics_port, "busy") == 1, 30, "a request queued behind it")
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(30)
        waited = time.monotonic() - signalled
        assert code == 1, server.log()
        assert waited < 6, f"exit took {waited:.1f}s with --exit-timeout-secs=1"
        assert "Exit timeout expired" in server.log()
        flight.join()
        assert all(result[0] != 200 for result in flight.results.values())
    finally:
        server.stop(signal.SIGKILL)


def _not_ready(server: RunningServer) -> bool:
    try:
        return requests.get(server.base + "/v2/health/ready", timeout=5).status_code != 200
    except requests.ConnectionError:
        return True




# ==================================== --exit-on-error, --strict-readiness ====================================
def test_exit_on_error_true_stops_startup_when_a_model_fails(broken_repo: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError) as caught:
        start_nereid(broken_repo, log_dir=tmp_path, timeout=60)
    message = str(caught.value)
    assert re.search(r"server exited with [1-9]", message), message
    assert "broken" in message


def test_exit_on_error_false_serves_the_models_that_loaded(broken_repo: Path, tmp_path: Path) -> None:
    server = start_nereid(broken_repo, "--exit-on-error=false", log_dir=tmp_path, need_ready=False)
    try:
        http = httpclient.InferenceServerClient(server.http_url)
        assert http.is_server_live()
        # --strict-readiness defaults to true: a model that failed to load makes the server not ready.
        assert not http.is_server_ready()
        assert not grpcclient.InferenceServerClient(server.grpc_url).is_server_ready()
        assert _add(server, "adder") == 1.0
        broken = [e for e in http.get_model_repository_index() if e["name"] == "broken"]
        assert broken and broken[0]["state"] == "UNAVAILABLE" and "model.onnx" in broken[0]["reason"]
    finally:
        assert server.stop() == 0, server.log()


def test_strict_readiness_false_is_ready_once_started_despite_failed_models(broken_repo: Path, tmp_path: Path) -> None:
    server = start_nereid(broken_repo, "--exit-on-error=false", "--strict-readiness=false", log_dir=tmp_path)
    try:
        assert httpclient.InferenceServerClient(server.http_url).is_server_ready()
        assert grpcclient.InferenceServerClient(server.grpc_url).is_server_ready()
        assert not httpclient.InferenceServerClient(server.http_url).is_model_ready("broken")
    finally:
        assert server.stop() == 0, server.log()


def test_strict_readiness_true_is_ready_when_every_model_loaded(repo: Path, tmp_path: Path) -> None:
    server = start_nereid(repo, "--strict-readiness=true", log_dir=tmp_path)
    try:
        assert httpclient.InferenceServerClient(server.http_url).is_server_ready()
    finally:
        assert server.stop() == 0, server.log()


def test_tritonserver_flags_without_an_effect_are_accepted_with_a_warning(tmp_path: Path) -> None:
    """Launch scripts written for tritonserver keep working: tuning flags Nereid has no use for are logged."""
    from tests.conftest import EXAMPLES
    from tests.servers import start_nereid as start

    running = start(
        EXAMPLES,
        "--cuda-memory-pool-byte-size=0:0",
        "--backend-directory=/opt/tritonserver/backends",
        "--backend-config=onnxruntime,default-max-batch-size=16",
        "--grpc-infer-allocation-pool-size=8",
        log_dir=tmp_path,
    )
    try:
        config = requests.get(f"{running.base}/v2/models/mlp_autocomplete/config", timeout=5).json()
        assert config["max_batch_size"] == 16  # --backend-config's default-max-batch-size reached auto-complete
    finally:
        running.stop()
    log = running.log()
    assert "--cuda-memory-pool-byte-size is accepted for compatibility" in log
    assert "--backend-directory is accepted for compatibility" in log
