"""The Ray deployment's pure parts: replicas' statistics and repository indexes merged as one server's answer,
requests and responses across a deployment handle, and the queue-time autoscaling decisions."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from nereid.core.errors import NereidError, Status
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor, OutputTensor, RequestedOutput
from nereid.ray.aggregate import merge_index, merge_statistics
from nereid.ray.autoscaling import OnePerNodePolicy, QueueTimePolicy
from nereid.ray.directory import NereidDirectory
from nereid.ray.wire import pack_request, pack_response, unpack_request, unpack_response


def _stats(name: str, version: str, count: int, queue_ns: int, last: int) -> dict:
    return {
        "name": name,
        "version": version,
        "last_inference": last,
        "inference_count": count,
        "execution_count": count,
        "inference_stats": {"success": {"count": count, "ns": 10 * count}, "queue": {"count": count, "ns": queue_ns}},
        "response_stats": {},
        "batch_stats": [{"batch_size": 1, "compute_infer": {"count": count, "ns": 5 * count}}],
        "memory_usage": [],
    }


def test_statistics_of_a_model_on_two_replicas_are_summed_as_one_servers() -> None:
    merged = merge_statistics([[_stats("a", "1", 2, 100, 50)], [_stats("a", "1", 3, 300, 70), _stats("b", "1", 1, 1, 1)]])
    assert [(s["name"], s["version"]) for s in merged] == [("a", "1"), ("b", "1")]
    a = merged[0]
    assert a["inference_count"] == 5 and a["execution_count"] == 5
    assert a["inference_stats"]["queue"] == {"count": 5, "ns": 400}
    assert a["last_inference"] == 70  # the latest, not a sum
    assert a["batch_stats"] == [{"batch_size": 1, "compute_infer": {"count": 5, "ns": 25}}]


def test_statistics_merge_leaves_the_replicas_answers_alone() -> None:
    first = [_stats("a", "1", 2, 100, 50)]
    merge_statistics([first, [_stats("a", "1", 3, 300, 70)]])
    assert first[0]["inference_count"] == 2


def test_index_says_ready_when_any_replica_holds_the_model() -> None:
    replica_1 = [{"name": "a", "version": "1", "state": "READY"}, {"name": "b"}, {"name": "c", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
    replica_2 = [{"name": "a"}, {"name": "b", "version": "1", "state": "READY"}, {"name": "c"}]
    rows = merge_index([replica_1, replica_2])
    assert rows == [
        {"name": "a", "version": "1", "state": "READY"},
        {"name": "b", "version": "1", "state": "READY"},
        {"name": "c", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
    ]
    assert [r["name"] for r in merge_index([replica_1, replica_2], ready_only=True)] == ["a", "b"]
    assert merge_index([[{"name": "d"}], [{"name": "d"}]]) == [{"name": "d"}]


def test_request_and_response_cross_a_handle_with_their_data_and_errors() -> None:
    request = InferenceRequest(
        "m", "2", [InputTensor("IN", "FP32", (1, 2), np.array([[1, 2]], np.float32), {"p": 1})], id="r1",
        outputs=[RequestedOutput("OUT", {"classification": 2})], parameters={"k": "v"}, priority=3, correlation_id=7,
    )  # fmt: skip
    back = unpack_request(pickle.loads(pickle.dumps(pack_request(request))))
    assert (back.model_name, back.model_version, back.id, back.priority, back.correlation_id) == ("m", "2", "r1", 3, 7)
    assert back.inputs[0].shape == (1, 2) and back.inputs[0].data.tolist() == [[1, 2]]
    assert back.outputs is not None and back.outputs[0].parameters == {"classification": 2}
    response = InferenceResponse("m", "2", "r1", [OutputTensor("OUT", "INT32", (1,), np.array([4], np.int32))],
                                 error=NereidError.invalid("bad input"), final=False)  # fmt: skip
    again = unpack_response(pickle.loads(pickle.dumps(pack_response(response))))
    assert again.outputs[0].data.tolist() == [4] and again.final is False
    assert again.error is not None and again.error.status is Status.INVALID_ARG and again.error.message == "bad input"


def _context(current: int, queue_us: list[float], inflight: list[float]) -> SimpleNamespace:
    return SimpleNamespace(
        current_num_replicas=current,
        target_num_replicas=current,
        aggregated_metrics={
            "queue_time_us": {f"r{i}": q for i, q in enumerate(queue_us)},
            "inflight": {f"r{i}": n for i, n in enumerate(inflight)},
        },
    )


def test_queue_time_policy_adds_replicas_while_requests_wait_and_removes_them_when_idle() -> None:
    policy = QueueTimePolicy(target_queue_time_us=1000)
    assert policy(_context(2, [3000, 5000], [8, 8]))[0] == 4  # proportional, at most doubling
    assert policy(_context(2, [1500, 1500], [3, 3]))[0] == 3  # at least one more
    assert policy(_context(3, [500, 600], [2, 1]))[0] == 3  # keeping up: no change
    assert policy(_context(3, [10, 0], [0, 0]))[0] == 2  # idle: one less
    assert policy(_context(3, [10, 0], [4, 0]))[0] == 3  # short queues but busy: stay
    assert policy(SimpleNamespace(current_num_replicas=2, target_num_replicas=2, aggregated_metrics={}))[0] == 2


def test_the_ingress_follows_the_alive_nodes_read_at_most_once_a_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    nodes = [{"Alive": True}, {"Alive": True}, {"Alive": False}]
    reads: list[int] = []
    monkeypatch.setattr(ray, "nodes", lambda: reads.append(1) or list(nodes))
    context = SimpleNamespace(current_num_replicas=2, target_num_replicas=2, aggregated_metrics={})
    policy = OnePerNodePolicy(refresh_secs=3600)
    assert policy(context)[0] == 2  # the dead node gets no ingress
    nodes.append({"Alive": True})
    assert policy(context)[0] == 2 and len(reads) == 1  # not read again within the refresh
    assert OnePerNodePolicy(refresh_secs=0)(context)[0] == 3  # a node that joined gets one

    def unreachable() -> list[dict]:
        raise ConnectionError("GCS unreachable")

    monkeypatch.setattr(ray, "nodes", unreachable)
    assert OnePerNodePolicy()(context)[0] == 2  # keeps the count it has


def test_the_ingress_is_one_per_node_unless_a_count_is_given(tmp_path) -> None:
    from nereid.ray.app import ingress_count_options
    from nereid.ray.cli import parse_ray_serve_args

    _, following = parse_ray_serve_args(["--model-repository", str(tmp_path)])
    following.nodes_alive = 3
    scaling = ingress_count_options(following)["autoscaling_config"]
    assert scaling["initial_replicas"] == 3 and scaling["min_replicas"] == 1
    assert scaling["policy"]["policy_function"] == "nereid.ray.autoscaling:OnePerNodePolicy"
    _, fixed = parse_ray_serve_args(["--model-repository", str(tmp_path), "--ingress-replicas=2"])
    assert ingress_count_options(fixed) == {"num_replicas": 2}

def test_a_hot_model_goes_to_one_more_replica_that_has_not_dropped_it_and_only_once_per_cooldown() -> None:
    directory = NereidDirectory(replicate_queue_time_us=1000)
    assert directory.heartbeat("a", "10.0.0.1", ["hot", "cold"], {"hot": 5000, "cold": 10}) == []  # a holds both
    assert directory.heartbeat("b", "10.0.0.2", [], {}, dropped=["hot"]) == []  # b evicted it lately: no thrashing
    assert directory.heartbeat("c", "10.0.0.3", [], {}) == ["hot"]  # only the model queueing everywhere
    assert directory.heartbeat("d", "10.0.0.4", [], {}) == []  # one more copy at a time
    assert directory.holders("hot") == {"a": "10.0.0.1"}
    assert NereidDirectory().heartbeat("a", "10.0.0.1", ["hot"], {"hot": 1e9}) == []  # threshold 0: never


def test_an_ingress_describes_a_model_once_and_then_answers_from_its_cache() -> None:
    """Every /infer and generate asks wait_model before decoding: after the first, no handle call is made for it
    (a directory lookup and a replica's description would be two hops before each request)."""
    import asyncio

    from nereid.config.model_config import mc
    from nereid.core.settings import ServerSettings
    from nereid.ray.remote_server import RemoteServer

    calls: list[str] = []

    async def answer(what: str, value: object) -> object:
        calls.append(what)
        return value

    description = {"replica": "r1", "version": "1", "decoupled": False, "config": mc.ModelConfig(name="m").SerializeToString(),
                   "metadata": {"name": "m"}, "config_json": {"name": "m"}}  # fmt: skip
    replica = SimpleNamespace(describe=SimpleNamespace(remote=lambda *args: answer("describe", ("ok", description))))
    replicas = SimpleNamespace(options=lambda **options: replica)
    directory = SimpleNamespace(holders=SimpleNamespace(remote=lambda name: answer("holders", {})))
    server = RemoteServer(ServerSettings(), replicas, directory)

    async def twice() -> tuple[object, object]:
        return await server.wait_model("m"), await server.wait_model("m")

    first, second = asyncio.run(twice())
    assert first is second and first.config.name == "m"
    assert calls == ["holders", "describe"]  # the second request made no call
