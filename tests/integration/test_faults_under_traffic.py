"""Faults while clients keep sending: 50 reloads of a model in poll and in explicit mode (no request fails), a
Python worker killed with SIGKILL (only its in-flight requests fail, it restarts, recovery measured), SIGTERM
(requests in flight complete, new connections are refused, exit within --exit-timeout-secs), and a repository
broken in several ways at start-up (the rest serve, each broken model shows why)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.integration.onnx_builders import add_constant, write
from tests.servers import RunningServer, start_nereid

ADDER_CONFIG = 'backend: "onnxruntime"\nmax_batch_size: 8\n'
_BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}]}

# A Python model that takes a few milliseconds per request, so that requests are in flight when its worker dies,
# and answers with its worker's pid.
_SLOW_PID_MODEL = '''
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(0.01)
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            pid = np.array([os.getpid()], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value), pb_utils.Tensor("PID", pid)]))
        return responses
'''
_SLOW_PID_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] }, { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class _Outcome:
    sent: float
    done: float
    ok: bool
    value: Any = None
    error: str = ""


@dataclass
class _Load:
    """HTTP and gRPC clients sending one request after another (bounded in count and time) until stopped."""

    server: RunningServer
    model: str
    http_clients: int = 2
    grpc_clients: int = 2
    limit: int = 20_000
    outcomes: list[_Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> _Load:
        targets = [self._http] * self.http_clients + [self._grpc] * self.grpc_clients
        self._threads = [threading.Thread(target=t, daemon=True) for t in targets]
        for thread in self._threads:
            thread.start()
        _wait_for(lambda: len(self.outcomes) >= 20, 30, "traffic to flow")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def running(self) -> bool:
        return not self._stop.is_set() and len(self.outcomes) < self.limit

    def failures(self) -> list[_Outcome]:
        return [o for o in self.outcomes if not o.ok]

    def wait_for(self, condition: Callable[[_Outcome], bool], timeout: float = 30) -> None:
        start = len(self.outcomes)
        _wait_for(lambda: any(condition(o) for o in self.outcomes[start:]), timeout, f"traffic on {self.model}")

    def _http(self) -> None:
        session = requests.Session()
        url = f"{self.server.base}/v2/models/{self.model}/infer"
        while self.running():
            sent = time.monotonic()
            try:
                reply = session.post(url, json=_BODY, timeout=60)
                if reply.status_code == 200:
                    outputs = {o["name"]: o["data"] for o in reply.json()["outputs"]}
                    self.outcomes.append(_Outcome(sent, time.monotonic(), True, outputs))
                else:
                    self.outcomes.append(_Outcome(sent, time.monotonic(), False, error=f"http {reply.status_code}: {reply.text}"))
            except requests.RequestException as exc:
                self.outcomes.append(_Outcome(sent, time.monotonic(), False, error=f"http: {exc}"))
                session = requests.Session()
                time.sleep(0.01)

    def _grpc(self) -> None:
        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
        while self.running():
            sent = time.monotonic()
            try:
                result = client.infer(self.model, [inp], client_timeout=60)
                outputs = {name: result.as_numpy(name).reshape(-1).tolist() for name in ("OUTPUT0", "PID") if result.get_output(name)}
                self.outcomes.append(_Outcome(sent, time.monotonic(), True, outputs))
            except Exception as exc:  # every failure is counted; keep its message
                self.outcomes.append(_Outcome(sent, time.monotonic(), False, error=f"grpc: {exc}"))
                time.sleep(0.01)


def _adder(model_dir: Path, constant: float) -> None:
    add_constant(model_dir / "1" / "model.onnx", constant)
    write(model_dir / "config.pbtxt", ADDER_CONFIG)


# ============================================ reloads ================================================
RELOADS = 50


def _first_value(outcome: _Outcome) -> float:
    return float(outcome.value["OUTPUT0"][0])


def test_fifty_explicit_reloads_under_load_fail_no_request(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    _adder(repo / "swapped", 0.0)
    server = start_nereid(repo, "--model-control-mode=explicit", "--load-model=swapped", log_dir=tmp_path)
    try:
        client = requests.Session()
        with _Load(server, "swapped") as load:
            for constant in range(1, RELOADS + 1):
                model_file = repo / "swapped" / "1" / "model.onnx"
                add_constant(model_file.with_suffix(".tmp"), float(constant))
                os.replace(model_file.with_suffix(".tmp"), model_file)
                reply = client.post(f"{server.base}/v2/repository/models/swapped/load", timeout=60)
                assert reply.status_code == 200, reply.text
            load.wait_for(lambda o: o.ok and _first_value(o) == float(RELOADS))
        assert load.failures() == [], load.failures()[:5]
        values = {_first_value(o) for o in load.outcomes}
        assert values <= {float(c) for c in range(RELOADS + 1)}
        print(f"explicit mode: {len(load.outcomes)} requests during {RELOADS} reloads, 0 failed")
    finally:
        assert server.stop() == 0, server.log()


def test_fifty_poll_mode_reloads_under_load_fail_no_request(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    _adder(repo / "polled", 0.0)
    server = start_nereid(repo, "--model-control-mode=poll", "--repository-poll-secs=0.1", log_dir=tmp_path)
    try:
        with _Load(server, "polled") as load:
            model_file = repo / "polled" / "1" / "model.onnx"
            for constant in range(1, RELOADS + 1):
                add_constant(model_file.with_suffix(".tmp"), float(constant))
                os.replace(model_file.with_suffix(".tmp"), model_file)
                # The next change only once the poll has loaded this one: every reload really happens.
                load.wait_for(lambda o, c=float(constant): o.ok and _first_value(o) == c)
        assert load.failures() == [], load.failures()[:5]
        print(f"poll mode: {len(load.outcomes)} requests during {RELOADS} reloads, 0 failed")
    finally:
        assert server.stop() == 0, server.log()


# ======================================= worker crash =================================================
@pytest.fixture
def python_server(tmp_path: Path) -> Iterator[RunningServer]:
    repo = tmp_path / "models"
    write(repo / "slow_pid" / "1" / "model.py", _SLOW_PID_MODEL)
    write(repo / "slow_pid" / "config.pbtxt", _SLOW_PID_CONFIG)
    server = start_nereid(repo, log_dir=tmp_path)
    yield server
    assert server.stop() == 0, server.log()


def test_a_worker_killed_under_load_fails_only_its_requests_and_serves_again(python_server: RunningServer) -> None:
    clients = 4
    recoveries = []
    with _Load(python_server, "slow_pid", http_clients=2, grpc_clients=2) as load:
        for _ in range(3):
            load.wait_for(lambda o: o.ok)
            pid = int(next(o for o in reversed(load.outcomes) if o.ok).value["PID"][0])
            before = len(load.outcomes)
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            load.wait_for(lambda o, p=pid, k=killed: o.ok and o.sent > k and int(o.value["PID"][0]) != p, timeout=60)
            recovered = min(o.done for o in load.outcomes[before:] if o.ok and o.sent > killed)
            recoveries.append(recovered - killed)
            failed = [o for o in load.outcomes[before:] if not o.ok]
            # Only what the worker had in flight: at most one request per client, each with the worker's fate, and
            # none sent once the new worker answered.
            assert len(failed) <= clients, [o.error for o in failed]
            assert all("SIGKILL" in o.error for o in failed), [o.error for o in failed]
            assert all(o.sent < recovered for o in failed), "a request failed after the worker was back"
    print(f"worker SIGKILL recovery (kill -> first answer from the new worker): "
          f"{', '.join(f'{r * 1000:.0f} ms' for r in recoveries)}; failed requests {len(load.failures())}")
    assert "restarting it" in python_server.log()


# ======================================= graceful drain ===============================================
def _connect_refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


def _clean_refusal(error: str) -> bool:
    return ("http 503" in error or "UNAVAILABLE" in error) and "stopping" in error


def test_sigterm_under_load_completes_requests_in_flight_refuses_new_connections_and_exits_in_time(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write(repo / "slow_pid" / "1" / "model.py", _SLOW_PID_MODEL)
    write(repo / "slow_pid" / "config.pbtxt", _SLOW_PID_CONFIG)
    exit_timeout = 10
    server = start_nereid(repo, f"--exit-timeout-secs={exit_timeout}", log_dir=tmp_path)
    try:
        with _Load(server, "slow_pid") as load:
            load.wait_for(lambda o: o.ok)
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            _wait_for(lambda: _connect_refused(server.http_port) and _connect_refused(server.grpc_port), exit_timeout,
                      "new connections to be refused")
            refused_after = time.monotonic() - signalled
            assert server.process.wait(exit_timeout + 5) == 0, server.log()
            exited_after = time.monotonic() - signalled
        # Requests in flight across the signal complete; a request the server had not yet read may be refused,
        # but only cleanly (503 / UNAVAILABLE, "stopping"), never dropped or reset.
        drained = [o for o in load.outcomes if o.ok and o.sent < signalled < o.done]
        assert drained, "no request was in flight when the signal came"
        lost = [o for o in load.outcomes if not o.ok and o.sent < signalled and not _clean_refusal(o.error)]
        assert lost == [], [o.error for o in lost]
        assert exited_after < exit_timeout
        print(f"SIGTERM under load: new connections refused after {refused_after:.2f}s, exit after {exited_after:.2f}s, "
              f"{len(drained)} requests in flight across the signal completed, "
              f"{sum(not o.ok for o in load.outcomes)} later ones refused")
    finally:
        server.stop(signal.SIGKILL)


# ======================================= broken repository ============================================
def test_a_broken_repository_serves_the_rest_and_says_why_each_broken_model_failed(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    _adder(repo / "good_onnx", 1.0)
    write(repo / "good_python" / "1" / "model.py", _SLOW_PID_MODEL)
    write(repo / "good_python" / "config.pbtxt", _SLOW_PID_CONFIG)
    write(repo / "bad_syntax" / "config.pbtxt", 'backend: "onnxruntime"\nmax_batch_size: [ 8 \n')
    add_constant(repo / "bad_syntax" / "1" / "model.onnx", 1.0)
    write(repo / "missing_file" / "config.pbtxt", ADDER_CONFIG)
    (repo / "missing_file" / "1").mkdir(parents=True)
    write(repo / "corrupt_onnx" / "config.pbtxt", ADDER_CONFIG)
    write(repo / "corrupt_onnx" / "1" / "model.onnx", "this is not an onnx model")
    write(repo / "bad_python" / "1" / "model.py", "import no_such_module_anywhere\n")
    write(repo / "bad_python" / "config.pbtxt", _SLOW_PID_CONFIG)
    write(repo / "unknown_backend" / "config.pbtxt", 'backend: "no_such_backend"\nmax_batch_size: 0\n')
    (repo / "unknown_backend" / "1").mkdir()
    write(repo / "bad_dims" / "config.pbtxt", ADDER_CONFIG + 'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -7 ] } ]\n')
    add_constant(repo / "bad_dims" / "1" / "model.onnx", 1.0)
    (repo / "dangling").mkdir()
    (repo / "dangling" / "config.pbtxt").symlink_to(tmp_path / "nowhere" / "config.pbtxt")
    (repo / "config_is_a_folder" / "config.pbtxt").mkdir(parents=True)
    (repo / "config_is_a_folder" / "1").mkdir()
    unreadable = repo / "unreadable"
    _adder(unreadable, 1.0)
    unreadable.chmod(0)
    try:
        server = start_nereid(repo, "--exit-on-error=false", "--strict-readiness=false", log_dir=tmp_path)
        try:
            assert float(requests.post(f"{server.base}/v2/models/good_onnx/infer", json=_BODY, timeout=30).json()["outputs"][0]["data"][0]) == 1.0
            assert requests.post(f"{server.base}/v2/models/good_python/infer", json=_BODY, timeout=30).status_code == 200
            index = {e["name"]: e for e in requests.post(f"{server.base}/v2/repository/index", timeout=30).json()}
            expected_phrase = {
                "bad_syntax": "failed to parse",
                "missing_file": "model.onnx",
                "corrupt_onnx": "",
                "bad_python": "no_such_module_anywhere",
                "unknown_backend": "no_such_backend",
                "bad_dims": "-7",
                "dangling": "",
                "config_is_a_folder": "",
            }
            if os.geteuid() != 0:  # root reads a folder whatever its mode
                expected_phrase["unreadable"] = "ermission"
            for name, phrase in expected_phrase.items():
                assert name in index, f"{name} is missing from the index: {sorted(index)}"
                entry = index[name]
                assert entry.get("state") == "UNAVAILABLE", (name, entry)
                assert entry.get("reason"), (name, entry)
                assert phrase in entry["reason"], (name, entry["reason"])
                reply = requests.post(f"{server.base}/v2/models/{name}/infer", json=_BODY, timeout=30)
                assert reply.status_code in (400, 404) and "error" in reply.json(), (name, reply.text)
            assert index["good_onnx"]["state"] == index["good_python"]["state"] == "READY"
        finally:
            assert server.stop() == 0, server.log()
    finally:
        unreadable.chmod(0o755)
