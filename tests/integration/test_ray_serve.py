"""`nereid ray serve` on a real 3-node Ray cluster on loopback (nodes 127.0.0.2-4, started one at a time): models
spread over the nodes through Serve's multiplexing, a cold start lands on another replica, the budget-aware
eviction inside a full replica, tritonclient against every node's ingress, answers merged over replicas,
per-node metrics labelled by replica, queue-time autoscaling, and a node killed under load. One cluster and one
deployment for the module; every Ray process it started is gone at the end, also when a test fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from ray import serve
from tritonclient.utils import InferenceServerException

from nereid.ray.cli import parse_ray_serve_args
from tests.integration.onnx_builders import write
from tests.integration.orchestration_models import onnx_adder, python_model, sum_samples
from tests.ray_cluster import free_port_on
from tests.ray_driver import read_answer
from tests.servers import ROOT

HEAD, WORKERS = "127.0.0.2", ("127.0.0.3", "127.0.0.4")
NODES = (HEAD, *WORKERS)
ADDERS = [f"add{i}" for i in range(4)]
GROUPED = [f"g{i}" for i in range(1, 5)]  # at most one of these per replica (--model-group-limit g:1)
# Python models holding 256 MiB each: a replica's byte budget (--replica-memory-budget) holds one, never two.
BIG = [f"big{i}" for i in range(4)]
LATE = "127.0.0.5"  # a node that joins after the deployment
def _until(condition: Callable[[], Any], seconds: float, what: str, every: float = 0.2) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:g} s: {what}")
        time.sleep(every)


def _settled(read: Callable[[], Any], seconds: float, within: float = 30) -> Any:
    """`read()` once it has given the same answer for `seconds` (several heartbeats)."""
    deadline = time.monotonic() + within
    value = read()
    while True:
        time.sleep(seconds)
        again = read()
        if again == value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not settled within {within:g} s: {value} then {again}")
        value = again


class Deployment:
    """The running cluster and application, driven by `tests/ray_driver.py` in a process of its own, and what the
    tests ask of them."""

    def __init__(self, driver: subprocess.Popen[str], ports: dict[str, int], budget: int) -> None:
        self.driver = driver
        self.ports = ports
        self.budget = budget  # each replica's --model-memory-budget, in bytes

    def ask(self, op: str, timeout: float = 120, **fields: Any) -> Any:
        """One order to the driver and its answer."""
        assert self.driver.stdin is not None and self.driver.stdout is not None
        self.driver.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.driver.stdin.flush()
        answer = read_answer(self.driver, timeout)
        if "error" in answer:
            raise AssertionError(f"the Ray driver failed '{op}': {answer['error']}\n{answer.get('trace', '')}")
        return answer["ok"]

    def http(self, node: str = HEAD) -> httpclient.InferenceServerClient:
        return httpclient.InferenceServerClient(f"{node}:{self.ports['http']}", network_timeout=60)

    def base(self, node: str = HEAD) -> str:
        return f"http://{node}:{self.ports['http']}"

    def placement(self) -> dict[str, dict[str, Any]]:
        """Replica ID -> {"node_ip", "models"}, asked of each replica."""
        return self.ask("placement")

    def holders(self, model: str) -> list[dict[str, Any]]:
        return [where for where in self.placement().values() if model in where["models"]]

    def running_replicas(self) -> int:
        return self.ask("replicas")



_REPEAT_PY = '''
import numpy as np
import psutil
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for i in range(3):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value + i)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def _repeat_model(repository: Path) -> None:
    """IN INT32 [1] -> three responses OUT = IN, IN + 1, IN + 2 (decoupled)."""
    write(repository / "repeat" / "1" / "model.py", _REPEAT_PY)
    write(repository / "repeat" / "config.pbtxt",
          'backend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
          'input [{ name: "IN" data_type: TYPE_INT32 dims: [1] }]\n'
          'output [{ name: "OUT" data_type: TYPE_INT32 dims: [1] }]\n'
          'instance_group [{ kind: KIND_CPU count: 1 }]\n')  # fmt: skip


def _measured_budget(repository: Path, state_file: Path) -> int:
    """Each big model (and the small Python one) loaded once in a `nereid serve` of its own, so their footprints are
    measured and kept in the state file every replica reads; the budget: one big model and half of another."""
    from tests.integration.orchestration_models import index_rows
    from tests.servers import start_nereid

    server = start_nereid(repository, "--model-control-mode=explicit", "--model-load-on-demand=true",
                          f"--model-footprint-state-file={state_file}")  # fmt: skip
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=60)
        sizes = {}
        for name in [*BIG, "sleepy"]:
            _infer_seconds(client, name)
            sizes[name] = int(index_rows(server.base)[name]["footprint_bytes"])  # type: ignore[call-overload]
    finally:
        assert server.stop() == 0, server.log()
    # What the replicas charge: the sizes remembered as the models unloaded, after serving (a reload is charged at
    # least that), which can exceed what the index showed while they were resident.
    remembered = json.loads(state_file.read_text())["models"]
    sizes = {name: max(size, int(remembered[name]["host_bytes"])) for name, size in sizes.items()}
    big = [sizes[name] for name in BIG]
    assert max(big) < 1.1 * min(big) and sizes["sleepy"] < min(big) / 4, sizes  # the budget counts on these
    return max(big) + min(big) // 2


def _infer_seconds(client: httpclient.InferenceServerClient, model: str, seconds: float = 0.0) -> float:
    tensor = httpclient.InferInput("SECONDS", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], np.float32))
    return float(client.infer(model, [tensor]).as_numpy("OUT")[0])


def _infer(client: httpclient.InferenceServerClient, model: str, value: float = 1.0) -> np.ndarray:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
    return client.infer(model, [tensor]).as_numpy("OUTPUT0")


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    tmp = tempfile.mkdtemp(prefix="nrray", dir="/tmp")  # short: Ray's socket paths live under it
    repository = Path(tmp) / "models"
    for i, name in enumerate(ADDERS):
        onnx_adder(repository, name, float(i))
    for i, name in enumerate(GROUPED, start=1):
        onnx_adder(repository, name, 10.0 * i, 'parameters { key: "nereid.group" value { string_value: "g" } }\n')
    python_model(repository, "sleepy")
    for name in BIG:
        python_model(repository, name, alloc_mib="256")
    _repeat_model(repository)
    ports = {name: free_port_on((*NODES, LATE)) for name in ("http", "grpc", "metrics")}
    args = [
        "--model-repository", str(repository), "--num-replicas=3", "--min-replicas=3", "--max-replicas=4",
        "--cpus-per-replica=0.5", "--target-queue-time-us=20000", "--replicate-queue-time-us=20000", "--upscale-delay-secs=1",
        "--downscale-delay-secs=3", "--autoscaling-window-secs=2",
        f"--http-port={ports['http']}", f"--grpc-port={ports['grpc']}", f"--metrics-port={ports['metrics']}",
        "--model-group-limit=g:1", "--allow-client-shm=true", "--log-verbose=0",
    ]  # fmt: skip
    log = open(Path(tmp) / "driver.log", "w")
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.ray_driver"], cwd=ROOT, text=True, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=log,
    )  # fmt: skip
    try:
        assert driver.stdin is not None
        driver.stdin.write(json.dumps({"nodes": list(NODES), "tmp": tmp}) + "\n")
        driver.stdin.flush()
        # Measured while the driver starts the cluster; the deployment's flags follow.
        state = Path(tmp) / "footprints.json"
        budget = _measured_budget(repository, state)
        args += [f"--replica-memory-budget={budget}", f"--model-footprint-state-file={state}", "--model-eviction-policy=lru"]
        driver.stdin.write(json.dumps({"args": args}) + "\n")
        driver.stdin.flush()
        try:
            started = read_answer(driver, 240)
        except AssertionError as exc:  # its log goes with the temporary folder: its end comes with the failure
            log.flush()
            # A replica's own error comes before the driver's traceback: its lines first, then the log's end.
            text = (Path(tmp) / "driver.log").read_text()
            errors = "\n".join(line for line in text.splitlines() if "Error" in line or "error" in line)[-6000:]
            raise AssertionError(f"{exc}\n{errors}\n...\n{text[-4000:]}") from None
        assert [w["node_ip"] for w in started["ingress"]] == list(NODES), started
        yield Deployment(driver, ports, budget)
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
            # Last resort: a Ray process of this cluster (its session folder is under tmp) still alive is killed.
            for process in psutil.process_iter(["pid", "cmdline"]):
                try:
                    if any(tmp in part for part in process.info["cmdline"] or []):
                        process.kill()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            shutil.rmtree(tmp, ignore_errors=True)


def test_ray_serve_flags_make_replicas_that_load_on_demand_behind_the_ingress(tmp_path: Path) -> None:
    from nereid.ray.app import replica_deployment_options

    args, options = parse_ray_serve_args([
        "--model-repository", str(tmp_path), "--address", "10.0.0.1:6379", "--min-replicas=2", "--max-replicas=5",
        "--replica-memory-budget=256MiB", "--cpus-per-replica=2", "--gpus-per-replica=1", "--http-port=9000",
        "--grpc-port=9001", "--metrics-port=9002", "--model-eviction-policy=lru",
    ])  # fmt: skip
    assert args.address == "10.0.0.1:6379"
    replica = options.replica_settings
    assert replica.model_load_on_demand and replica.model_control_mode == "explicit"
    assert not (replica.allow_http or replica.allow_grpc or replica.allow_metrics)  # the ingress is the only door
    assert replica.model_memory_budget.host_bytes == 256 << 20 and replica.model_eviction_policy == "lru"
    ingress = options.ingress_settings
    assert (ingress.http_port, ingress.grpc_port, ingress.metrics_port) == (9000, 9001, 9002)
    deployment = replica_deployment_options(options)
    assert deployment["ray_actor_options"] == {"num_cpus": 2.0, "num_gpus": 1.0}
    scaling = deployment["autoscaling_config"]
    assert (scaling["min_replicas"], scaling["max_replicas"], scaling["initial_replicas"]) == (2, 5, 2)
    assert scaling["policy"]["policy_function"] == "nereid.ray.autoscaling:QueueTimePolicy"
    _, fixed = parse_ray_serve_args(["--model-repository", str(tmp_path), "--num-replicas=4"])
    assert replica_deployment_options(fixed)["num_replicas"] == 4 and "autoscaling_config" not in replica_deployment_options(fixed)
    with pytest.raises(SystemExit):
        parse_ray_serve_args(["--model-repository", str(tmp_path), "--min-replicas=3", "--max-replicas=2"])


def test_a_tensor_parallel_vllm_model_gets_its_gpus_beside_the_replica(tmp_path: Path) -> None:
    """Configuration only (no GPU here): the replica runs in a placement group's CPU bundle, and vLLM's Ray
    workers (distributed_executor_backend "ray") take the GPU bundles of that group."""
    from nereid.ray.app import replica_deployment_options

    _, options = parse_ray_serve_args(["--model-repository", str(tmp_path), "--placement-group-gpus=4", "--cpus-per-replica=2"])
    deployment = replica_deployment_options(options)
    assert deployment["placement_group_bundles"] == [{"CPU": 2.0}] + [{"GPU": 1.0}] * 4
    assert deployment["placement_group_strategy"] == "PACK"
    assert deployment["ray_actor_options"]["num_gpus"] == 0.0
    from ray.serve.deployment import Deployment as ServeDeployment

    from nereid.ray.replica import NereidReplica

    assert isinstance(serve.deployment(NereidReplica, **deployment), ServeDeployment)  # Serve takes these options
    with pytest.raises(SystemExit):
        parse_ray_serve_args(["--model-repository", str(tmp_path), "--placement-group-gpus=2", "--gpus-per-replica=1"])


def test_tritonclient_http_and_grpc_work_against_every_nodes_ingress(deployment: Deployment) -> None:
    for node in NODES:
        client = deployment.http(node)
        assert client.is_server_live() and client.is_server_ready()
        assert _infer(client, "add1", 2.0).tolist() == [[3.0] * 4]
        # Every ingress finds the replica holding it (after the holder's next heartbeat), instead of a second copy.
        _until(lambda: deployment.ask("holders", model="add1"), 10, "add1 in the directory")
    grpc = grpcclient.InferenceServerClient(f"{WORKERS[0]}:{deployment.ports['grpc']}")
    assert grpc.is_server_live() and grpc.is_server_ready()
    tensor = grpcclient.InferInput("INPUT0", [2, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((2, 4), np.float32))
    assert grpc.infer("add2", [tensor]).as_numpy("OUTPUT0").tolist() == [[3.0] * 4] * 2
    metadata = grpc.get_model_metadata("add2", as_json=True)
    assert metadata["name"] == "add2" and metadata["inputs"][0]["shape"] == ["-1", "4"]
    assert grpc.get_model_config("add2", as_json=True)["config"]["max_batch_size"] == 8
    assert deployment.http(WORKERS[1]).get_model_metadata("add1")["platform"] == "onnxruntime_onnx"
    with pytest.raises(InferenceServerException, match="add9"):
        _infer(deployment.http(), "add9")  # a model of no repository: Triton's error, not a hang


def test_models_spread_over_nodes_and_a_cold_start_lands_on_another_replica(deployment: Deployment) -> None:
    first = _until(lambda: deployment.holders("add1"), 10, "add1 resident")
    # Serve's router picks a cold start's replica from the model lists the replicas push at their heartbeats, so
    # an eviction just before (an earlier test's hot copy) must reach it before the counts are compared.
    before = _settled(deployment.placement, seconds=2.0)
    counts = {rid: len(where["models"]) for rid, where in before.items()}
    client = deployment.http()
    for name in ("add0", "add3"):
        _infer(client, name)
        _until(lambda name=name: deployment.holders(name), 10, f"{name} resident")
    placement = deployment.placement()
    cold = [rid for rid, where in placement.items() if "add0" in where["models"]]
    # The cold start went to a replica with the fewest models. Where add1's replica holds more than the fewest (an
    # earlier test's hot copy of add2 can leave every replica at one model), that is another replica, on another
    # node (one replica per node here).
    fewest = min(counts.values())
    assert counts.get(cold[0], 0) <= fewest, (before, placement)  # a replica that started meanwhile holds none
    add1_replicas = {rid for rid, where in before.items() if "add1" in where["models"]}
    if all(counts[rid] > fewest for rid in add1_replicas):
        assert cold[0] not in add1_replicas, (before, placement)
        # ... on another node, where each node runs one replica (a replica an earlier test's load added shares one)
        if len({where["node_ip"] for where in before.values()}) == len(before):
            assert placement[cold[0]]["node_ip"] != first[0]["node_ip"], (before, placement)
    nodes = {where["node_ip"] for where in placement.values() if set(where["models"]) & set(ADDERS)}
    assert len(nodes) >= 2, placement
    # Requests for a resident model keep going where it is: no second copy is loaded for them.
    for _ in range(10):
        _infer(client, "add1")
    assert len(deployment.holders("add1")) == 1


def test_a_decoupled_model_streams_through_the_ingress_over_grpc_and_generate_stream(deployment: Deployment) -> None:
    import queue

    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"{WORKERS[1]}:{deployment.ports['grpc']}")
    client.start_stream(callback=lambda result, error: answers.put(error if error is not None else result))
    try:
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([5], np.int32))
        client.async_stream_infer("repeat", [tensor], request_id="r1", enable_empty_final_response=True)
        outputs = []
        while True:
            answer = answers.get(timeout=60)
            assert not isinstance(answer, InferenceServerException), answer
            if answer.get_response().parameters["triton_final_response"].bool_param:
                break
            outputs.append(int(answer.as_numpy("OUT")[0]))
    finally:
        client.stop_stream()
    assert outputs == [5, 6, 7]
    # The generate extension's stream (Server-Sent Events) takes the same path over HTTP.
    reply = requests.post(deployment.base(WORKERS[0]) + "/v2/models/repeat/generate_stream", json={"IN": [5]}, timeout=60)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in reply.text.splitlines() if line.startswith("data: ")]
    assert [event["OUT"] for event in events] == [5, 6, 7]
    with pytest.raises(InferenceServerException, match="decoupled"):
        deployment.http().infer("repeat", [httpclient.InferInput("IN", [1], "INT32").set_data_from_numpy(np.array([1], np.int32))])


def test_generate_through_the_ingress_answers_as_one_server(deployment: Deployment) -> None:
    base = deployment.base(WORKERS[1])
    reply = requests.post(base + "/v2/models/add3/generate", json={"INPUT0": [1, 2, 3, 4], "id": "g1"}, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"id": "g1", "model_name": "add3", "model_version": "1", "OUTPUT0": [4.0, 5.0, 6.0, 7.0]}
    # A decoupled model answering three times: Triton's 200 with the error, as one server gives it.
    several = requests.post(base + "/v2/models/repeat/generate", json={"IN": [5]}, timeout=60)
    assert several.status_code == 200 and "exactly 1 response" in several.json()["error"], several.text
    bad = requests.post(base + "/v2/models/add3/generate", json={"INPUT9": [1, 2, 3, 4]}, timeout=60)
    # A key that names no input is a request parameter, as in Triton, and a list is not a parameter's type.
    assert bad.status_code == 400 and bad.json() == {
        "error": "parameter 'INPUT9' has invalid type. It should be either 'int', 'bool', or 'string'."
    }
    stream = requests.post(base + "/v2/models/add3/generate_stream", json={"INPUT0": [1, 1, 1, 1]}, timeout=60)
    assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in stream.text.splitlines() if line.startswith("data: ")]
    assert [event["OUTPUT0"] for event in events] == [[4.0] * 4]


def test_system_shared_memory_inputs_and_outputs_through_the_ingress(deployment: Deployment) -> None:
    """Regions registered at one node's ingress: it reads the inputs from them and writes the replica's outputs
    into them, over HTTP and gRPC; an output region too small gets Triton's error."""
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    in_key, out_key = f"/nereid_ray_in_{os.getpid()}", f"/nereid_ray_out_{os.getpid()}"
    in_handle = shm.create_shared_memory_region("ray_in", in_key, 32)
    out_handle = shm.create_shared_memory_region("ray_out", out_key, 64)
    http = deployment.http(WORKERS[0])
    grpc = grpcclient.InferenceServerClient(f"{WORKERS[1]}:{deployment.ports['grpc']}")
    try:
        shm.set_shared_memory_region(in_handle, [data])
        for client in (http, grpc):
            client.register_system_shared_memory("ray_in", in_key, 32)
            client.register_system_shared_memory("ray_out", out_key, 64)
        for client, module, offset in ((http, httpclient, 0), (grpc, grpcclient, 32)):
            tensor = module.InferInput("INPUT0", [2, 4], "FP32")
            tensor.set_shared_memory("ray_in", 32)
            output = module.InferRequestedOutput("OUTPUT0")
            output.set_shared_memory("ray_out", 32, offset=offset)
            result = client.infer("add2", [tensor], outputs=[output])
            # The data went into the region, not the response (like Triton, it names no region).
            out = result.get_output("OUTPUT0")
            if client is http:
                assert out == {"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 4]}, out
            else:
                assert out.name == "OUTPUT0" and b"".join(result.get_response().raw_output_contents) == b"", out
            np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [2, 4], offset=offset), data + 2)
        small = httpclient.InferRequestedOutput("OUTPUT0")
        small.set_shared_memory("ray_out", 16)
        tensor = httpclient.InferInput("INPUT0", [2, 4], "FP32")
        tensor.set_shared_memory("ray_in", 32)
        with pytest.raises(InferenceServerException, match="should be at least 32 bytes to hold the results"):
            http.infer("add2", [tensor], outputs=[small])
    finally:
        for client in (http, grpc):
            client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)


def test_statistics_index_and_repository_calls_are_answered_as_one_server(deployment: Deployment) -> None:
    client = deployment.http(WORKERS[0])
    before = client.get_inference_statistics("add2")["model_stats"][0]["inference_count"]
    for _ in range(3):
        _infer(deployment.http(HEAD), "add2")
    stats = client.get_inference_statistics("add2")["model_stats"]
    assert len(stats) == 1 and stats[0]["inference_count"] == before + 3
    rows = {row["name"]: row for row in client.get_model_repository_index()}
    assert {rows[name].get("state") for name in ("add1", "add2")} == {"READY"}
    assert rows["g4"] == {"name": "g4"}  # in the repository, loaded nowhere
    client.unload_model("add2")
    assert deployment.holders("add2") == []
    assert {row["name"]: row for row in client.get_model_repository_index()}["add2"].get("state") != "READY"
    client.load_model("add2")
    assert len(deployment.holders("add2")) == 1 and client.is_model_ready("add2")
    assert _infer(client, "add2").tolist() == [[3.0] * 4]


def test_eviction_happens_inside_a_full_replica(deployment: Deployment) -> None:
    client = deployment.http()
    for i, name in enumerate(GROUPED, start=1):
        assert _infer(client, name).tolist() == [[1.0 + 10 * i] * 4]
    for where in deployment.placement().values():
        assert len(set(where["models"]) & set(GROUPED)) <= 1, where  # the group limit holds in every replica
    evictions = sum(metric_value_at(deployment, node, "nereid_model_evictions_total", cause="group") for node in NODES)
    assert evictions >= 1
    assert _infer(client, "g1").tolist() == [[11.0] * 4]  # an evicted model comes back on demand


def test_a_replica_full_to_its_memory_budget_evicts_its_idle_big_model_and_keeps_the_small_ones(
    deployment: Deployment,
) -> None:
    """Serve's multiplexing holds no count limit: each replica's byte budget (measured footprints, one big model and
    half another) decides. Big models loaded one after another land on replicas by Serve's choice; the first that
    lands beside another big one evicts that one (the idle model whose bytes make room) and nothing smaller."""
    # Four big models need at most three replicas to share one: an earlier test's load may have scaled up to the
    # fourth (queue time past its 20 ms target on a busy machine), which goes again once idle, and a replica the
    # autoscaler stops takes its big model with it (seen: big0 gone when big3 came, onto a replica started
    # meanwhile). So the big models are asked for round after round, each while three replicas run and only when
    # no replica holds it, until one lands beside another.
    client = deployment.http()
    filled = None
    after: dict[str, dict[str, Any]] = {}
    for name in BIG * 3:
        _until(lambda: deployment.running_replicas() == 3, 90, "three replicas, the autoscaler's minimum", every=0.5)
        before = deployment.placement()
        if any(name in where["models"] for where in before.values()):
            continue
        assert _infer_seconds(client, name) == 0.0
        after = deployment.placement()
        for where in after.values():
            assert len(set(where["models"]) & set(BIG)) <= 1, after  # the budget holds in every replica
        (holder,) = [rid for rid, where in after.items() if name in where["models"]]
        held = set(before.get(holder, {}).get("models", [])) & set(BIG)
        if held:
            filled = (holder, held.pop(), set(before[holder]["models"]) - set(BIG))
            break
    assert filled is not None, (
        f"four big models, asked for in three rounds, over {deployment.running_replicas()} replicas: one must have "
        "landed beside another; "
        f"placement: {after}"
    )
    replica, evicted, small = filled
    node = after[replica]["node_ip"]
    assert evicted not in after[replica]["models"]
    assert small <= set(after[replica]["models"]), (before[replica], after[replica])  # only the bytes needed went
    assert metric_value_at(deployment, node, "nereid_model_evictions_total", model=evicted, cause="budget", replica=replica) == 1
    resident = metric_value_at(deployment, node, "nereid_models_resident_bytes", replica=replica)
    assert 0 < resident <= deployment.budget, resident
    assert _infer_seconds(client, evicted) == 0.0  # an evicted model comes back on demand


def metric_value_at(deployment: Deployment, node: str, name: str, **labels: str) -> float:
    text = requests.get(f"http://{node}:{deployment.ports['metrics']}/metrics", timeout=30).text
    return sum_samples(text, name, labels)


def test_each_node_serves_its_own_replicas_metrics_labelled_by_replica(deployment: Deployment) -> None:
    import re

    assert _infer(deployment.http(), "add1").tolist() == [[2.0] * 4]  # loaded somewhere, whatever ran before
    placement = deployment.placement()
    total = 0.0
    for node in NODES:
        text = requests.get(f"http://{node}:{deployment.ports['metrics']}/metrics", timeout=30).text
        here = {rid for rid, where in placement.items() if where["node_ip"] == node}
        # Serve places replicas where it likes: a node may hold none, and then has no replica's families to show.
        assert text.count("# TYPE nv_inference_request_success counter") == (1 if here else 0), (node, placement)
        replicas = set(re.findall(r'nv_inference_count\{[^}]*replica="([^"]+)"', text))
        assert replicas <= here
        total += sum_samples(text, "nv_inference_request_success", {"model": "add1"})
    stats = deployment.http().get_inference_statistics("add1")["model_stats"][0]
    assert total == stats["inference_stats"]["success"]["count"] > 0


def test_autoscaling_adds_a_replica_under_load_spreads_the_hot_model_and_scales_down_when_idle(deployment: Deployment) -> None:
    assert deployment.running_replicas() == 3
    stop = threading.Event()
    errors: list[BaseException] = []

    def load() -> None:
        client = httpclient.InferenceServerClient(f"{HEAD}:{deployment.ports['http']}", network_timeout=60)
        tensor = httpclient.InferInput("SECONDS", [1], "FP32")
        tensor.set_data_from_numpy(np.array([0.05], np.float32))
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                client.infer("sleepy", [tensor])
            except InferenceServerException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=load, daemon=True) for _ in range(6)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        _until(lambda: deployment.running_replicas() == 4, 40, "a fourth replica under load", every=0.5)
        scaled_up = time.monotonic() - started
        # The hot model itself is spread: a second replica loads it while every holder's queue is long.
        _until(lambda: len(deployment.holders("sleepy")) >= 2, 30, "the hot model on a second replica", every=0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not errors, errors[:3]
    idle = time.monotonic()
    _until(lambda: deployment.running_replicas() == 3, 40, "back to three replicas when idle", every=0.5)
    print(f"autoscaling: up {scaled_up:.1f} s after load began, down {time.monotonic() - idle:.1f} s after it ended")


def test_a_node_that_joins_later_gets_an_ingress_of_its_own(deployment: Deployment) -> None:
    """The ingress follows the alive nodes (one per node): a fourth address joins the running cluster and answers
    Triton's protocol, HTTP and gRPC, without the application being deployed again."""
    deployment.ask("add_node", node=LATE)

    def live() -> bool:
        try:
            return requests.get(f"http://{LATE}:{deployment.ports['http']}/v2/health/live", timeout=5).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        # A replica's first start on a fresh node (its worker process imports Ray and Nereid) took 26 s once here,
        # and the node itself did not show in the cluster within 90 s once, beside the other test worker's load.
        _until(live, 150, f"an ingress on {LATE}, which joined after the deployment", every=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the ingress deployment: {deployment.ask('ingress')}") from None
    assert _infer(deployment.http(LATE), "add1", 2.0).tolist() == [[3.0] * 4]
    grpc = grpcclient.InferenceServerClient(f"{LATE}:{deployment.ports['grpc']}")
    assert grpc.is_server_ready() and grpc.get_model_metadata("add1", as_json=True)["name"] == "add1"
    # One ingress per node: the three of the deployment and the fourth, which a fixed count would not have made.
    _until(lambda: deployment.ask("ingress") == {"running": 4, "nodes": 4}, 20, "four ingress replicas on four nodes")


def test_a_killed_node_fails_only_its_in_flight_requests_and_its_models_are_served_again(deployment: Deployment) -> None:
    client = deployment.http()
    for name in ADDERS:
        _infer(client, name)

    def residence() -> dict[str, str]:
        return {name: where["node_ip"] for where in deployment.placement().values() for name in where["models"]}

    # The adders can all sit on the head's replicas (after the autoscaling test Serve may keep two replicas there);
    # then a grouped adder (same signature) on a worker joins the load, so the killed worker loses a model under load.
    # One grouped model fits a replica (the group limit): a few cold starts reach a worker's replica.
    where_is = residence()
    loaded = list(ADDERS)
    if not any(where_is.get(name) in WORKERS for name in ADDERS):
        for name in GROUPED:
            if any(where_is.get(g) in WORKERS for g in GROUPED):
                break
            _infer(client, name)
            where_is = residence()
        loaded += [name for name in GROUPED if where_is.get(name) in WORKERS][:1]
    victim = next((where_is[name] for name in loaded if where_is.get(name) in WORKERS), None)
    assert victim is not None, where_is
    lost = sorted(name for name in loaded if where_is.get(name) == victim)
    kept = sorted(name for name in loaded if where_is.get(name) != victim)
    outcomes: list[tuple[str, float, float, bool]] = []  # (model, time sent, time answered, ok)
    stop = threading.Event()

    def load(name: str) -> None:
        local = httpclient.InferenceServerClient(f"{HEAD}:{deployment.ports['http']}", network_timeout=60)
        deadline = time.monotonic() + 90
        while not stop.is_set() and time.monotonic() < deadline:
            sent = time.monotonic()
            try:
                _infer(local, name)
                outcomes.append((name, sent, time.monotonic(), True))
            except InferenceServerException:
                outcomes.append((name, sent, time.monotonic(), False))
                time.sleep(0.05)

    threads = [threading.Thread(target=load, args=(name,), daemon=True) for name in loaded]
    for thread in threads:
        thread.start()
    try:
        _until(lambda: len(outcomes) > 20, 20, "load flowing")
        killed = time.monotonic()
        deployment.ask("kill", node=victim)

        def served_again() -> float | None:
            """When every model of the dead node had answered a request sent after the kill."""
            firsts = [min((at for m, sent, at, ok in outcomes if ok and sent > killed and m == name), default=None)
                      for name in lost]  # fmt: skip
            return None if None in firsts else max(f for f in firsts if f is not None)

        recovered = _until(served_again, 30, f"{lost} served again after {victim} was killed") - killed
        # They are resident on the surviving nodes now, and nothing is left of the dead node's replica.
        _until(lambda: all(deployment.holders(name) for name in lost), 20, "the lost models resident elsewhere")
        assert victim not in {where["node_ip"] for where in deployment.placement().values()}
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    failed = [(name, sent) for name, sent, _, ok in outcomes if not ok]
    assert all(name in lost for name, _ in failed), failed  # the models of the surviving nodes never failed
    assert all(any(ok and sent > killed for m, sent, _, ok in outcomes if m == name) for name in kept)
    assert len(failed) <= len(lost), failed  # at most the request in flight per model (the others were retried)
    print(f"node loss: {len(failed)} failed request(s), every model served again {recovered:.1f} s after the kill")


