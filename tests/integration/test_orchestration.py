"""Model orchestration against real `nereid serve` processes and the official tritonclient: loading on demand
(single flight, back-off, readiness), the memory budget and eviction (LRU, in-flight and pinned models, the 503 that
names what holds the memory), footprints remembered across restarts, idle unloads, group limits, and bad flags."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import requests
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

from tests.integration.onnx_builders import write
from tests.integration.orchestration_models import index_rows, metric_value, onnx_adder, python_model
from tests.servers import ROOT, RunningServer, start_nereid

ON_DEMAND = ("--model-control-mode=explicit", "--model-load-on-demand=true")


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _infer_seconds(server: RunningServer, model: str, seconds: float = 0.0) -> float:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    tensor = httpclient.InferInput("SECONDS", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    return float(client.infer(model, [tensor]).as_numpy("OUT")[0])


def _infer_adder(client: httpclient.InferenceServerClient, model: str) -> float:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    return float(client.infer(model, [tensor]).as_numpy("OUTPUT0")[0, 0])


def _state(server: RunningServer, model: str) -> tuple[str, str]:
    row = index_rows(server.base).get(model, {})
    return str(row.get("state", "")), str(row.get("reason", ""))


@pytest.fixture
def stop_after() -> Callable[[RunningServer], RunningServer]:
    servers: list[RunningServer] = []

    def track(server: RunningServer) -> RunningServer:
        servers.append(server)
        return server

    yield track  # type: ignore[misc]
    for server in servers:
        server.stop()


# -- loading on demand ---------------------------------------------------------------------------------------
def test_256_concurrent_first_requests_share_one_load_and_all_succeed(tmp_path: Path, stop_after) -> None:
    python_model(tmp_path, "lazy", init_secs="1.5")
    server = stop_after(start_nereid(tmp_path, *ON_DEMAND))
    assert _state(server, "lazy") == ("", "")  # in the repository, not loaded: readiness did not wait for it

    async def run() -> list[float]:
        client = aiohttpclient.InferenceServerClient(server.http_url, conn_limit=256, conn_timeout=120)
        try:
            async def one(i: int) -> float:
                tensor = aiohttpclient.InferInput("SECONDS", [1], "FP32")
                tensor.set_data_from_numpy(np.array([float(i % 3) * 0.0], dtype=np.float32))
                result = await client.infer("lazy", [tensor])
                return float(result.as_numpy("OUT")[0])

            return await asyncio.gather(*(one(i) for i in range(256)))
        finally:
            await client.close()

    seen: set[str] = set()
    stop = threading.Event()

    def watch_index() -> None:  # the load takes at least the model's 1.5 s of initialize()
        while not stop.is_set():
            seen.add(_state(server, "lazy")[0])
            stop.wait(0.05)

    watcher = threading.Thread(target=watch_index)
    watcher.start()
    try:
        results = asyncio.run(run())
    finally:
        stop.set()
        watcher.join(30)
    assert results == [0.0] * 256
    assert "LOADING" in seen, seen
    assert metric_value(server.metrics_port, "nereid_model_loads_total", model="lazy", cause="on_demand") == 1
    assert metric_value(server.metrics_port, "nereid_model_loads_total", model="lazy") == 1
    assert server.log().count("successfully loaded 'lazy' version 1") == 1
    assert metric_value(server.metrics_port, "nereid_model_cold_start_wait_seconds_count") >= 256


def test_a_failed_load_on_demand_backs_off_and_readiness_stays(tmp_path: Path, stop_after) -> None:
    python_model(tmp_path, "broken", fail="true")
    python_model(tmp_path, "fine")
    server = stop_after(start_nereid(tmp_path, *ON_DEMAND, "--model-load-failure-backoff-secs=60"))
    errors = []
    for _ in range(5):
        with pytest.raises(InferenceServerException) as caught:
            _infer_seconds(server, "broken")
        errors.append(str(caught.value))
    assert all("this model refuses to load" in e for e in errors), errors
    assert "retried after" in errors[-1]
    # One load attempt for five requests: the back-off answered the others.
    assert server.log().count("load on demand of 'broken' failed") == 1
    assert requests.get(server.base + "/v2/health/ready", timeout=5).status_code == 200
    assert _infer_seconds(server, "fine") == 0.0
    # An explicit load tries again at once (and fails again, with the same reason).
    with pytest.raises(InferenceServerException, match="refuses to load"):
        httpclient.InferenceServerClient(server.http_url).load_model("broken")


def test_unknown_models_are_still_not_found_with_loading_on_demand(tmp_path: Path, stop_after) -> None:
    python_model(tmp_path, "fine")
    server = stop_after(start_nereid(tmp_path, *ON_DEMAND))
    reply = requests.post(server.base + "/v2/models/nope/infer", json={"inputs": []}, timeout=10)
    assert reply.status_code == 404, reply.text
    assert "unknown model" in reply.text


_BLS_CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS")
            call = pb_utils.InferenceRequest(model_name="callee", requested_output_names=["OUT"], inputs=[seconds])
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out = pb_utils.get_output_tensor_by_name(answer, "OUT")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out.as_numpy() + 1)]))
        return responses
"""


def test_grpc_and_bls_first_requests_load_their_models_on_demand(tmp_path: Path, stop_after) -> None:
    import tritonclient.grpc as grpcclient

    python_model(tmp_path, "callee")
    python_model(tmp_path, "caller")
    (tmp_path / "caller" / "1" / "model.py").write_text(_BLS_CALLER)
    python_model(tmp_path, "over_grpc")
    server = stop_after(start_nereid(tmp_path, *ON_DEMAND))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("SECONDS", [1], "FP32")
    tensor.set_data_from_numpy(np.array([0.5], dtype=np.float32))
    assert float(client.infer("over_grpc", [tensor]).as_numpy("OUT")[0]) == 1.0
    # The caller loads on demand, then its BLS call loads the callee on demand.
    assert float(client.infer("caller", [tensor]).as_numpy("OUT")[0]) == 2.0
    assert metric_value(server.metrics_port, "nereid_model_loads_total", model="callee", cause="on_demand") == 1


def test_poll_mode_on_demand_loads_nothing_at_start_up(tmp_path: Path, stop_after) -> None:
    onnx_adder(tmp_path, "polled", 3.0)
    server = stop_after(
        start_nereid(tmp_path, "--model-control-mode=poll", "--model-load-on-demand=true", "--repository-poll-secs=1")
    )
    assert _state(server, "polled") == ("", "")
    assert _infer_adder(httpclient.InferenceServerClient(server.http_url), "polled") == 3.0
    assert _state(server, "polled")[0] == "READY"
    assert metric_value(server.metrics_port, "nereid_model_loads_total", model="polled", cause="startup") == 0


# -- the memory budget and eviction -----------------------------------------------------------------------------
def _measure_footprints(repository: Path, names: list[str], state_file: Path) -> dict[str, int]:
    """Load each model alone once, in a server of its own, so each footprint is measured; the state file keeps them."""
    server = start_nereid(repository, *ON_DEMAND, f"--model-footprint-state-file={state_file}")
    try:
        sizes = {}
        for name in names:
            _infer_seconds(server, name)
            sizes[name] = int(index_rows(server.base)[name]["footprint_bytes"])  # type: ignore[call-overload]
        return sizes
    finally:
        assert server.stop() == 0, server.log()


def test_a_budget_for_three_of_six_evicts_the_least_recently_used_idle_model(tmp_path: Path, stop_after) -> None:
    repository = tmp_path / "models"
    names = [f"m{i}" for i in range(5)]
    for name in names:
        python_model(repository, name, alloc_mib="48")
    python_model(repository, "pinned", alloc_mib="48", **{"nereid.pin": "true"})
    state = tmp_path / "footprints.json"
    sizes = _measure_footprints(repository, names + ["pinned"], state)
    spread = max(sizes.values()) / min(sizes.values())
    assert spread < 1.15, sizes  # the budget below counts on like-sized models
    budget = int(3.5 * sum(sizes.values()) / len(sizes))
    server = stop_after(
        start_nereid(
            repository, *ON_DEMAND, f"--model-memory-budget={budget}", f"--model-footprint-state-file={state}",
            "--model-eviction-policy=lru",
        )
    )
    # The pinned model first: the least recently used of all, and still never evicted.
    for name in ("pinned", "m0", "m1"):
        assert _infer_seconds(server, name) == 0.0
    _infer_seconds(server, "m0")  # m1 is now the least recently used unpinned model
    assert _infer_seconds(server, "m2") == 0.0  # a 4th: something must go
    assert _state(server, "m1") == ("UNAVAILABLE", "evicted: budget")
    assert _state(server, "pinned")[0] == "READY"
    assert _state(server, "m0")[0] == "READY"
    assert metric_value(server.metrics_port, "nereid_model_evictions_total", model="m1", cause="budget") == 1
    assert "evicted model 'm1'" in server.log()

    # A blocker: a request in flight on m0, the least recently used once m2 and the pinned model are used after it.
    result: dict[str, float] = {}
    blocker = threading.Thread(target=lambda: result.setdefault("m0", _infer_seconds(server, "m0", 4.0)))
    blocker.start()
    _wait_for((repository / "m0" / "executing").exists, 60, "m0's request to be executing")
    _infer_seconds(server, "m2")
    _infer_seconds(server, "pinned")
    assert _infer_seconds(server, "m3") == 0.0  # needs room: m0 is busy, so m2 goes
    blocker.join(60)
    assert result.get("m0") == 8.0  # the in-flight request was answered
    assert _state(server, "m2") == ("UNAVAILABLE", "evicted: budget")
    assert _state(server, "m0")[0] == "READY"
    assert _state(server, "pinned")[0] == "READY"
    charged = metric_value(server.metrics_port, "nereid_models_resident_bytes")
    assert 0 < charged <= budget


def test_when_nothing_can_be_evicted_the_load_fails_with_503_naming_what_holds_the_memory(
    tmp_path: Path, stop_after
) -> None:
    repository = tmp_path / "models"
    python_model(repository, "held", alloc_mib="64")
    python_model(repository, "wanted", alloc_mib="64")
    python_model(repository, "pinned", **{"nereid.pin": "true"})
    python_model(repository, "declared", **{"nereid.memory_footprint": "100GiB"})
    state = tmp_path / "footprints.json"
    sizes = _measure_footprints(repository, ["held", "wanted", "pinned"], state)
    budget = sizes["held"] + sizes["pinned"] + sizes["wanted"] // 2
    server = stop_after(
        start_nereid(repository, *ON_DEMAND, f"--model-memory-budget={budget}", f"--model-footprint-state-file={state}",
                     "--model-load-on-demand-timeout-secs=2")  # fmt: skip
    )
    # A declared footprint stands until a measurement exists: this one can never fit.
    with pytest.raises(InferenceServerException, match=r"needs 102400.0 MiB \(declared\)"):
        _infer_seconds(server, "declared")
    _infer_seconds(server, "pinned")
    done: dict[str, float] = {}
    blocker = threading.Thread(target=lambda: done.setdefault("held", _infer_seconds(server, "held", 6.0)))
    blocker.start()
    _wait_for((repository / "held" / "executing").exists, 60, "the blocker's request to be executing")
    # An explicit load does not wait for room.
    explicit = requests.post(server.base + "/v2/repository/models/wanted/load", timeout=60)
    # A request waits for room (most of its 2 s), then hears why there is none.
    body = {"inputs": [{"name": "SECONDS", "shape": [1], "datatype": "FP32", "data": [0.0]}]}
    lazy = requests.post(server.base + "/v2/models/wanted/infer", json=body, timeout=60)
    blocker.join(60)
    assert done.get("held") == 12.0
    for reply in (explicit, lazy):
        assert reply.status_code == 503, reply.text
        message = reply.json()["error"]
        assert "[model 'wanted'] cannot load" in message
        assert "'held'" in message and "requests in flight" in message
        assert "'pinned'" in message and "(pinned)" in message
    # Once the blocker is done, 'held' is idle and gives way.
    assert _infer_seconds(server, "wanted") == 0.0
    assert _state(server, "held") == ("UNAVAILABLE", "evicted: budget")


def test_a_request_waits_for_room_while_the_resident_models_are_busy(tmp_path: Path, stop_after) -> None:
    repository = tmp_path / "models"
    python_model(repository, "busy", alloc_mib="64")
    python_model(repository, "next", alloc_mib="64")
    state = tmp_path / "footprints.json"
    sizes = _measure_footprints(repository, ["busy", "next"], state)
    budget = int(1.5 * max(sizes.values()))
    server = stop_after(
        start_nereid(repository, *ON_DEMAND, f"--model-memory-budget={budget}", f"--model-footprint-state-file={state}")
    )
    done: dict[str, float] = {}
    blocker = threading.Thread(target=lambda: done.setdefault("busy", _infer_seconds(server, "busy", 2.0)))
    blocker.start()
    _wait_for((repository / "busy" / "executing").exists, 60, "the blocker's request to be executing")
    assert _infer_seconds(server, "next") == 0.0  # waited for 'busy' to finish, then evicted it
    blocker.join(60)
    assert done.get("busy") == 4.0
    assert _state(server, "busy") == ("UNAVAILABLE", "evicted: budget")


def _load_intervals(repository: Path, names: list[str]) -> list[tuple[float, float]]:
    rows = [line.split() for name in names for line in (repository / name / "loads").read_text().splitlines()]
    return sorted((float(start), float(end)) for start, end in rows)


@pytest.mark.parametrize("budgeted", [True, False])
def test_under_a_budget_loads_on_demand_take_turns_and_without_one_they_overlap(
    tmp_path: Path, stop_after, budgeted: bool
) -> None:
    """A model that is loading holds budget and serves nothing, so with a budget the loads run one at a time
    (overlapping loads would keep several models' shares idle and lower the hit rate); without one they run side
    by side."""
    repository = tmp_path / "models"
    names = [f"slow{i}" for i in range(3)]
    for name in names:
        python_model(repository, name, init_secs="0.6", load_log="true")
    flags = ["--model-memory-budget=8GiB"] if budgeted else []
    server = stop_after(start_nereid(repository, *ON_DEMAND, *flags))
    results: dict[str, float] = {}
    threads = [threading.Thread(target=lambda n=n: results.setdefault(n, _infer_seconds(server, n, 0.0))) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert results == dict.fromkeys(names, 0.0)
    intervals = _load_intervals(repository, names)
    assert len(intervals) == 3, intervals
    overlaps = [later[0] < earlier[1] for earlier, later in zip(intervals, intervals[1:])]
    if budgeted:
        assert not any(overlaps), intervals
    else:
        assert any(overlaps), intervals


def test_a_footprint_remembered_across_a_restart_admits_the_cold_load_without_over_committing(
    tmp_path: Path, stop_after
) -> None:
    repository = tmp_path / "models"
    python_model(repository, "first", alloc_mib="96")
    python_model(repository, "second", alloc_mib="96")
    state = tmp_path / "state" / "footprints.json"
    sizes = _measure_footprints(repository, ["first", "second"], state)
    assert state.exists() and '"second"' in state.read_text()
    # Room for one and a half: the remembered figure says the second does not fit beside the first. The estimate
    # for a never-measured Python model (far below 96 MiB of ballast) would have let both in.
    budget = int(1.5 * max(sizes.values()))
    server = stop_after(
        start_nereid(repository, *ON_DEMAND, f"--model-memory-budget={budget}", f"--model-footprint-state-file={state}")
    )
    _infer_seconds(server, "first")
    assert index_rows(server.base)["first"]["footprint_bytes"] <= budget  # type: ignore[operator]
    _infer_seconds(server, "second")
    assert _state(server, "first") == ("UNAVAILABLE", "evicted: budget")
    assert metric_value(server.metrics_port, "nereid_models_resident_bytes") <= budget


def test_footprints_are_sampled_again_as_models_grow(tmp_path: Path, stop_after) -> None:
    python_model(tmp_path, "growing", grow_mib="32")
    server = stop_after(start_nereid(tmp_path, *ON_DEMAND, "--model-footprint-resample-secs=0.5"))
    _infer_seconds(server, "growing")
    first = int(index_rows(server.base)["growing"]["footprint_bytes"])  # type: ignore[call-overload]
    for _ in range(2):
        _infer_seconds(server, "growing")
    _wait_for(
        lambda: int(index_rows(server.base)["growing"]["footprint_bytes"]) >= first + (48 << 20),  # type: ignore[call-overload]
        30,
        "the re-sampled footprint to show the worker's growth",
    )
    assert metric_value(server.metrics_port, "nereid_model_resident_bytes", model="growing") >= first + (48 << 20)


def test_an_explicit_unload_waits_for_the_request_in_flight(tmp_path: Path, stop_after) -> None:
    python_model(tmp_path, "draining")
    server = stop_after(start_nereid(tmp_path, *ON_DEMAND))
    _infer_seconds(server, "draining")
    done: dict[str, float] = {}
    request = threading.Thread(target=lambda: done.setdefault("answer", _infer_seconds(server, "draining", 2.0)))
    request.start()
    _wait_for((tmp_path / "draining" / "executing").exists, 60, "the request to be executing")
    httpclient.InferenceServerClient(server.http_url, network_timeout=60).unload_model("draining")
    request.join(30)
    assert done.get("answer") == 4.0  # drained, not cut off
    assert _state(server, "draining") == ("UNAVAILABLE", "unloaded")


# -- idle unloads, groups --------------------------------------------------------------------------------------
def test_idle_models_are_unloaded_and_load_again_on_demand(tmp_path: Path, stop_after) -> None:
    onnx_adder(tmp_path, "idle", 1.0)
    server = stop_after(start_nereid(tmp_path, *ON_DEMAND, "--model-idle-unload-secs=1"))
    client = httpclient.InferenceServerClient(server.http_url)
    assert _infer_adder(client, "idle") == 1.0
    _wait_for(lambda: _state(server, "idle") == ("UNAVAILABLE", "idle"), 30, "the idle unload")
    # The index says so as the unload begins; the eviction is counted once the model has closed.
    _wait_for(
        lambda: metric_value(server.metrics_port, "nereid_model_evictions_total", model="idle", cause="idle") == 1,
        30,
        "the idle eviction counted",
    )
    assert _infer_adder(client, "idle") == 1.0
    assert metric_value(server.metrics_port, "nereid_model_loads_total", model="idle", cause="on_demand") == 2


def test_a_model_loaded_on_demand_again_reads_its_config_again_only_when_its_folder_changed(
    tmp_path: Path, stop_after
) -> None:
    folder = onnx_adder(tmp_path, "edited", 1.0)
    server = stop_after(start_nereid(tmp_path, *ON_DEMAND))
    client = httpclient.InferenceServerClient(server.http_url)

    def unload() -> None:
        client.unload_model("edited")
        _wait_for(lambda: _state(server, "edited")[0] == "UNAVAILABLE", 30, "the unload")

    assert _infer_adder(client, "edited") == 1.0
    unload()
    assert _infer_adder(client, "edited") == 1.0  # the folder is unchanged: the config prepared last time
    assert client.get_model_config("edited")["max_batch_size"] == 8
    unload()
    write(folder / "config.pbtxt", 'backend: "onnxruntime"\nmax_batch_size: 16\n')
    assert _infer_adder(client, "edited") == 1.0
    assert client.get_model_config("edited")["max_batch_size"] == 16
    assert metric_value(server.metrics_port, "nereid_model_loads_total", model="edited", cause="on_demand") == 3


@pytest.mark.parametrize(("policy", "evicted"), [("lru", "h0"), ("frequency", "h1")])
def test_a_group_limit_keeps_at_most_n_of_its_models_resident_and_the_policy_picks_who_goes(
    tmp_path: Path, stop_after, policy: str, evicted: str
) -> None:
    group = 'parameters { key: "nereid.group" value { string_value: "heavy" } }\n'
    for i in range(3):
        onnx_adder(tmp_path, f"h{i}", float(i), group)
    onnx_adder(tmp_path, "other", 9.0)
    server = stop_after(
        start_nereid(tmp_path, *ON_DEMAND, "--model-group-limit=heavy:2", f"--model-eviction-policy={policy}")
    )
    client = httpclient.InferenceServerClient(server.http_url)
    for _ in range(5):
        _infer_adder(client, "h0")  # often, but not lately
    _infer_adder(client, "h1")  # once, most recently
    _infer_adder(client, "other")
    assert _infer_adder(client, "h2") == 2.0
    assert _state(server, evicted) == ("UNAVAILABLE", "evicted: group")
    kept = "h1" if evicted == "h0" else "h0"
    assert _state(server, kept)[0] == "READY" and _state(server, "h2")[0] == "READY"
    assert _state(server, "other")[0] == "READY"  # outside the group: untouched
    assert metric_value(server.metrics_port, "nereid_model_evictions_total", cause="group") == 1


# -- churn: explicit loads and unloads under traffic ---------------------------------------------------------------
def _churn(server: RunningServer, models: list[str], seconds: float) -> tuple[int, list[str]]:
    stop = threading.Event()
    failures: list[str] = []
    successes = [0]
    lock = threading.Lock()

    def client_loop() -> None:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        i = 0
        while not stop.is_set():
            model = models[i % len(models)]
            i += 1
            try:
                _infer_adder(client, model)
                with lock:
                    successes[0] += 1
            except InferenceServerException as exc:
                with lock:
                    failures.append(str(exc))

    def control_loop() -> None:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        i = 0
        while not stop.is_set():
            model = models[i % len(models)]
            try:
                if i % 2:
                    client.unload_model(model)
                else:
                    client.load_model(model)
            except InferenceServerException as exc:
                with lock:
                    failures.append("control: " + str(exc))
            i += 1
            stop.wait(0.02)

    threads = [threading.Thread(target=client_loop) for _ in range(32)] + [threading.Thread(target=control_loop)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)  # the length of the run, not synchronisation
    stop.set()
    for thread in threads:
        thread.join(120)
    return successes[0], failures


def test_inference_under_explicit_load_and_unload_churn(tmp_path: Path, stop_after) -> None:
    """Two servers churned at once, one with loading on demand and one without (the same 20 s for each, run side
    by side to halve the suite's time)."""
    models = ["churn_a", "churn_b"]
    servers = {}
    for on_demand in (True, False):
        repo = tmp_path / f"on_demand_{on_demand}"
        for i, name in enumerate(models):
            onnx_adder(repo, name, float(i + 1))
        flags = ["--model-control-mode=explicit", "--load-model=*", f"--model-load-on-demand={str(on_demand).lower()}"]
        servers[on_demand] = stop_after(start_nereid(repo, *flags, log_dir=tmp_path))
    outcomes: dict[bool, tuple[int, list[str]]] = {}
    runs = [
        threading.Thread(target=lambda on_demand=on_demand: outcomes.setdefault(on_demand, _churn(servers[on_demand], models, 20.0)))
        for on_demand in servers
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join(180)
    successes, failures = outcomes[True]
    assert successes > 0 and failures == [], failures[:5]  # on demand: no inference fails
    successes, failures = outcomes[False]
    assert successes > 0
    # Without it, the only failures are the ones Triton gives too: the model is not loaded at that moment.
    unexpected = [f for f in failures if "unknown model" not in f and "not at ready state" not in f]
    assert unexpected == [], unexpected[:5]


# -- ensembles ---------------------------------------------------------------------------------------------------
def test_an_ensemble_step_loads_its_evicted_composing_model_on_demand(tmp_path: Path, stop_after) -> None:
    onnx_adder(tmp_path, "step", 5.0)
    (tmp_path / "pipeline" / "1").mkdir(parents=True)
    (tmp_path / "pipeline" / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 8\n'
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }]\n'
        'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }]\n'
        'ensemble_scheduling { step [{ model_name: "step" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }] }\n'
    )
    server = stop_after(start_nereid(tmp_path, *ON_DEMAND))
    client = httpclient.InferenceServerClient(server.http_url)
    assert _infer_adder(client, "pipeline") == 5.0
    client.unload_model("step")  # the ensemble goes with it, as in Triton
    assert _infer_adder(client, "pipeline") == 5.0  # both load again on demand
    assert _state(server, "step")[0] == "READY"


# -- flags -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model-load-on-demand=true"], "needs --model-control-mode=explicit or poll"),
        (["--model-control-mode=explicit", "--model-memory-budget=12XB"], "'12XB' is not a size"),
        (["--model-control-mode=explicit", "--model-memory-budget=150%"], "not a percentage"),
        (["--model-control-mode=explicit", "--model-group-limit=heavy"], "must be NAME:N"),
        (["--model-control-mode=explicit", "--model-group-limit=heavy:0"], "must be NAME:N"),
        (["--model-control-mode=explicit", "--model-load-on-demand-timeout-secs=0"], "above 0"),
        (["--model-control-mode=explicit", "--model-idle-unload-secs=-1"], "0 or more seconds"),
        (["--model-control-mode=explicit", "--model-eviction-policy=random"], "invalid choice"),
    ],
)
def test_bad_orchestration_flags_are_refused_at_start_up(tmp_path: Path, flags: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nereid", "serve", "--model-repository", str(tmp_path), *flags],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr


# -- the budget in real memory -----------------------------------------------------------------------------------
def _tree_pss_by_process(pid: int) -> dict[str, int]:
    """The memory that the server and each of its workers allocated: their proportional share (PSS) of anonymous
    and shared-memory pages, so a page shared by several of them, like a shared-memory arena or a page a worker
    inherited from the fork server, is counted once in the sum. Library file pages are left out: their share moves
    as other processes on the machine map the same libraries (a neighbouring test's server), by tens of MiB."""
    process = psutil.Process(pid)
    sizes: dict[str, int] = {}
    for member in [process, *process.children(recursive=True)]:
        try:
            with open(f"/proc/{member.pid}/smaps_rollup", "rb") as rollup:
                fields = dict(line.split(b":", 1) for line in rollup if line.startswith((b"Pss_Anon", b"Pss_Shmem")))
            sizes[f"{member.name()}[{member.pid}]"] = sum(int(value.split()[0]) << 10 for value in fields.values())
        except (OSError, psutil.Error):
            pass  # a worker that just exited
    return sizes


def _mib(sizes: dict[str, int]) -> str:
    return ", ".join(f"{name} {size / 2**20:.1f}" for name, size in sizes.items())


def _tree_pss(pid: int) -> int:
    """The real memory of the server and its workers."""
    return sum(_tree_pss_by_process(pid).values())


def test_the_budget_holds_in_real_memory_during_a_churn_of_loads_and_evictions(tmp_path: Path, stop_after) -> None:
    repository = tmp_path / "models"
    # Python models whose weights and output arenas (8 MiB answers) are both real memory, and ONNX sessions.
    pythons = [f"p{i}" for i in range(6)]
    for name in pythons:
        python_model(repository, name, alloc_mib="24", out_mib="8")
    adders = [f"a{i}" for i in range(3)]
    for i, name in enumerate(adders):
        onnx_adder(repository, name, float(i))
    state = tmp_path / "footprints.json"
    server = start_nereid(repository, *ON_DEMAND, f"--model-footprint-state-file={state}")
    try:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        for name in pythons:  # measured alone, after a first request has grown the arenas
            _infer_seconds(server, name)
        for name in adders:
            _infer_adder(client, name)
    finally:
        assert server.stop() == 0, server.log()
    # Remembered as they unloaded, after serving: an 8 MiB answer has grown each one's output arena by then.
    remembered = json.loads(state.read_text())["models"]
    python_size = max(int(remembered[n]["host_bytes"]) for n in pythons)
    assert python_size >= (24 + 8) << 20  # the arenas are the model's too
    budget = int(3.5 * python_size)
    server = stop_after(
        start_nereid(repository, *ON_DEMAND, f"--model-memory-budget={budget}", f"--model-footprint-state-file={state}")
    )
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    seconds = httpclient.InferInput("SECONDS", [1], "FP32")
    seconds.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    # The idle base is taken once each backend's framework is imported (onnxruntime's libraries and the server's
    # side of a worker link): that is paid once per server, not per model, and no model's footprint holds it.
    _infer_adder(client, adders[0])
    _infer_seconds(server, pythons[0])
    for name in (adders[0], pythons[0]):
        requests.post(f"{server.base}/v2/repository/models/{name}/unload", timeout=60).raise_for_status()
    # What stays: the server, its spare workers (2 by default with loading on demand) and the fork server they were
    # forked from (on by default with loading on demand), once they have imported.
    _wait_for(lambda: len(psutil.Process(server.process.pid).children()) == 3, 30,
              "only the spare workers and the fork server to remain")  # fmt: skip
    settled: list[int] = []
    sampled_at = [0.0]

    def pss_settled() -> bool:  # four samples half a second apart within 1 MiB of each other
        if time.monotonic() - sampled_at[0] >= 0.5:
            sampled_at[0] = time.monotonic()
            settled.append(_tree_pss(server.process.pid))
        return len(settled) > 3 and max(settled[-4:]) - min(settled[-4:]) < (1 << 20)

    _wait_for(pss_settled, 60, "the spare workers to finish their imports")
    base = max(settled[-4:])
    base_sizes = _tree_pss_by_process(server.process.pid)

    peak: dict[str, Any] = {"pss": 0, "sizes": {}}
    stop = threading.Event()

    def measure() -> None:
        sizes = _tree_pss_by_process(server.process.pid)
        if sum(sizes.values()) > peak["pss"]:
            peak["pss"], peak["sizes"] = sum(sizes.values()), sizes

    def sample() -> None:
        while not stop.is_set():
            measure()
            stop.wait(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        deadline = time.monotonic() + 120
        for _round in range(3):  # each model in turn: with room for 3 Python models, most loads evict
            for name in pythons + adders:
                if name in pythons:
                    answer = client.infer(name, [seconds], outputs=[httpclient.InferRequestedOutput("OUT", binary_data=True)])
                    assert answer.as_numpy("OUT").shape == ((8 << 20) // 4,)
                else:
                    assert _infer_adder(client, name) == float(adders.index(name))
                measure()
                # Room for three: a reloaded model is charged what it held after serving, not what it holds
                # before its first answer has grown its arenas (a fourth got in that way, and overran the budget).
                ready = [n for n, r in index_rows(server.base).items() if r.get("state") == "READY" and n in pythons]
                assert len(ready) <= 3, ready
            assert time.monotonic() < deadline, "the churn took too long"
    finally:
        stop.set()
        sampler.join(10)
    evictions = metric_value(server.metrics_port, "nereid_model_evictions_total", cause="budget")
    assert evictions >= 9, server.log()
    assert metric_value(server.metrics_port, "nereid_models_resident_bytes") <= budget
    # The tolerance is the server's own memory that no model holds: an 8 MiB answer in flight is in the server twice
    # (copied out of the worker's arena, then the response body), and the allocator keeps a little heap after many
    # loads (1-3 MiB over 36 loads when measured). Charging workers by USS, which leaves the arenas out, overshoots
    # by 8+ MiB per resident Python model; keeping each load's garbage (as the server did) by 8 MiB per load.
    tolerance = (2 * 8 + 8) << 20
    assert peak["pss"] <= base + budget + tolerance, (
        f"real memory {peak['pss'] / 2**20:.1f} MiB > base {base / 2**20:.1f} + budget {budget / 2**20:.1f} "
        f"+ tolerance {tolerance / 2**20:.0f} MiB; at rest {_mib(base_sizes)}; at the peak {_mib(peak['sizes'])}"
    )


def test_a_reloaded_model_is_charged_what_it_held_after_serving_not_less(tmp_path: Path, stop_after) -> None:
    repository = tmp_path / "models"
    python_model(repository, "grows", alloc_mib="8", out_mib="32")  # its first answer grows its output arena 32 MiB
    server = stop_after(start_nereid(repository, *ON_DEMAND, "--model-memory-budget=1GiB",
                                     "--model-footprint-resample-secs=0.5"))  # fmt: skip
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    seconds = httpclient.InferInput("SECONDS", [1], "FP32")
    seconds.set_data_from_numpy(np.zeros(1, dtype=np.float32))

    def charged() -> int:
        return int(index_rows(server.base)["grows"].get("footprint_bytes", 0))  # type: ignore[call-overload]

    client.infer("grows", [seconds], outputs=[httpclient.InferRequestedOutput("OUT", binary_data=True)])
    # A worker, its 8 MiB and its grown 32 MiB arena: over 40 MiB once a re-sample has seen the arena (about
    # 20 MiB without it).
    _wait_for(lambda: charged() >= 40 << 20, 30, "a re-sample to charge the grown arena")
    served = charged()
    requests.post(f"{server.base}/v2/repository/models/grows/unload", timeout=60).raise_for_status()
    requests.post(f"{server.base}/v2/repository/models/grows/load", timeout=60).raise_for_status()
    # Measured again right after the reload, before any request, it would be about 20 MiB once more: a budget
    # would admit it, and the models beside it, on memory it takes back at its first answer.
    assert charged() >= served, (charged(), served)


def test_a_small_model_ahead_in_the_eviction_order_is_kept_when_evicting_it_would_not_make_the_room(
    tmp_path: Path, stop_after
) -> None:
    repository = tmp_path / "models"
    for name in ("p0", "p1", "p2"):
        python_model(repository, name, alloc_mib="32")
    onnx_adder(repository, "small", 1.0)
    state = tmp_path / "footprints.json"
    server = start_nereid(repository, *ON_DEMAND, f"--model-footprint-state-file={state}")
    try:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        _infer_adder(client, "small")
        for name in ("p0", "p1", "p2"):
            _infer_seconds(server, name)
    finally:
        assert server.stop() == 0, server.log()
    sizes = {n: int(e["host_bytes"]) for n, e in json.loads(state.read_text())["models"].items()}
    assert sizes["small"] < min(sizes[n] for n in ("p0", "p1", "p2")) / 4, sizes
    budget = sizes["small"] + sizes["p0"] + sizes["p1"] + sizes["p2"] // 2  # room for two of the three, and small
    server = stop_after(
        start_nereid(repository, *ON_DEMAND, f"--model-memory-budget={budget}", f"--model-footprint-state-file={state}",
                     "--model-eviction-policy=lru")  # fmt: skip
    )
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    assert _infer_adder(client, "small") == 1.0  # the least recently used of all
    _infer_seconds(server, "p0")
    _infer_seconds(server, "p1")
    _infer_seconds(server, "p2")  # needs a Python model's room: evicting small as well would free nothing needed
    assert _state(server, "p0") == ("UNAVAILABLE", "evicted: budget")
    assert _state(server, "small")[0] == "READY"
    assert _state(server, "p1")[0] == "READY"


def test_under_a_budget_the_frequency_policy_counts_uses_per_byte_so_a_big_model_used_a_little_more_goes_first(
    tmp_path: Path, stop_after
) -> None:
    repository = tmp_path / "models"
    python_model(repository, "big", alloc_mib="96")
    for name in ("s0", "s1"):
        python_model(repository, name)
    state = tmp_path / "footprints.json"
    _measure_footprints(repository, ["big", "s0", "s1"], state)
    sizes = {n: int(e["host_bytes"]) for n, e in json.loads(state.read_text())["models"].items()}
    assert sizes["big"] > 4 * max(sizes["s0"], sizes["s1"]), sizes
    # Room for big and one small model. The slack (nine tenths of a small model) is what s0 and big may measure
    # above their remembered sizes as they reload: a forked worker's PSS moves with how many processes share its
    # pages. With half a model of slack, s0 once measured enough more to be evicted for big, and s1 then fitted.
    budget = sizes["big"] + sizes["s0"] + sizes["s1"] * 9 // 10
    server = stop_after(
        start_nereid(repository, *ON_DEMAND, f"--model-memory-budget={budget}", f"--model-footprint-state-file={state}")
    )
    _infer_seconds(server, "s0")
    for _ in range(2):
        _infer_seconds(server, "big")  # twice s0's uses, on more than four times its bytes
    _infer_seconds(server, "s1")  # needs a small model's room: by uses alone s0 would go, per byte big goes
    assert _state(server, "big") == ("UNAVAILABLE", "evicted: budget"), (_state(server, "s0"), server.log()[-3000:])
    assert _state(server, "s0")[0] == "READY"
    assert _state(server, "s1")[0] == "READY"
