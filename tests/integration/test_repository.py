"""The model repository as Triton lays it out, version policies, control modes and the repository API,
against real `nereid serve` processes with the official tritonclient (HTTP and gRPC) and raw HTTP."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.onnx_builders import (
    add_constant,
    busy_body,
    busy_iterations,
    busy_loop,
    cpu_seconds,
    pending_requests,
    write,
)
from tests.servers import RunningServer, start_nereid

ADDER_CONFIG = 'backend: "onnxruntime"\nmax_batch_size: 8\n'


def _adder(model_dir: Path, versions: dict[int, float], config: str | None = ADDER_CONFIG) -> Path:
    """A model folder whose version N adds versions[N] to its FP32 [batch, 4] input."""
    for version, constant in versions.items():
        add_constant(model_dir / str(version) / "model.onnx", constant)
    if config is not None:
        write(model_dir / "config.pbtxt", config)
    return model_dir


def _infer_http(server: RunningServer, model: str, version: str = "") -> float:
    client = httpclient.InferenceServerClient(server.http_url)
    data = np.zeros((1, 4), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(data)
    result = client.infer(model, [inp], model_version=version)
    out = result.as_numpy("OUTPUT0")
    assert out.shape == (1, 4)
    return float(out[0, 0])


def _infer_grpc(server: RunningServer, model: str, version: str = "") -> float:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    return float(client.infer(model, [inp], model_version=version).as_numpy("OUTPUT0")[0, 0])


def _index(server: RunningServer) -> dict[str, list[dict[str, Any]]]:
    """The HTTP repository index grouped by model name."""
    entries = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    grouped: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        grouped.setdefault(entry["name"], []).append(entry)
    return grouped


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _states(server: RunningServer, model: str) -> dict[str, str]:
    return {e.get("version", ""): e.get("state", "") for e in _index(server).get(model, [])}


class _Traffic:
    """Clients (one gRPC, one raw HTTP) sending requests back to back until stopped; every answer is kept."""

    def __init__(self, server: RunningServer, model: str) -> None:
        self.server = server
        self.model = model
        self.values: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._grpc, daemon=True), threading.Thread(target=self._http, daemon=True)]

    def __enter__(self) -> _Traffic:
        for thread in self._threads:
            thread.start()
        _wait_for(lambda: len(self.values) >= 10 or bool(self.failures), 20, "traffic to flow")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def wait_for_value(self, value: float, timeout: float = 30) -> None:
        start = len(self.values)
        _wait_for(lambda: value in self.values[start:], timeout, f"responses with {value}")

    def _grpc(self) -> None:
        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
        while not self._stop.is_set():
            try:
                self.values.append(float(client.infer(self.model, [inp]).as_numpy("OUTPUT0")[0, 0]))
            except Exception as exc:  # every failure is a test failure; keep the message
                self.failures.append(f"grpc: {exc}")

    def _http(self) -> None:
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}]}
        url = f"{self.server.base}/v2/models/{self.model}/infer"
        with requests.Session() as session:
            while not self._stop.is_set():
                try:
                    reply = session.post(url, json=body, timeout=30)
                    if reply.status_code != 200:
                        self.failures.append(f"http {reply.status_code}: {reply.text}")
                    else:
                        self.values.append(float(reply.json()["outputs"][0]["data"][0]))
                except requests.RequestException as exc:
                    self.failures.append(f"http: {exc}")


def _swap_in(target: Path, build: Callable[[Path], object]) -> None:
    """Build a folder next to `target`, then rename it into place, so a poll never sees half a model."""
    staging = target.parent.parent / f".staging-{target.name}-{time.monotonic_ns()}"
    build(staging)
    if target.exists():
        trash = target.parent.parent / f".trash-{target.name}-{time.monotonic_ns()}"
        os.rename(target, trash)
        os.rename(staging, target)
        shutil.rmtree(trash)
    else:
        os.rename(staging, target)


# ===================================== layout and version policy =====================================
@pytest.fixture(scope="module")
def layout_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("layout_repo")
    three = {1: 1.0, 2: 2.0, 3: 3.0}
    latest = _adder(repo / "latest_default", three)
    (latest / "007").mkdir()  # a leading zero: not version 7, so version 3 stays the latest
    (latest / "007" / "model.onnx").write_bytes(b"garbage that would fail to load")
    (latest / "abc").mkdir()
    (latest / "abc" / "model.onnx").write_bytes(b"garbage")
    _adder(repo / "latest_two", three, ADDER_CONFIG + "version_policy { latest { num_versions: 2 } }\n")
    _adder(repo / "all_versions", three, ADDER_CONFIG + "version_policy { all { } }\n")
    _adder(repo / "specific", three, ADDER_CONFIG + "version_policy { specific { versions: [1, 3] } }\n")
    custom = _adder(repo / "custom_config", {1: 5.0})
    write(custom / "configs" / "small.pbtxt", 'backend: "onnxruntime"\nmax_batch_size: 2\n')
    _adder(repo / "no_custom_config", {1: 6.0})
    add_constant(repo / "onnx_folder" / "1" / "model.onnx" / "model.onnx", 7.0)
    write(repo / "onnx_folder" / "config.pbtxt", ADDER_CONFIG)
    named = repo / "named_file"
    add_constant(named / "1" / "adder.onnx", 8.0)
    (named / "1" / "model.onnx").write_bytes(b"not the file the config names")
    write(named / "config.pbtxt", ADDER_CONFIG + 'default_model_filename: "adder.onnx"\n')
    # Broken models: each must be UNAVAILABLE with its reason while the rest serve.
    _adder(repo / "bad_syntax", {1: 0.0}, "backend: \"onnxruntime\"\nmax_batch_size: eight\n")
    write(repo / "missing_file" / "config.pbtxt", ADDER_CONFIG)
    (repo / "missing_file" / "1").mkdir()
    _adder(repo / "bad_dims", {1: 0.0}, ADDER_CONFIG + 'input { name: "INPUT0" data_type: TYPE_FP32 dims: [0] }\n')
    write(repo / "corrupt_onnx" / "config.pbtxt", ADDER_CONFIG)
    write(repo / "corrupt_onnx" / "1" / "model.onnx", "this is not an onnx file")
    _adder(repo / "wrong_input", {1: 0.0}, ADDER_CONFIG + 'input { name: "NOPE" data_type: TYPE_FP32 dims: [4] }\n')
    _adder(repo / "no_versions", {}, ADDER_CONFIG)
    (repo / "no_versions").mkdir(exist_ok=True)
    server = start_nereid(
        repo, "--exit-on-error=false", "--strict-readiness=false", "--model-config-name=small",
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    yield server
    assert server.stop() == 0, server.log()


def test_repository_index_lists_models_versions_states_and_reasons_over_http_and_grpc(layout_server: RunningServer) -> None:
    http_index = httpclient.InferenceServerClient(layout_server.http_url).get_model_repository_index()
    grpc_index = grpcclient.InferenceServerClient(layout_server.grpc_url).get_model_repository_index(as_json=True)
    assert grpc_index["models"] == http_index
    rows = {(e["name"], e.get("version", "")): e for e in http_index}
    assert rows[("latest_default", "3")]["state"] == "READY"
    assert rows[("all_versions", "1")]["state"] == "READY"
    for name in ("bad_syntax", "missing_file", "bad_dims", "corrupt_onnx", "wrong_input", "no_versions"):
        entries = [e for e in http_index if e["name"] == name]
        assert entries, f"{name} missing from the index"
        assert all(e["state"] == "UNAVAILABLE" and e["reason"] for e in entries), entries
    names = [e["name"] for e in http_index]
    assert names == sorted(names)


def test_ready_only_index_lists_only_ready_versions(layout_server: RunningServer) -> None:
    everything = requests.post(f"{layout_server.base}/v2/repository/index").json()
    assert any(e.get("state") != "READY" for e in everything)
    only = requests.post(f"{layout_server.base}/v2/repository/index", json={"ready": True}).json()
    assert only and all(e["state"] == "READY" for e in only)
    assert {"latest_default", "all_versions"} <= {e["name"] for e in only}
    assert "bad_syntax" not in {e["name"] for e in only}
    assert only == [e for e in everything if e.get("state") == "READY"]


def test_latest_policy_serves_only_the_newest_numeric_version(layout_server: RunningServer) -> None:
    assert _states(layout_server, "latest_default") == {"3": "READY"}
    assert _infer_http(layout_server, "latest_default") == 3.0
    assert _infer_grpc(layout_server, "latest_default", "3") == 3.0
    for version in ("1", "7"):
        with pytest.raises(InferenceServerException) as caught:
            _infer_http(layout_server, "latest_default", version)
        assert f"version {version}" in caught.value.message()
    metadata = httpclient.InferenceServerClient(layout_server.http_url).get_model_metadata("latest_default")
    assert metadata["versions"] == ["3"]


@pytest.mark.parametrize(
    ("model", "served", "not_served"),
    [("latest_two", ["2", "3"], ["1"]), ("all_versions", ["1", "2", "3"], []), ("specific", ["1", "3"], ["2"])],
)
def test_version_policy_chooses_the_versions_and_each_serves_its_own_model(
    layout_server: RunningServer, model: str, served: list[str], not_served: list[str]
) -> None:
    assert _states(layout_server, model) == dict.fromkeys(served, "READY")
    http = httpclient.InferenceServerClient(layout_server.http_url)
    grpc = grpcclient.InferenceServerClient(layout_server.grpc_url)
    for version in served:
        assert _infer_http(layout_server, model, version) == float(version)
        assert _infer_grpc(layout_server, model, version) == float(version)
        assert http.is_model_ready(model, version)
        assert grpc.is_model_ready(model, version)
    for version in not_served:
        assert not http.is_model_ready(model, version)
        with pytest.raises(InferenceServerException):
            _infer_grpc(layout_server, model, version)
    # Without a version, the highest served version answers.
    assert _infer_http(layout_server, model) == float(served[-1])
    assert http.get_model_metadata(model)["versions"] == served


def test_model_config_name_selects_the_configs_folder_file(layout_server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(layout_server.http_url)
    assert http.get_model_config("custom_config")["max_batch_size"] == 2
    # A model without configs/small.pbtxt falls back to its config.pbtxt.
    assert http.get_model_config("no_custom_config")["max_batch_size"] == 8
    assert _infer_http(layout_server, "custom_config") == 5.0


def test_model_onnx_may_be_a_folder_holding_model_onnx(layout_server: RunningServer) -> None:
    assert _states(layout_server, "onnx_folder") == {"1": "READY"}
    assert _infer_http(layout_server, "onnx_folder") == 7.0


def test_default_model_filename_names_the_file_to_load(layout_server: RunningServer) -> None:
    assert _infer_grpc(layout_server, "named_file") == 8.0
    config = httpclient.InferenceServerClient(layout_server.http_url).get_model_config("named_file")
    assert config["default_model_filename"] == "adder.onnx"


@pytest.mark.parametrize(
    ("model", "phrases"),
    [
        ("bad_syntax", ["config.pbtxt", "max_batch_size"]),
        ("missing_file", ["model.onnx"]),
        ("bad_dims", ["INPUT0", "dim"]),
        ("corrupt_onnx", ["onnx"]),
        ("wrong_input", ["NOPE", "INPUT0"]),
        ("no_versions", ["version"]),
    ],
)
def test_broken_model_is_unavailable_with_a_reason_that_says_why(
    layout_server: RunningServer, model: str, phrases: list[str]
) -> None:
    entries = _index(layout_server)[model]
    reason = " ".join(e["reason"] for e in entries)
    assert all(e["state"] == "UNAVAILABLE" for e in entries)
    for phrase in phrases:
        assert phrase in reason, f"{phrase!r} not in {reason!r}"
    http = httpclient.InferenceServerClient(layout_server.http_url)
    assert not http.is_model_ready(model)
    with pytest.raises(InferenceServerException):
        _infer_http(layout_server, model)
    # The working models beside it still serve.
    assert _infer_http(layout_server, "latest_default") == 3.0


def test_load_api_is_refused_outside_explicit_mode(layout_server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(layout_server.http_url)
    with pytest.raises(InferenceServerException) as caught:
        http.load_model("latest_default")
    assert "explicit model load / unload is not allowed" in caught.value.message()
    reply = requests.post(f"{layout_server.base}/v2/repository/models/latest_default/unload")
    assert reply.status_code == 503
    with pytest.raises(InferenceServerException) as grpc_caught:
        grpcclient.InferenceServerClient(layout_server.grpc_url).unload_model("latest_default")
    assert grpc_caught.value.status() == "StatusCode.UNAVAILABLE"
    assert _infer_http(layout_server, "latest_default") == 3.0


# ========================================= explicit control ==========================================
@pytest.fixture(scope="module")
def explicit_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("explicit_repo")
    _adder(repo / "alpha", {1: 1.0})
    _adder(repo / "beta", {1: 2.0})
    _adder(repo / "gamma", {1: 3.0}, config=None)  # no config.pbtxt: auto-complete
    _adder(repo / "delta", {1: 4.0})
    _adder(repo / "swapped", {1: 10.0})
    busy_loop(repo / "slow" / "1" / "model.onnx")
    write(repo / "slow" / "config.pbtxt", 'backend: "onnxruntime"\n' + _INTRA_1)
    return repo


_INTRA_1 = 'parameters { key: "intra_op_thread_count" value { string_value: "1" } }\n'


@pytest.fixture(scope="module")
def explicit_server(explicit_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_nereid(
        explicit_repo, "--model-control-mode=explicit", "--load-model=alpha", "--load-model=swapped", "--load-model=slow",
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    yield server
    assert server.stop() == 0, server.log()


def test_explicit_mode_loads_only_the_load_model_models_at_start(explicit_server: RunningServer) -> None:
    index = _index(explicit_server)
    assert index["alpha"] == [{"name": "alpha", "version": "1", "state": "READY"}]
    # Models never asked for are listed by name only, as Triton lists them.
    assert index["gamma"] == [{"name": "gamma"}]
    assert index["delta"] == [{"name": "delta"}]
    with pytest.raises(InferenceServerException) as caught:
        _infer_http(explicit_server, "delta")
    assert "delta" in caught.value.message()


def test_load_and_unload_work_over_http_and_grpc(explicit_server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(explicit_server.http_url)
    grpc = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    http.load_model("beta")
    assert http.is_model_ready("beta") and grpc.is_model_ready("beta")
    assert _infer_grpc(explicit_server, "beta") == 2.0
    grpc.unload_model("beta")
    assert not http.is_model_ready("beta")
    assert _index(explicit_server)["beta"] == [
        {"name": "beta", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]
    with pytest.raises(InferenceServerException):
        _infer_http(explicit_server, "beta")
    grpc.load_model("beta")
    assert _infer_http(explicit_server, "beta") == 2.0
    # unload_dependents is accepted (an ordinary model has no dependents).
    http.unload_model("beta", unload_dependents=True)
    assert not grpc.is_model_ready("beta")
    grpc.load_model("beta")
    grpc.unload_model("beta", unload_dependents=True)
    assert _states(explicit_server, "beta") == {"1": "UNAVAILABLE"}


def test_unloading_an_unknown_model_succeeds_and_loading_one_fails(explicit_server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(explicit_server.http_url)
    http.unload_model("no_such_model")
    with pytest.raises(InferenceServerException) as caught:
        http.load_model("no_such_model")
    assert "no_such_model" in caught.value.message()
    assert "no_such_model" not in _index(explicit_server)


def test_load_with_a_config_override_uses_that_config(explicit_server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(explicit_server.http_url)
    override = {"backend": "onnxruntime", "max_batch_size": 2, "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    http.load_model("gamma", config=json.dumps(override))
    config = http.get_model_config("gamma")
    assert config["max_batch_size"] == 2
    assert config["instance_group"][0]["count"] == 2
    # The rest is still auto-completed from the model file.
    assert [i["name"] for i in config["input"]] == ["INPUT0"]
    assert _infer_http(explicit_server, "gamma") == 3.0
    grpc = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    grpc.load_model("gamma", config=json.dumps({"backend": "onnxruntime", "max_batch_size": 3}))
    assert grpc.get_model_config("gamma", as_json=True)["config"]["max_batch_size"] == 3
    # Loading again without an override goes back to the repository (auto-complete's default of 4).
    http.load_model("gamma")
    assert http.get_model_config("gamma")["max_batch_size"] == 4


def test_load_with_an_invalid_config_override_fails_and_keeps_the_old_version_serving(
    explicit_server: RunningServer,
) -> None:
    http = httpclient.InferenceServerClient(explicit_server.http_url)
    with pytest.raises(InferenceServerException) as caught:
        http.load_model("alpha", config='{"backend": "onnxruntime", "max_batch_size": -3}')
    assert "max_batch_size" in caught.value.message()
    with pytest.raises(InferenceServerException) as not_json:
        http.load_model("alpha", config="{not json")
    assert "alpha" in not_json.value.message()
    assert _infer_http(explicit_server, "alpha") == 1.0
    assert _states(explicit_server, "alpha") == {"1": "READY"}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_with_file_overrides_serves_the_uploaded_model(
    explicit_server: RunningServer, tmp_path: Path, protocol: str
) -> None:
    add_constant(tmp_path / "model.onnx", 100.0)
    add_constant(tmp_path / "v2.onnx", 200.0)
    files = {"file:1/model.onnx": (tmp_path / "model.onnx").read_bytes(), "file:2/model.onnx": (tmp_path / "v2.onnx").read_bytes()}
    config = json.dumps({"backend": "onnxruntime", "max_batch_size": 8, "version_policy": {"all": {}}})
    client: Any = (
        httpclient.InferenceServerClient(explicit_server.http_url)
        if protocol == "http"
        else grpcclient.InferenceServerClient(explicit_server.grpc_url)
    )
    client.load_model("delta", config=config, files=files)
    assert _infer_http(explicit_server, "delta", "1") == 100.0
    assert _infer_grpc(explicit_server, "delta", "2") == 200.0
    assert _states(explicit_server, "delta") == {"1": "READY", "2": "READY"}
    # A plain load afterwards serves the repository's own files again.
    client.load_model("delta")
    assert _infer_http(explicit_server, "delta") == 4.0
    assert _states(explicit_server, "delta") == {"1": "READY"}


def test_file_overrides_without_a_config_are_refused(explicit_server: RunningServer, tmp_path: Path) -> None:
    add_constant(tmp_path / "model.onnx", 100.0)
    http = httpclient.InferenceServerClient(explicit_server.http_url)
    with pytest.raises(InferenceServerException) as caught:
        http.load_model("alpha", files={"file:1/model.onnx": (tmp_path / "model.onnx").read_bytes()})
    assert "config" in caught.value.message()
    reply = requests.post(
        f"{explicit_server.base}/v2/repository/models/alpha/load",
        json={"parameters": {"config": "{}", "file:1/model.onnx": "%%% not base64 %%%"}},
    )
    assert reply.status_code == 400
    assert "base64" in reply.json()["error"]
    assert _infer_http(explicit_server, "alpha") == 1.0


def test_explicit_reload_of_a_changed_model_fails_no_request_in_flight(
    explicit_server: RunningServer, explicit_repo: Path
) -> None:
    http = httpclient.InferenceServerClient(explicit_server.http_url)
    with _Traffic(explicit_server, "swapped") as traffic:
        for constant in (11.0, 12.0, 13.0):
            add_constant(explicit_repo / "swapped" / "1" / "model.onnx.tmp", constant)
            os.replace(explicit_repo / "swapped" / "1" / "model.onnx.tmp", explicit_repo / "swapped" / "1" / "model.onnx")
            http.load_model("swapped")
            traffic.wait_for_value(constant)
    assert traffic.failures == []
    print(f"{len(traffic.values)} requests during 3 reloads")
    assert set(traffic.values) <= {10.0, 11.0, 12.0, 13.0}
    assert traffic.values[-1] == 13.0
    assert _states(explicit_server, "swapped") == {"1": "READY"}


def _slow_pair(server: RunningServer) -> tuple[dict[str, Any], list[threading.Thread]]:
    """One request executing on the slow model and one queued behind it; returns once both are inside."""
    # Long enough that the second request is still queued when the metrics are read, after a calibration that ran
    # during a slow spell of the machine (then each iteration takes less than it measured).
    iterations = busy_iterations(server.base, "slow", 1.5)
    results: dict[str, Any] = {}

    def send(name: str) -> None:
        reply = requests.post(f"{server.base}/v2/models/slow/infer", json=busy_body(iterations), timeout=60)
        results[name] = (reply.status_code, reply.json()["outputs"][1]["data"][0] if reply.ok else reply.text)

    threads = [threading.Thread(target=send, args=(name,), daemon=True) for name in ("first", "second")]
    baseline = cpu_seconds(server.process.pid)
    threads[0].start()
    _wait_for(lambda: cpu_seconds(server.process.pid) - baseline > 0.15, 30, "the first request to execute")
    threads[1].start()
    # One instance: the second request waits in the queue while the first executes.
    _wait_for(lambda: pending_requests(server.metrics_port, "slow") == 1, 30, "a request queued behind one executing")
    return {"results": results, "iterations": iterations}, threads


@pytest.mark.parametrize("action", ["reload", "unload"])
def test_reload_and_unload_let_executing_and_queued_requests_finish(explicit_server: RunningServer, action: str) -> None:
    http = httpclient.InferenceServerClient(explicit_server.http_url)
    http.load_model("slow")
    state, threads = _slow_pair(explicit_server)
    if action == "reload":
        http.load_model("slow")
    else:
        http.unload_model("slow")
    for thread in threads:
        thread.join(60)
    iterations = state["iterations"]
    assert state["results"] == {"first": (200, iterations), "second": (200, iterations)}
    assert http.is_model_ready("slow") == (action == "reload")
    http.load_model("slow")


def test_unload_that_outlasts_the_drain_timeout_keeps_the_server_responsive(explicit_repo: Path, tmp_path: Path) -> None:
    server = start_nereid(
        explicit_repo, "--model-control-mode=explicit", "--load-model=slow", "--exit-timeout-secs=1", log_dir=tmp_path
    )
    try:
        iterations = busy_iterations(server.base, "slow", 2.5)
        results: dict[str, Any] = {}

        def long_request() -> None:
            reply = requests.post(f"{server.base}/v2/models/slow/infer", json=busy_body(iterations), timeout=60)
            results["request"] = reply.status_code

        def unload() -> None:
            start = time.monotonic()
            httpclient.InferenceServerClient(server.http_url).unload_model("slow")
            results["unload_s"] = time.monotonic() - start

        baseline = cpu_seconds(server.process.pid)
        threads = [threading.Thread(target=long_request, daemon=True)]
        threads[0].start()
        _wait_for(lambda: cpu_seconds(server.process.pid) - baseline > 0.15, 30, "the long request to execute")
        threads.append(threading.Thread(target=unload, daemon=True))
        threads[1].start()
        slowest = 0.0
        with requests.Session() as session:
            while threads[1].is_alive():
                start = time.monotonic()
                assert session.get(f"{server.base}/v2/health/live", timeout=30).status_code == 200
                slowest = max(slowest, time.monotonic() - start)
                time.sleep(0.02)  # pacing only
        for thread in threads:
            thread.join(60)
        assert results["unload_s"] > 1.0, results  # the drain timed out and the unload waited for the run
        assert slowest < 0.5, f"the server stalled {slowest:.2f}s while the model finished its run"
        assert _states(server, "slow") == {"1": "UNAVAILABLE"}
    finally:
        assert server.stop() == 0, server.log()


def test_star_load_model_loads_everything(explicit_repo: Path, tmp_path: Path) -> None:
    server = start_nereid(explicit_repo, "--model-control-mode=explicit", "--load-model=*", log_dir=tmp_path)
    try:
        index = _index(server)
        assert {"alpha", "beta", "gamma", "delta", "swapped"} <= set(index)
        assert all(e["state"] == "READY" for entries in index.values() for e in entries)
    finally:
        assert server.stop() == 0, server.log()


# ============================================ poll mode ==============================================
@pytest.fixture(scope="module")
def poll_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("poll_root") / "models"
    _adder(repo / "steady", {1: 1.0})
    _adder(repo / "changing", {1: 1.0})
    _adder(repo / "leaving", {1: 5.0})
    return repo


@pytest.fixture(scope="module")
def poll_server(poll_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_nereid(
        poll_repo, "--model-control-mode=poll", "--repository-poll-secs=1", log_dir=tmp_path_factory.mktemp("logs")
    )
    yield server
    assert server.stop() == 0, server.log()


def test_poll_mode_loads_a_model_added_to_the_repository(poll_server: RunningServer, poll_repo: Path) -> None:
    assert "arriving" not in _index(poll_server)
    _swap_in(poll_repo / "arriving", lambda d: _adder(d, {1: 9.0}))
    _wait_for(lambda: _states(poll_server, "arriving") == {"1": "READY"}, 15, "the added model to load")
    assert _infer_grpc(poll_server, "arriving") == 9.0


def test_poll_mode_reloads_a_changed_model_without_failing_requests_in_flight(
    poll_server: RunningServer, poll_repo: Path
) -> None:
    with _Traffic(poll_server, "changing") as traffic:
        # A new version folder: the latest policy moves from version 1 to 2.
        _swap_in(poll_repo / "changing", lambda d: _adder(d, {1: 1.0, 2: 2.0}))
        traffic.wait_for_value(2.0)
        # A changed config of the same version: version_policy all serves both.
        _swap_in(poll_repo / "changing", lambda d: _adder(d, {1: 1.0, 2: 3.0}, ADDER_CONFIG + "version_policy { all {} }\n"))
        traffic.wait_for_value(3.0)
    assert traffic.failures == []
    assert set(traffic.values) <= {1.0, 2.0, 3.0}
    _wait_for(lambda: _states(poll_server, "changing") == {"1": "READY", "2": "READY"}, 15, "both versions ready")
    assert _infer_http(poll_server, "changing", "1") == 1.0
    assert _infer_steady(poll_server) == 1.0


def _infer_steady(server: RunningServer) -> float:
    return _infer_http(server, "steady")


def test_poll_mode_unloads_a_model_removed_from_the_repository(poll_server: RunningServer, poll_repo: Path) -> None:
    assert _infer_http(poll_server, "leaving") == 5.0
    trash = poll_repo.parent / "leaving-removed"
    os.rename(poll_repo / "leaving", trash)
    _wait_for(lambda: "leaving" not in _index(poll_server), 15, "the removed model to leave the index")
    with pytest.raises(InferenceServerException) as caught:
        _infer_http(poll_server, "leaving")
    assert "leaving" in caught.value.message()
    assert not httpclient.InferenceServerClient(poll_server.http_url).is_model_ready("leaving")
    assert _infer_steady(poll_server) == 1.0


def test_poll_mode_keeps_serving_when_a_change_breaks_the_model(poll_server: RunningServer, poll_repo: Path) -> None:
    broken_config = ADDER_CONFIG + 'input { name: "INPUT0" data_type: TYPE_FP32 dims: [0] }\n'
    write(poll_repo / "steady" / "config.pbtxt.tmp", broken_config)
    os.replace(poll_repo / "steady" / "config.pbtxt.tmp", poll_repo / "steady" / "config.pbtxt")
    log_mark = len(poll_server.log())
    _wait_for(lambda: "failed to load 'steady'" in poll_server.log()[log_mark:], 15, "the poll to try the broken config")
    assert _states(poll_server, "steady") == {"1": "READY"}
    assert _infer_steady(poll_server) == 1.0


def test_poll_mode_refuses_the_load_api(poll_server: RunningServer) -> None:
    with pytest.raises(InferenceServerException) as caught:
        grpcclient.InferenceServerClient(poll_server.grpc_url).load_model("steady")
    assert "explicit model load / unload is not allowed" in caught.value.message()
    reply = requests.post(f"{poll_server.base}/v2/repository/models/steady/unload")
    assert reply.status_code == 503
    assert _infer_steady(poll_server) == 1.0
