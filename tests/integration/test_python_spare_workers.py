"""A Python worker's fast start. Spare workers (`--backend-config=python,spare-workers=N`): a load takes a worker that
was started before it, the pool fills again, the spares end with the server, and a bad count is refused. The fork
server (`--backend-config=python,fork-server=true`): workers forked past their imports are the server's children,
reseed numpy, and loads go on when the fork server dies."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
import tritonclient.http as httpclient

from tests.integration.onnx_builders import write
from tests.servers import RunningServer, start_nereid

WORKER_MODULE = "nereid.backends.python.worker"
FORKED_WORKER_NAME = "nereid-worker"
FORK_SERVER_NAME = "nereid-forksrv"

_PID_MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pid = np.array([os.getpid()], dtype=np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]
"""


def _pid_model(repository: Path, name: str, source: str = _PID_MODEL, outputs: tuple[str, ...] = ("PID",)) -> None:
    write(repository / name / "1" / "model.py", source)
    declared = ", ".join(f'{{ name: "{output}" data_type: TYPE_INT64 dims: [1] }}' for output in outputs)
    write(
        repository / name / "config.pbtxt",
        'backend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "IN" data_type: TYPE_FP32 dims: [1] }]\n'
        f"output [{declared}]\n"
        "instance_group [{ kind: KIND_CPU count: 1 }]\n",
    )


def _workers(server: RunningServer) -> set[int]:
    pids = set()
    for child in psutil.Process(server.process.pid).children(recursive=True):
        try:
            if WORKER_MODULE in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                pids.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return pids


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def _served_by(server: RunningServer, model: str) -> int:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    return int(client.infer(model, [tensor]).as_numpy("PID")[0])


def test_a_load_takes_a_spare_worker_and_the_pool_fills_again(tmp_path: Path) -> None:
    for name in ("first", "second", "third"):
        _pid_model(tmp_path, name)
    server = start_nereid(tmp_path, "--model-control-mode=explicit", "--backend-config=python,spare-workers=1")
    try:
        requests.post(f"{server.base}/v2/repository/models/first/load", timeout=60).raise_for_status()
        first = _served_by(server, "first")
        _wait_for(lambda: len(_workers(server)) == 2, 30, "one spare worker besides first's")
        (spare,) = _workers(server) - {first}
        requests.post(f"{server.base}/v2/repository/models/second/load", timeout=60).raise_for_status()
        assert _served_by(server, "second") == spare  # started before the load asked for it
        _wait_for(lambda: len(_workers(server)) == 3, 30, "the pool to fill again")
        (refill,) = _workers(server) - {first, spare}
        requests.post(f"{server.base}/v2/repository/models/third/load", timeout=60).raise_for_status()
        assert _served_by(server, "third") == refill
        spares = _workers(server) - {first, spare, refill}
    finally:
        assert server.stop() == 0, server.log()
    _wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                              for p in spares), 10, "the spares to end with the server")  # fmt: skip


def test_without_spares_each_load_starts_its_own_worker(tmp_path: Path) -> None:
    _pid_model(tmp_path, "only")
    server = start_nereid(tmp_path, "--model-control-mode=explicit", "--load-model=only")
    try:
        assert _workers(server) == {_served_by(server, "only")}  # explicit mode: no spares unless asked for
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("setting", "refusal"),
    [
        ("spare-workers=two", "'python,spare-workers': expected a whole number of workers (0 or more), got 'two'"),
        ("fork-server=maybe", "'python,fork-server': expected true or false, got 'maybe'"),
    ],
)
def test_a_bad_setting_fails_the_load_naming_the_setting(tmp_path: Path, setting: str, refusal: str) -> None:
    _pid_model(tmp_path, "m")
    server = start_nereid(tmp_path, "--model-control-mode=explicit", f"--backend-config=python,{setting}")
    try:
        response = requests.post(f"{server.base}/v2/repository/models/m/load", timeout=60)
        assert response.status_code == 400, response.text
        assert refusal in response.text
    finally:
        server.stop()


def test_no_spare_worker_outlives_a_sigkill_of_the_server(tmp_path: Path) -> None:
    _pid_model(tmp_path, "m")
    server = start_nereid(tmp_path, "--model-control-mode=explicit", "--backend-config=python,spare-workers=2",
                          "--load-model=m")  # fmt: skip
    try:
        _wait_for(lambda: len(_workers(server)) == 3, 30, "the model's worker and two spares")
        workers = _workers(server)
    finally:
        server.stop(signal.SIGKILL)

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    _wait_for(lambda: all(gone(pid) for pid in workers), 10, "every worker, spares too, to exit with the server")


_RANDOM_MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.drawn = np.random.randint(0, 2**62, size=1, dtype=np.int64)  # numpy's global generator, unseeded

    def execute(self, requests):
        out = [pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)), pb_utils.Tensor("DRAWN", self.drawn)]
        return [pb_utils.InferenceResponse(out) for _ in requests]
"""


def _pid_and_draw(server: RunningServer, model: str) -> tuple[int, int]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    result = client.infer(model, [tensor])
    return int(result.as_numpy("PID")[0]), int(result.as_numpy("DRAWN")[0])


def _children_named(server: RunningServer, name: str) -> set[int]:
    pids = set()
    for child in psutil.Process(server.process.pid).children():
        try:
            if child.name() == name and child.status() != psutil.STATUS_ZOMBIE:
                pids.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return pids


def test_forked_workers_are_the_servers_children_and_draw_their_own_random_numbers(tmp_path: Path) -> None:
    for name in ("a", "b"):
        _pid_model(tmp_path, name, _RANDOM_MODEL, ("PID", "DRAWN"))
    server = start_nereid(tmp_path, "--model-control-mode=explicit", "--backend-config=python,fork-server=true",
                          "--load-model=a", "--load-model=b")  # fmt: skip
    try:
        (a_pid, a_drawn), (b_pid, b_drawn) = _pid_and_draw(server, "a"), _pid_and_draw(server, "b")
        assert _children_named(server, FORKED_WORKER_NAME) == {a_pid, b_pid}  # forked, then adopted by the server
        assert len(_children_named(server, FORK_SERVER_NAME)) == 1
        assert a_drawn != b_drawn  # each worker reseeded numpy after the fork
        requests.post(f"{server.base}/v2/repository/models/a/unload", timeout=60).raise_for_status()
        # The server reaps the unloaded model's worker (no zombie is left behind).
        _wait_for(lambda: not psutil.pid_exists(a_pid), 10, "the unloaded worker to be reaped")
    finally:
        assert server.stop() == 0, server.log()


def test_loads_survive_a_dead_fork_server_and_a_new_one_takes_over(tmp_path: Path) -> None:
    for name in ("first", "second"):
        _pid_model(tmp_path, name)
    server = start_nereid(tmp_path, "--model-control-mode=explicit", "--backend-config=python,fork-server=true",
                          "--load-model=first")  # fmt: skip
    try:
        first = _served_by(server, "first")
        (dead,) = _children_named(server, FORK_SERVER_NAME)
        os.kill(dead, signal.SIGKILL)
        _wait_for(lambda: not psutil.pid_exists(dead), 10, "the killed fork server to be reaped")
        assert "fork server exited; workers start the slow way" in server.log()
        assert _served_by(server, "first") == first  # a forked worker outlives the fork server it came from
        # The next load starts a new fork server, waits for its imports and has its worker forked by it.
        requests.post(f"{server.base}/v2/repository/models/second/load", timeout=60).raise_for_status()
        (replacement,) = _children_named(server, FORK_SERVER_NAME)
        assert replacement != dead
        assert _served_by(server, "second") in _children_named(server, FORKED_WORKER_NAME)
    finally:
        assert server.stop() == 0, server.log()

