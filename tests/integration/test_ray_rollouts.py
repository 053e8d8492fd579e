"""Rollouts through `nereid ray serve`'s ingress on a real 2-node Ray cluster on loopback (an ingress per node, two
model replicas): a canary step splits the requests naming no version between the versions on the replicas, from
either ingress; a command given to one ingress holds on the other; a candidate failing a fifth of its requests is
rolled back at its first canary step on every ingress; the status over HTTP is the single server's. One cluster
for the module; every Ray process it started is gone at the end, also when a test fails."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.rollout_models import versioned_python_model
from tests.ray_cluster import free_port_on
from tests.ray_driver import read_answer
from tests.servers import ROOT

# Addresses of their own: test_ray_serve.py runs its cluster on 127.0.0.2-5 at the same time (pytest -n 2), and two
# clusters on one node address mixed their replicas.
HEAD, WORKER = "127.0.0.12", "127.0.0.13"
NODES = (HEAD, WORKER)


class _Cluster:
    def __init__(self, driver: subprocess.Popen[str], port: int, metrics_port: int, state_file: Path) -> None:
        self.driver = driver
        self.port = port
        self.metrics_port = metrics_port
        self.state_file = state_file

    def base(self, node: str) -> str:
        return f"http://{node}:{self.port}"

    def rollout(self, node: str, model: str, verb: str = "", body: dict[str, Any] | None = None) -> dict[str, Any]:
        path = f"{self.base(node)}/v2/nereid/rollouts/{model}" + (f"/{verb}" if verb and verb != "history" else "")
        if verb == "history":
            response = requests.get(path + "/history", timeout=60)
        elif verb:
            response = requests.post(path, json=body or {}, timeout=120)
        else:
            response = requests.get(path, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()



@pytest.fixture(scope="module")
def cluster() -> Iterator[_Cluster]:
    tmp = tempfile.mkdtemp(prefix="nrrol", dir="/tmp")  # short: Ray's socket paths live under it
    repository = Path(tmp) / "models"
    versioned_python_model(repository, "m", v2_offset="2")
    versioned_python_model(repository, "mf", v2_fail_every="5", v2_offset="2")
    port = free_port_on(NODES)
    grpc, metrics = free_port_on(NODES), free_port_on(NODES)
    state_file = Path(tmp) / "rollouts.json"
    args = [
        "--model-repository", str(repository), "--num-replicas=2", "--cpus-per-replica=0.5",
        "--replicate-queue-time-us=0", f"--http-port={port}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
        f"--rollout-state-file={state_file}", "--log-verbose=0",
    ]  # fmt: skip
    log = open(Path(tmp) / "driver.log", "w")
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.ray_driver"], cwd=ROOT, text=True, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=log,
    )  # fmt: skip
    try:
        assert driver.stdin is not None
        driver.stdin.write(json.dumps({"nodes": list(NODES), "tmp": tmp, "args": args}) + "\n")
        driver.stdin.flush()
        try:
            started = read_answer(driver, 240)
        except AssertionError as exc:
            log.flush()
            raise AssertionError(f"{exc}\n{(Path(tmp) / 'driver.log').read_text()[-6000:]}") from None
        assert [w["node_ip"] for w in started["ingress"]] == list(NODES), started
        yield _Cluster(driver, port, metrics, state_file)
    finally:
        try:
            if driver.poll() is None:
                assert driver.stdin is not None
                driver.stdin.write(json.dumps({"op": "stop"}) + "\n")
                driver.stdin.close()
                driver.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait(10)
            log.close()
            for process in psutil.process_iter(["pid", "cmdline"]):  # last resort: this cluster's processes
                try:
                    if any(tmp in part for part in process.info["cmdline"] or []):
                        process.kill()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            shutil.rmtree(tmp, ignore_errors=True)


def _until(condition: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:g} s: {what}")
        time.sleep(0.1)


class _Client:
    """Requests naming no version through one node's ingress: the answers (Y = X + the version's offset), failures."""

    def __init__(self, cluster: _Cluster, node: str, model: str) -> None:
        self.client = httpclient.InferenceServerClient(f"{node}:{cluster.port}", network_timeout=60)
        self.model = model
        self.outputs: list[float] = []
        self.failures = 0

    def send(self, count: int = 1) -> None:
        tensor = httpclient.InferInput("X", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
        for _ in range(count):
            try:
                self.outputs.append(float(self.client.infer(self.model, [tensor]).as_numpy("Y")[0, 0]))
            except InferenceServerException:
                self.failures += 1


def test_a_canary_step_splits_requests_between_versions_from_every_ingress_and_a_command_holds_on_both(cluster: _Cluster) -> None:
    begun = cluster.rollout(HEAD, "m", "start", {"version": "2", "steps": "canary=50%/600s:100000"})
    assert (begun["primary"], begun["candidate"], begun["state"], begun["step"]) == ("1", "2", "running", 0)
    # The other ingress has it too (it asks the directory twice a second).
    _until(lambda: requests.get(cluster.base(WORKER) + "/v2/nereid/rollouts/m", timeout=30).status_code == 200, 10,
           "the rollout on the other ingress")  # fmt: skip
    clients = [_Client(cluster, node, "m") for node in NODES]
    for client in clients:
        client.send(40)
        assert client.failures == 0
        share = client.outputs.count(2.0) / len(client.outputs)  # Y = 0 + 2 from version 2, 0 + 1 from version 1
        assert set(client.outputs) == {1.0, 2.0} and 0.35 <= share <= 0.65, client.outputs
    # The replicas served both versions (their statistics, merged by the ingress as one server's).
    stats = {s["version"]: s["inference_count"] for s in clients[0].client.get_inference_statistics("m")["model_stats"]}
    assert stats.get("1", 0) > 0 and stats.get("2", 0) > 0 and stats["1"] + stats["2"] >= 80, stats
    # Each ingress's window counts the requests it routed: the single server's status.
    for node in NODES:
        status = cluster.rollout(node, "m")
        versions = status["versions"]
        assert versions["1"]["requests"] + versions["2"]["requests"] == 40, status
        assert versions["2"]["errors"] == 0 and versions["2"]["p99_ms"] > 0, status
    # A command given to one ingress holds on the other: aborted, every request goes to the primary.
    assert cluster.rollout(WORKER, "m", "abort")["state"] == "aborted"
    _until(lambda: cluster.rollout(HEAD, "m")["state"] == "aborted", 10, "the abort on the first ingress")
    for client in clients:
        before = len(client.outputs)
        client.send(10)
        assert set(client.outputs[before:]) == {1.0}, client.outputs[before:]
    # The state file (here one for both ingresses) keeps the choice.
    saved = json.loads(cluster.state_file.read_text())["rollouts"]
    assert [(r["model"], r["state"]) for r in saved] == [("m", "aborted")]


def test_a_failing_candidate_is_rolled_back_at_its_first_canary_step_on_every_ingress(cluster: _Cluster) -> None:
    cluster.rollout(WORKER, "mf", "start", {"version": "2", "steps": "canary=20%/30s:30,canary=50%/30s"})
    _until(lambda: requests.get(cluster.base(HEAD) + "/v2/nereid/rollouts/mf", timeout=30).status_code == 200, 10,
           "the rollout on the other ingress")  # fmt: skip
    client = _Client(cluster, HEAD, "mf")  # the head's ingress judges its window
    deadline = time.monotonic() + 90
    while cluster.rollout(HEAD, "mf")["state"] == "running":
        assert time.monotonic() < deadline, cluster.rollout(HEAD, "mf")
        client.send(10)
    status = cluster.rollout(HEAD, "mf")
    assert status["state"] == "rolled_back" and status["step"] == 0 and "error rate" in status["reason"], status
    candidate = status["versions"]["2"]
    assert candidate["requests"] >= 30 and candidate["errors"] > 0 and candidate["p99_ms"] > 0, status
    assert {"state", "step", "reason", "primary", "candidate", "steps", "current_step", "versions"} <= set(status)
    served = len(client.outputs) + client.failures
    assert client.failures <= 0.2 * served  # users saw at most the canary's share failing
    # The gate's decision reached the other ingress: from then on every request goes to the primary, on both.
    _until(lambda: cluster.rollout(WORKER, "mf")["state"] == "rolled_back", 10, "the rollback on the other ingress")
    assert "error rate" in cluster.rollout(WORKER, "mf")["reason"]
    for node in NODES:
        after = _Client(cluster, node, "mf")
        after.send(20)
        assert after.failures == 0 and set(after.outputs) == {1.0}, (node, after.outputs)
    events = [e["event"] for e in cluster.rollout(WORKER, "mf", "history")["history"]]
    assert events == ["started", "rolled_back"], events
    # Each node's metrics show its ingress's rollouts (the alert's series), beside its replicas' families.
    for node in NODES:
        text = requests.get(f"http://{node}:{cluster.metrics_port}/metrics", timeout=30).text
        assert 'nereid_rollout_state{candidate="2",model="mf",state="rolled_back"} 1' in text.splitlines(), text[-3000:]
    assert 'nereid_rollout_rollbacks_total{model="mf"} 1' in requests.get(f"http://{HEAD}:{cluster.metrics_port}/metrics", timeout=30).text.splitlines()


def test_shadow_copies_go_to_the_candidate_and_are_compared_but_the_client_gets_the_primarys_answers(cluster: _Cluster) -> None:
    cluster.rollout(HEAD, "m", "start", {"version": "2", "steps": "shadow=100%/600s:100000"})
    client = _Client(cluster, HEAD, "m")
    client.send(20)
    assert client.failures == 0 and set(client.outputs) == {1.0}  # never the candidate's answer

    def compared() -> dict[str, Any] | None:
        status = cluster.rollout(HEAD, "m")
        candidate = status["versions"]["2"]
        return status if candidate["requests"] == 20 and candidate["shadow_comparisons"] == 20 else None

    status = _until(compared, 10, "every shadow copy answered and compared")
    assert status["versions"]["1"]["requests"] == 20 and status["versions"]["2"]["divergence"] > 0, status
    assert cluster.rollout(HEAD, "m", "abort")["state"] == "aborted"
