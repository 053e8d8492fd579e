"""Rollouts on a real `nereid serve` with the official tritonclient and the `nereid rollout` CLI: promotion through
every step, rollback on errors and on latency, a divergence gate that stops a candidate in shadow, sticky users,
restarts, and the metrics."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format, struct_pb2
from tritonclient.utils import InferenceServerException

from tests.integration.rollout_models import (
    add_version,
    callers_of_m,
    versioned_decoupled_model,
    versioned_python_model,
)
from tests.servers import ROOT, RunningServer, free_port, start_nereid

FLAGS = ("--model-control-mode=explicit", "--load-model=m")


@pytest.fixture
def started() -> Iterator[Callable[..., RunningServer]]:
    running: list[RunningServer] = []

    def start(repository: Path, *flags: str) -> RunningServer:
        server = start_nereid(repository, *FLAGS, *flags, log_dir=repository.parent)
        running.append(server)
        return server

    yield start
    for server in running:
        server.stop()


def _rollout(server: RunningServer, verb: str = "", body: dict[str, Any] | None = None) -> dict[str, Any]:
    path = f"{server.base}/v2/nereid/rollouts/m" + (f"/{verb}" if verb else "")
    response = requests.post(path, json=body or {}, timeout=10) if body is not None or verb else requests.get(path, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


class _Client:
    """Requests naming no version, one after another: which answer each got, failures, latencies."""

    def __init__(self, server: RunningServer) -> None:
        self.client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        self.outputs: list[float] = []
        self.failures = 0
        self.latencies: list[float] = []

    def send(self, user: str | None = None) -> float | None:
        tensor = httpclient.InferInput("X", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
        started = time.monotonic()
        try:
            result = self.client.infer("m", [tensor], parameters={"user": user} if user else None)
        except InferenceServerException:
            self.failures += 1
            return None
        finally:
            self.latencies.append(time.monotonic() - started)
        value = float(result.as_numpy("Y")[0, 0])
        self.outputs.append(value)
        return value

    def until_done(self, server: RunningServer, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for _ in range(10):
                self.send()
            status = _rollout(server)
            if status["state"] not in ("running", "paused"):
                return status
        raise AssertionError(f"the rollout did not end within {timeout}s: {_rollout(server)}")


def test_a_candidate_that_answers_like_the_primary_is_promoted_through_every_step(tmp_path: Path, started: Callable[..., RunningServer]) -> None:
    # A p99 objective far above any answer: a window of 10 requests has the p99 of its slowest, which a busy 2-core
    # machine can push past the default relative gate (1.5x the primary's plus 5 ms) for a candidate like the primary.
    server = started(versioned_python_model(tmp_path / "repo", "m", rollout_max_p99_ms="2000").parent)
    steps = "shadow=100%/1.5s:20,canary=20%/1.5s:10,canary=50%/1.5s:10"
    begun = _rollout(server, "start", {"version": "2", "steps": steps})
    assert (begun["primary"], begun["candidate"], begun["state"], begun["step"]) == ("1", "2", "running", 0)
    client = _Client(server)
    status = client.until_done(server)
    assert status["state"] == "promoted" and client.failures == 0, status
    history = requests.get(f"{server.base}/v2/nereid/rollouts/m/history", timeout=10).json()["history"]
    events = [e["event"] for e in history]
    assert events == ["started", "step passed", "step started", "step passed", "step started", "step passed", "promoted"]
    starts = [history[0]["at"]] + [e["at"] for e in history if e["event"] == "step started"]
    passes = [e["at"] for e in history if e["event"] == "step passed"]
    assert all(end - begin >= 1.5 for begin, end in zip(starts, passes))  # each step lasted its duration
    for event, minimum in zip((e for e in history if e["event"] == "step passed"), (20, 10, 10)):
        candidate_requests = int(event["detail"].split("candidate ")[1].split(" requests")[0])
        assert candidate_requests >= minimum  # ... and saw its minimum of candidate requests
    # promoted: requests naming no version now go to version 2, which the CLI reports too
    status = json.loads(_cli(server, "status", "m", "--json"))
    assert status["state"] == "promoted"


def test_a_candidate_failing_a_fifth_of_its_requests_is_rolled_back_at_its_first_canary_step(tmp_path: Path, started: Callable[..., RunningServer]) -> None:
    server = started(versioned_python_model(tmp_path / "repo", "m", v2_fail_every="5", v2_offset="2").parent)
    _rollout(server, "start", {"version": "2", "steps": "canary=20%/30s:30,canary=50%/30s"})
    client = _Client(server)
    status = client.until_done(server)
    assert status["state"] == "rolled_back" and status["step"] == 0 and "error rate" in status["reason"]
    served = len(client.outputs) + client.failures
    assert client.failures <= 0.2 * served  # users saw at most the canary's share of the window failing
    rolled_back_at = len(client.outputs)
    for _ in range(20):
        client.send()
    assert set(client.outputs[rolled_back_at:]) == {1.0}  # every request to the primary from then on
    metrics = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    assert 'nereid_rollout_state{candidate="2",model="m",state="rolled_back"} 1' in metrics
    assert 'nereid_rollout_rollbacks_total{model="m"} 1' in metrics


def test_a_slow_candidate_is_rolled_back_in_shadow_and_the_clients_never_wait_for_it(tmp_path: Path, started: Callable[..., RunningServer]) -> None:
    server = started(versioned_python_model(tmp_path / "repo", "m", v2_delay_ms="100").parent)
    _rollout(server, "start", {"version": "2", "steps": "shadow=100%/60s:10,canary=10%/60s"})
    client = _Client(server)
    status = client.until_done(server)
    assert status["state"] == "rolled_back" and status["step"] == 0 and "p99" in status["reason"]
    assert client.failures == 0 and max(client.latencies) < 0.1  # the shadow's 100 ms never reached a client


def test_a_candidate_over_its_cpu_objective_is_rolled_back_on_cost(tmp_path: Path, started: Callable[..., RunningServer]) -> None:
    repository = versioned_python_model(tmp_path / "repo", "m", v2_burn_ms="30", rollout_max_cpu_ms_per_request="15").parent
    server = started(repository)
    _rollout(server, "start", {"version": "2", "steps": "shadow=100%/60s:20,canary=10%/60s"})
    status = _Client(server).until_done(server)
    assert status["state"] == "rolled_back" and status["step"] == 0 and "CPU" in status["reason"], status
    cost = float(status["reason"].split("CPU ")[1].split(" ms")[0])
    assert 25 <= cost <= 60  # the candidate's 30 ms of CPU per request, measured from its worker process


def test_a_diverging_candidate_is_stopped_in_shadow_before_any_user_sees_it(tmp_path: Path, started: Callable[..., RunningServer]) -> None:
    repository = versioned_python_model(tmp_path / "repo", "m", v2_offset="3", rollout_max_divergence="0.05").parent
    server = started(repository)
    _rollout(server, "start", {"version": "2", "steps": "shadow=100%/60s:20,canary=10%/60s"})
    client = _Client(server)
    status = client.until_done(server)
    assert status["state"] == "rolled_back" and status["step"] == 0 and "divergence" in status["reason"]
    assert set(client.outputs) == {1.0}  # no client ever got version 2's answer


def test_a_sticky_user_meets_one_version_throughout_the_rollout(tmp_path: Path, started: Callable[..., RunningServer]) -> None:
    server = started(versioned_python_model(tmp_path / "repo", "m", v2_offset="2").parent)
    _cli(server, "start", "m", "2", "--steps", "canary=50%/600s:100000", "--sticky-key", "user")
    client = _Client(server)
    seen: dict[str, set[float | None]] = {}
    for _ in range(5):
        for user in range(20):
            seen.setdefault(f"user-{user}", set()).add(client.send(f"user-{user}"))
    assert all(len(answers) == 1 for answers in seen.values())
    assert {next(iter(a)) for a in seen.values()} == {1.0, 2.0}


def test_a_rollout_resumes_its_step_after_a_restart_and_a_rollback_survives_one(tmp_path: Path, started: Callable[..., RunningServer]) -> None:
    repository = versioned_python_model(tmp_path / "repo", "m", v2_offset="2", rollout_max_p99_ms="2000").parent
    state = f"--rollout-state-file={tmp_path / 'rollouts.json'}"
    first = started(repository, state)
    _rollout(first, "start", {"version": "2", "steps": "canary=10%/1s:5,canary=50%/600s:100000"})
    client = _Client(first)
    while _rollout(first)["step"] == 0:
        client.send()
    assert first.stop() == 0
    second = started(repository, state)
    resumed = _rollout(second)
    assert (resumed["state"], resumed["step"]) == ("running", 1)
    _rollout(second, "abort")
    assert second.stop() == 0
    third = started(repository, state)
    assert _rollout(third)["state"] == "aborted"
    client = _Client(third)
    assert {client.send() for _ in range(20)} == {1.0}  # the primary keeps all traffic, though version 2 is newest


def _ready_versions(server: RunningServer) -> list[str]:
    index = requests.post(f"{server.base}/v2/repository/index", json={}, timeout=10).json()
    return sorted(row["version"] for row in index if row["name"] == "m" and row.get("state") == "READY")


def _until(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.05)


def test_a_candidate_outside_the_version_policy_is_loaded_beside_the_primary_and_promotion_retires_the_primary(
    tmp_path: Path, started: Callable[..., RunningServer]
) -> None:
    folder = versioned_python_model(tmp_path / "repo", "m", versions=1, policy="latest { num_versions: 1 }", v2_offset="2")
    state = f"--rollout-state-file={tmp_path / 'rollouts.json'}"
    server = started(folder.parent, state)
    add_version(folder, 2)  # dropped in after the load: the policy alone would swap version 1 for it
    assert _ready_versions(server) == ["1"]
    client = _Client(server)
    _rollout(server, "start", {"version": "2", "steps": "canary=50%/600s:100000"})
    assert _ready_versions(server) == ["1", "2"]  # loaded beside the primary, whatever the policy says
    assert {client.send() for _ in range(40)} == {1.0, 2.0} and client.failures == 0
    _rollout(server, "promote")
    _until(lambda: _ready_versions(server) == ["2"])  # the policy (latest 1) retires version 1
    assert {client.send() for _ in range(20)} == {2.0} and client.failures == 0
    assert server.stop() == 0
    again = started(folder.parent, state)
    client = _Client(again)
    assert _ready_versions(again) == ["2"] and {client.send() for _ in range(20)} == {2.0}
    undone = _rollout(again, "undo")  # version 1 loads again before it takes the traffic back
    assert undone["state"] == "rolled_back" and "1" in _ready_versions(again)
    assert {client.send() for _ in range(20)} == {1.0} and client.failures == 0


def _ask(server: RunningServer, model: str) -> float:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    tensor = httpclient.InferInput("X", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
    return float(client.infer(model, [tensor]).as_numpy("Y")[0, 0])


def test_bls_calls_are_split_like_clients_and_ensemble_steps_stay_on_the_version_the_rollout_settles_on(
    tmp_path: Path, started: Callable[..., RunningServer]
) -> None:
    repository = versioned_python_model(tmp_path / "repo", "m", v2_offset="2").parent
    callers_of_m(repository)
    server = started(repository, "--load-model=bls_m", "--load-model=ensemble_m")
    assert _ask(server, "ensemble_m") == 2.0  # no rollout: the step's -1 is the newest version, as in Triton
    _rollout(server, "start", {"version": "2", "steps": "canary=50%/600s:100000"})
    assert {_ask(server, "bls_m") for _ in range(40)} == {1.0, 2.0}  # a BLS call naming no version is split
    assert {_ask(server, "ensemble_m") for _ in range(20)} == {1.0}  # an ensemble step runs on the primary
    versions = _rollout(server)["versions"]
    assert versions["1"]["requests"] + versions["2"]["requests"] == 40  # the BLS calls are what the gates judge
    _rollout(server, "promote")
    assert {_ask(server, "ensemble_m") for _ in range(10)} | {_ask(server, "bls_m") for _ in range(10)} == {2.0}


def test_a_decoupled_model_streams_from_its_canary_and_its_shadow_streams_are_drained_off_the_clients_path(
    tmp_path: Path, started: Callable[..., RunningServer]
) -> None:
    server = started(versioned_decoupled_model(tmp_path / "repo", "m", v2_offset="2").parent)

    def streams(count: int) -> dict[str, list[float]]:
        answers: dict[str, list[float]] = {}
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.start_stream(lambda result, error: answers.setdefault(
            result.get_response().id, []).append(float(result.as_numpy("Y")[0, 0])) if error is None else None)  # fmt: skip
        tensor = grpcclient.InferInput("X", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
        for i in range(count):
            client.async_stream_infer("m", [tensor], request_id=str(i))
        _until(lambda: sum(map(len, answers.values())) == 3 * count)
        client.stop_stream()
        return answers

    _rollout(server, "start", {"version": "2", "steps": "shadow=100%/600s:100000"})
    assert {value for answer in streams(10).values() for value in answer} == {1.0}  # clients get the primary's streams
    _until(lambda: _rollout(server)["versions"]["2"]["requests"] == 10)  # ... while each was copied to the candidate
    _rollout(server, "abort")
    _rollout(server, "start", {"version": "2", "steps": "canary=50%/600s:100000"})
    answers = streams(30)
    assert all(len(set(answer)) == 1 for answer in answers.values())  # a stream comes from one version
    assert {answer[0] for answer in answers.values()} == {1.0, 2.0}


def test_under_the_memory_budget_a_running_rollout_pins_its_model(tmp_path: Path, started: Callable[..., RunningServer]) -> None:
    repository = versioned_python_model(tmp_path / "repo", "m", v2_offset="2").parent
    # A declared footprint stands until a measurement exists: 'big' fits the budget only once 'm' has left.
    versioned_python_model(repository, "big", versions=1, **{"nereid.memory_footprint": "2030MiB"})
    server = started(repository, "--model-memory-budget=2048MiB")
    _rollout(server, "start", {"version": "2", "steps": "canary=50%/600s:100000"})
    refused = requests.post(f"{server.base}/v2/repository/models/big/load", timeout=60)
    assert refused.status_code == 503 and "'m'" in refused.json()["error"] and "(pinned by its rollout)" in refused.json()["error"]
    assert {_ask(server, "m") for _ in range(20)} == {1.0, 2.0}  # the rollout goes on
    _rollout(server, "abort")
    loaded = requests.post(f"{server.base}/v2/repository/models/big/load", timeout=60)
    assert loaded.status_code == 200, loaded.text  # no longer pinned: 'm' gives way
    assert _ready_versions(server) == []


def test_an_llm_rollout_through_the_openai_client_keeps_each_user_on_one_version(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    from nereid.backends.llm.tiny_model import build_tiny_model, write_vllm_model

    repository = tmp_path / "repo"
    engine = {"max_model_len": 128, "max_num_seqs": 4, "cpu_threads": 1}
    folder = write_vllm_model(repository, "chat", engine, cached=True)
    build_tiny_model(folder / "2", seed=1)  # version 2: other weights, so other answers
    (folder / "2" / "model.json").write_text((folder / "1" / "model.json").read_text())
    (folder / "config.pbtxt").write_text((folder / "config.pbtxt").read_text() + "version_policy { all { } }\n")
    port = free_port()
    server = start_nereid(repository, f"--openai-port={port}", "--openai-address=127.0.0.1", log_dir=tmp_path, timeout=120)
    try:
        begun = _rollout_of(server, "chat", {"version": "2", "steps": "canary=50%/600s:100000", "sticky_key": "user"})
        assert (begun["primary"], begun["candidate"]) == ("1", "2")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)

        def answer(user: str, stream: bool) -> str:
            messages = [{"role": "user", "content": "Say something"}]
            if stream:
                chunks = client.chat.completions.create(model="chat", messages=messages, max_tokens=6, temperature=0, user=user, stream=True)
                return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
            reply = client.chat.completions.create(model="chat", messages=messages, max_tokens=6, temperature=0, user=user)
            return reply.choices[0].message.content or ""

        answers = {f"user-{i}": {answer(f"user-{i}", stream) for stream in (False, True, False)} for i in range(12)}
        assert all(len(seen) == 1 for seen in answers.values())  # a user meets one version, streaming or not
        assert len({next(iter(seen)) for seen in answers.values()}) == 2  # ... and the users meet both
        versions = _rollout_of(server, "chat")["versions"]
        assert versions["1"]["requests"] + versions["2"]["requests"] == 36 and versions["2"]["errors"] == 0
    finally:
        server.stop()


def _rollout_of(server: RunningServer, model: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    url = f"{server.base}/v2/nereid/rollouts/{model}"
    answer = requests.post(url + "/start", json=body, timeout=30) if body is not None else requests.get(url, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_rollouts_over_grpc_answer_what_the_http_routes_answer(tmp_path: Path, started: Callable[..., RunningServer]) -> None:
    server = started(versioned_python_model(tmp_path / "repo", "m", v2_offset="2").parent)

    def call(method: str, **fields: str) -> dict[str, Any]:
        request = struct_pb2.Struct()
        request.update(fields)
        with grpc.insecure_channel(server.grpc_url) as channel:
            rpc = channel.unary_unary(f"/nereid.rollouts.v1.Rollouts/{method}", request_serializer=struct_pb2.Struct.SerializeToString,
                                      response_deserializer=struct_pb2.Struct.FromString)  # fmt: skip
            return json_format.MessageToDict(rpc(request, timeout=30))

    begun = call("Start", model="m", version="2", steps="canary=50%/600s:100000", sticky_key="user")
    assert (begun["primary"], begun["candidate"], begun["state"], begun["sticky_key"]) == ("1", "2", "running", "user")
    assert call("Pause", model="m")["state"] == "paused"
    over_grpc, over_http = call("Status", model="m"), _rollout(server)
    for status in (over_grpc, over_http):
        del status["current_step"]["elapsed_seconds"]
    assert over_grpc == over_http  # the same object as over HTTP
    assert [r["model"] for r in call("Status")["rollouts"]] == ["m"]
    assert call("Abort", model="m")["state"] == "aborted"
    assert [e["event"] for e in call("History", model="m")["history"]] == ["started", "paused", "aborted"]
    with pytest.raises(grpc.RpcError) as missing:
        call("Status", model="nope")
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND and missing.value.details() == "[model 'nope'] has no rollout"
    with pytest.raises(grpc.RpcError) as bad:
        call("Start", model="m", version="2", steps="blue=1%/1s")
    assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "rollout step 'blue=1%/1s'" in bad.value.details()


def test_bad_rollout_requests_get_clear_errors(tmp_path: Path, started: Callable[..., RunningServer]) -> None:
    server = started(versioned_python_model(tmp_path / "repo", "m").parent)
    answer = requests.post(f"{server.base}/v2/nereid/rollouts/m/start", json={"version": "7", "steps": "canary=10%/1s"}, timeout=10)
    assert answer.status_code == 503 and "version 7 is not in the repository (ready: 1, 2)" in answer.json()["error"]
    answer = requests.post(f"{server.base}/v2/nereid/rollouts/m/start", json={"version": "2", "steps": "blue=1%/1s"}, timeout=10)
    assert answer.status_code == 400 and "rollout step 'blue=1%/1s'" in answer.json()["error"]
    answer = requests.get(f"{server.base}/v2/nereid/rollouts/nope", timeout=10)
    assert answer.status_code == 404 and answer.json()["error"] == "[model 'nope'] has no rollout"
    failed = subprocess.run([sys.executable, "-m", "nereid", "rollout", "pause", "m", "--url", server.http_url],
                            capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert failed.returncode == 1 and "has no rollout" in failed.stderr


def _cli(server: RunningServer, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "nereid", "rollout", *args, "--url", server.http_url],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout
