"""Python-backend failures: workers that crash or hang, unloading, and a server that is killed outright.

A crashed worker's requests fail at once with a clear error and its instance restarts; a hung execute fails the
requests that carry a timeout; unloading calls finalize() and ends the worker; no worker outlives the server. Each
test runs twice: with workers the server starts itself, and with workers forked by the fork server (adopted by the
server, so their exit statuses read the same).
"""

from __future__ import annotations

import os
import queue
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.servers import ROOT, RunningServer, start_nereid

REPOSITORY = ROOT / "tests" / "models" / "python"
WORKER_MODULE = "nereid.backends.python.worker"
FORKED_WORKER_NAME = "nereid-worker"
FORK_SERVER_NAME = "nereid-forksrv"
# How each run starts its workers: the server's own subprocesses, or forks of the fork server.
WORKER_STARTS = {"started": "--backend-config=python,fork-server=false", "forked": "--backend-config=python,fork-server=true"}


@pytest.fixture(scope="module", params=sorted(WORKER_STARTS))
def worker_start(request: pytest.FixtureRequest) -> str:
    return WORKER_STARTS[request.param]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, worker_start: str) -> Iterator[RunningServer]:
    running = start_nereid(
        REPOSITORY,
        worker_start,
        "--model-control-mode=explicit",
        "--load-model=crash",
        "--load-model=hang",
        "--load-model=logging",
        "--load-model=repeat",
        "--exit-timeout-secs=2",
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    yield running
    assert running.stop() == 0, running.log()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def _workers(server: RunningServer) -> set[int]:
    children = psutil.Process(server.process.pid).children(recursive=True)
    pids = set()
    for child in children:
        try:
            is_worker = WORKER_MODULE in " ".join(child.cmdline()) or child.name() == FORKED_WORKER_NAME
            if is_worker and child.status() != psutil.STATUS_ZOMBIE:
                pids.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return pids


def _call(server: RunningServer, model: str, mode: str, **parameters: Any) -> requests.Response:
    body: dict[str, Any] = {"inputs": [{"name": "MODE", "shape": [1], "datatype": "BYTES", "data": [mode]}]}
    if parameters:
        body["parameters"] = parameters
    return requests.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=60)


def _pid(server: RunningServer, model: str) -> int:
    reply = _call(server, model, "ok")
    assert reply.status_code == 200, reply.text
    return int(reply.json()["outputs"][0]["data"][0])


@pytest.mark.parametrize(
    ("mode", "how"),
    [("segfault", "was killed by SIGSEGV"), ("exit", "exited with code 3"), ("kill", "was killed by SIGKILL")],
)
def test_a_worker_that_dies_fails_its_requests_at_once_and_the_instance_restarts(
    server: RunningServer, mode: str, how: str
) -> None:
    before = _pid(server, "crash")
    started = time.monotonic()
    reply = _call(server, "crash", mode)
    elapsed = time.monotonic() - started
    assert reply.status_code == 500
    message = reply.json()["error"]
    assert message.startswith("[model 'crash' version 1] instance 'crash_0': the Python backend worker")
    assert f"(pid {before}) {how}" in message and "restarting" in message
    assert elapsed < 5
    # The instance serves again, from a new process; the old one is gone.
    after = _pid(server, "crash")
    assert after != before
    assert _gone(before)
    assert "restarting it" in server.log()


def test_a_worker_killed_while_idle_is_replaced_before_the_next_request(server: RunningServer) -> None:
    before = _pid(server, "crash")
    os.kill(before, signal.SIGKILL)
    noticed = f"(pid {before}) was killed by SIGKILL; restarting it"
    _wait_until(lambda: noticed in server.log(), 10, "the server to notice the killed worker")
    after = _pid(server, "crash")  # waits for the restart if it is still under way
    assert after != before


def test_a_worker_that_dies_mid_stream_ends_the_stream_with_the_error(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        tensor = grpcclient.InferInput("IN", [3], "INT32")
        tensor.set_data_from_numpy(np.array([7, 666, 8], np.int32))
        client.async_stream_infer("repeat", [tensor], enable_empty_final_response=True)
        result, error = results.get(timeout=30)
        assert error is None and int(result.as_numpy("OUT")[0]) == 7
        result, error = results.get(timeout=30)
        assert result is None
        assert "exited with code 5" in error.message() and "restarting" in error.message()
    finally:
        client.stop_stream()
        client.close()
    # The model streams again from a new worker.
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([9], np.int32))
    again: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: again.put((result, error)))
    try:
        client.async_stream_infer("repeat", [tensor])
        result, error = again.get(timeout=30)
        assert error is None and int(result.as_numpy("OUT")[0]) == 9
    finally:
        client.stop_stream()
        client.close()


def test_a_hung_execute_fails_requests_that_carry_a_timeout_and_the_instance_recovers(server: RunningServer) -> None:
    before = _pid(server, "hang")
    started = time.monotonic()
    reply = _call(server, "hang", "hang", timeout=300_000)
    elapsed = time.monotonic() - started
    assert reply.status_code == 503, reply.text
    assert "Request timeout expired" in reply.json()["error"]
    assert 0.3 <= elapsed < 5
    # Nobody waits for the hung execute any more, so its worker is replaced and the model serves again.
    after = _pid(server, "hang")
    assert after != before
    _wait_until(lambda: _gone(before), 10, "the hung worker to be ended")


def test_unloading_a_model_stuck_in_execute_fails_the_request_and_ends_the_worker(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    pid = _pid(server, "hang")
    with ThreadPoolExecutor(1) as pool:
        stuck = pool.submit(_call, server, "hang", "hang")
        _wait_until(lambda: f"hanging in execute (pid {pid})" in server.log(), 10, "the request to reach execute()")
        client.unload_model("hang")  # waits --exit-timeout-secs for the request, then ends the worker
        reply = stuck.result(timeout=30)
    assert reply.status_code == 503
    assert "was unloaded while this request was still executing" in reply.json()["error"]
    _wait_until(lambda: _gone(pid), 10, "the stuck worker to be ended")
    client.load_model("hang")
    assert _pid(server, "hang") != pid


def test_unload_calls_finalize_and_ends_the_worker_process(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    marker = np.array([b"before-unload"], dtype=np.object_)
    tensor = httpclient.InferInput("MARKER", [1], "BYTES")
    tensor.set_data_from_numpy(marker)
    client.infer("logging", [tensor])
    before = _workers(server)
    client.unload_model("logging")
    assert "logging model finalized" in server.log()
    _wait_until(lambda: len(before - _workers(server)) == 1, 10, "the unloaded model's worker to exit")
    assert not client.is_model_ready("logging")
    # The other models keep their workers.
    assert _pid(server, "crash") in _workers(server)


def test_no_worker_outlives_a_sigkill_of_the_server(tmp_path_factory: pytest.TempPathFactory, worker_start: str) -> None:
    running = start_nereid(
        REPOSITORY,
        worker_start,
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--load-model=concurrent",
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    try:
        workers = _workers(running)
        assert len(workers) == 3  # add_sub, and concurrent's two instances
        children = psutil.Process(running.process.pid).children()
        forked = {child.pid for child in children if child.name() == FORKED_WORKER_NAME}
        fork_servers = {child.pid for child in children if child.name() == FORK_SERVER_NAME}
        if worker_start == WORKER_STARTS["forked"]:
            assert forked == workers and len(fork_servers) == 1  # every worker forked, and adopted by the server
        else:
            assert not forked and not fork_servers
    finally:
        running.stop(signal.SIGKILL)
    ending = workers | fork_servers
    _wait_until(lambda: all(_gone(pid) for pid in ending), 10, "every worker to exit after the server was killed")
