"""Differential tests: the sequence batcher's `iterative_sequence` (a model reschedules its request with
`request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`) and `oldest.preserve_ordering` behave as in
real Triton 2.51, asked the same things through the official tritonclient."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.servers import RunningServer, start_nereid, start_real_triton

pytestmark = pytest.mark.differential

_START_CONTROL = (
    'control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]'
)
_ITERATIVE_IO = """
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "STARTS" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# Triton's python_backend README example, kept per sequence so that concurrent sequences do not mix: IN is how
# many responses to stream; each execution sends the count still to come and reschedules until it is 0.
_ITERATIVE_DECOUPLED_CONFIG = f"""
backend: "python"
max_batch_size: 4
model_transaction_policy {{ decoupled: true }}
sequence_batching {{ iterative_sequence: true {_START_CONTROL} }}
{_ITERATIVE_IO}
"""
_ITERATIVE_DECOUPLED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.remaining = {}

    def execute(self, requests):
        for request in requests:
            key = request.correlation_id()
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0])
            if key not in self.remaining:
                self.remaining[key] = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            self.remaining[key] -= 1
            left = self.remaining[key]
            response = pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array([[left]], dtype=np.int32)),
                pb_utils.Tensor("STARTS", np.array([[start]], dtype=np.int32)),
            ])
            sender = request.get_response_sender()
            if left <= 0:
                del self.remaining[key]
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
        return None
"""

# Not decoupled: a request runs IN times (None in the returned list while rescheduled), then answers how many
# executions it had and how many of them saw START.
_ITERATIVE_CONFIG = f"""
backend: "python"
max_batch_size: 4
sequence_batching {{ iterative_sequence: true {_START_CONTROL} }}
{_ITERATIVE_IO}
"""
_ITERATIVE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.correlation_id()
            wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0])
            runs, starts = self.seen.get(key, (0, 0))
            runs, starts = runs + 1, starts + start
            if runs < wanted:
                self.seen[key] = (runs, starts)
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
            else:
                self.seen.pop(key, None)
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([[runs]], dtype=np.int32)),
                    pb_utils.Tensor("STARTS", np.array([[starts]], dtype=np.int32)),
                ]))
        return responses
"""

# Decoupled, oldest strategy: each request is answered from a thread after DELAY_MS, so a later request can
# finish first unless the batcher preserves the order.
_DELAYED_CONFIG = """
backend: "python"
max_batch_size: 2
model_transaction_policy {{ decoupled: true }}
sequence_batching {{ oldest {{ max_candidate_sequences: 2 preserve_ordering: {ordered} }} }}
input [ {{ name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "DELAY_OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""
_DELAYED_MODEL = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy().reshape(-1)[0]
            threading.Thread(target=self._answer, args=(request.get_response_sender(), int(delay))).start()
        return None

    def _answer(self, sender, delay):
        time.sleep(delay / 1000)
        out = pb_utils.Tensor("DELAY_OUT", np.array([[delay]], dtype=np.int32))
        sender.send(pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# A model that reschedules without iterative_sequence.
_NOT_ITERATIVE_CONFIG = """
backend: "python"
max_batch_size: 4
dynamic_batching { }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
_NOT_ITERATIVE_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        return [None for _ in requests]
"""

_MODELS = {
    "iterative_decoupled": (_ITERATIVE_DECOUPLED_CONFIG, _ITERATIVE_DECOUPLED_MODEL),
    "iterative": (_ITERATIVE_CONFIG, _ITERATIVE_MODEL),
    "iterative_oldest": (
        _ITERATIVE_CONFIG.replace("iterative_sequence: true", "iterative_sequence: true oldest { max_candidate_sequences: 4 }"),
        _ITERATIVE_MODEL,
    ),
    "iterative_stats": (_ITERATIVE_CONFIG, _ITERATIVE_MODEL),
    "iterative_client_ids": (_ITERATIVE_CONFIG, _ITERATIVE_MODEL),
    # One slot; the second execution of a request that asks for 99 raises.
    "iterative_failing": (
        _ITERATIVE_CONFIG.replace("max_batch_size: 4", "max_batch_size: 1"),
        _ITERATIVE_MODEL.replace(
            "            runs, starts = runs + 1, starts + start\n",
            "            runs, starts = runs + 1, starts + start\n"
            "            if wanted == 99 and runs == 2:\n"
            "                self.seen.pop(key, None)\n"
            "                raise RuntimeError('failing on purpose')\n",
        ),
    ),
    # Each execution outlasts max_sequence_idle_microseconds.
    "iterative_slow": (
        _ITERATIVE_CONFIG.replace("iterative_sequence: true", "iterative_sequence: true max_sequence_idle_microseconds: 100000"),
        _ITERATIVE_MODEL.replace("        responses = []\n", "        responses = []\n        __import__('time').sleep(0.3)\n"),
    ),
    "oldest_ordered": (_DELAYED_CONFIG.format(ordered="true"), _DELAYED_MODEL),
    "oldest_unordered": (_DELAYED_CONFIG.format(ordered="false"), _DELAYED_MODEL),
    "not_iterative": (_NOT_ITERATIVE_CONFIG, _NOT_ITERATIVE_MODEL),
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningServer]]:
    repo = tmp_path_factory.mktemp("sequence-diff") / "repo"
    for name, (config, model) in _MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(model)
    triton = start_real_triton(Path(repo), "--exit-timeout-secs=2")  # it never answers one request below
    try:
        nereid = start_nereid(repo)
    except Exception:
        triton.stop()
        raise
    yield {"triton": triton, "nereid": nereid}
    nereid.stop()
    triton.stop()


def _stream(server: RunningServer, model: str, requests: list[dict[str, Any]], count: int) -> list[tuple[str, Any]]:
    """Write every request on one gRPC stream, then read `count` responses: (request id, result) in arrival order."""
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        try:
            for spec in requests:
                name, value = spec["input"]
                tensor = grpcclient.InferInput(name, [1, 1], "INT32")
                tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
                client.async_stream_infer(model, [tensor], request_id=spec["id"], **spec.get("sequence", {}))
            answers = []
            for _ in range(count):
                result, error = got.get(timeout=60)
                assert error is None, error
                answers.append((result.get_response().id, result))
        finally:
            client.stop_stream()
    return answers


def test_an_iterative_decoupled_model_streams_each_request_over_its_reschedules(servers: dict[str, RunningServer]) -> None:
    counts = {"a": 3, "b": 1, "c": 4}
    requests = [{"id": rid, "input": ("IN", n)} for rid, n in counts.items()]  # no sequence ID: each is its own
    seen = {}
    for name, server in servers.items():
        per_request: dict[str, list[tuple[int, int]]] = {rid: [] for rid in counts}
        for rid, result in _stream(server, "iterative_decoupled", requests, sum(counts.values())):
            per_request[rid].append((int(result.as_numpy("OUT")[0][0]), int(result.as_numpy("STARTS")[0][0])))
        seen[name] = per_request
    assert seen["nereid"] == seen["triton"]
    # Each request counts down in its own sequence; only its first execution carries START.
    assert seen["triton"]["c"] == [(3, 1), (2, 0), (1, 0), (0, 0)]
    assert seen["triton"]["b"] == [(0, 1)]


@pytest.mark.parametrize("model", ["iterative", "iterative_oldest"])
def test_an_iterative_model_answers_each_concurrent_request_once_after_its_reschedules(
    servers: dict[str, RunningServer], model: str
) -> None:
    runs = [1, 5, 2, 3, 4, 2]
    answers = {}
    for name, server in servers.items():
        with httpclient.InferenceServerClient(server.http_url, concurrency=len(runs), network_timeout=120) as client:
            handles = []
            for n in runs:
                tensor = httpclient.InferInput("IN", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.array([[n]], dtype=np.int32))
                handles.append(client.async_infer(model, [tensor]))
            results = [handle.get_result() for handle in handles]
        answers[name] = [(int(r.as_numpy("OUT")[0][0]), int(r.as_numpy("STARTS")[0][0])) for r in results]
    assert answers["nereid"] == answers["triton"] == [(n, 1) for n in runs]


@pytest.mark.parametrize(("model", "expected"), [("oldest_ordered", ["slow", "fast"]), ("oldest_unordered", ["fast", "slow"])])
def test_oldest_preserve_ordering_holds_a_later_sequences_response(
    servers: dict[str, RunningServer], model: str, expected: list[str]
) -> None:
    requests = [
        {"id": "slow", "input": ("DELAY_MS", 1500), "sequence": {"sequence_id": 101, "sequence_start": True, "sequence_end": True}},
        {"id": "fast", "input": ("DELAY_MS", 0), "sequence": {"sequence_id": 102, "sequence_start": True, "sequence_end": True}},
    ]
    orders = {name: [rid for rid, _ in _stream(server, model, requests, 2)] for name, server in servers.items()}
    assert orders == {"triton": expected, "nereid": expected}


def test_rescheduling_without_iterative_sequence_fails_the_request_with_tritons_words(
    servers: dict[str, RunningServer],
) -> None:
    body = {"inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}

    def ask(server: RunningServer, timeout: float) -> requests.Response:
        return requests.post(f"{server.base}/v2/models/not_iterative/infer", json=body, timeout=timeout)

    # Difference on purpose: real Triton logs "Failed to release request: <this text>" and never answers the
    # request (its client times out); Nereid answers it with the same text as an INVALID_ARG error.
    with pytest.raises(requests.exceptions.Timeout):
        ask(servers["triton"], 3)
    answer = ask(servers["nereid"], 30)
    assert answer.status_code == 400
    assert answer.json()["error"] == (
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured to "
        "handle such a flag."
    )


def test_an_iterative_models_statistics_count_alike(servers: dict[str, RunningServer]) -> None:
    counts = {}
    for name, server in servers.items():
        with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
            for n in (3, 2):  # one after the other: the same executions on both servers
                tensor = httpclient.InferInput("IN", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.array([[n]], dtype=np.int32))
                client.infer("iterative_stats", [tensor])
                # Real Triton answers a sequence's last request before it frees the sequence's slot; a request
                # arriving in between takes a second slot, and the held one joins its batches as a null request
                # (batch size 2, seen on a loaded machine). A pause lets the slot go first.
                time.sleep(1.0)
            stats = client.get_inference_statistics("iterative_stats")["model_stats"][0]
        counts[name] = {
            "inference_count": stats["inference_count"],
            "execution_count": stats["execution_count"],
            "success": stats["inference_stats"]["success"]["count"],
            "batches": sorted((b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]),
        }
    # Every execution counts, rescheduled ones included.
    assert counts["nereid"] == counts["triton"]


def test_an_iterative_sequence_with_a_client_id_ends_when_its_first_request_is_done(
    servers: dict[str, RunningServer],
) -> None:
    outcomes = {}
    for name, server in servers.items():
        with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
            seen = []
            for start in (True, False):
                tensor = httpclient.InferInput("IN", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.array([[2]], dtype=np.int32))
                try:
                    result = client.infer("iterative_client_ids", [tensor], sequence_id=4242, sequence_start=start)
                    seen.append(("ok", int(result.as_numpy("OUT")[0][0]), int(result.as_numpy("STARTS")[0][0])))
                except InferenceServerException as exc:
                    seen.append(("error", str(exc.status()), str(exc.message())))
                time.sleep(1.0)  # real Triton frees the sequence's slot only after it has answered: let it go
        outcomes[name] = seen
    assert outcomes["nereid"] == outcomes["triton"]
    # Rescheduled once, answered once with START seen once; then the sequence is over, so a request without
    # START is refused.
    assert outcomes["triton"][0] == ("ok", 2, 1)
    assert outcomes["triton"][1][:2] == ("error", "400") and "START flag" in outcomes["triton"][1][2]


def test_an_iterative_sequence_is_not_idle_while_its_model_works_on_it(servers: dict[str, RunningServer]) -> None:
    body = {"inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32", "data": [3]}]}
    url = "/v2/models/iterative_slow/infer"
    # Difference on purpose: real Triton releases the sequence as idle while an execution runs, then refuses
    # the rescheduled request ("must specify the START flag", in its log) and never answers it; Nereid keeps
    # the sequence while its model reschedules it, so the request finishes.
    with pytest.raises(requests.exceptions.Timeout):
        requests.post(servers["triton"].base + url, json=body, timeout=3)
    answer = requests.post(servers["nereid"].base + url, json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    assert outputs == {"OUT": [3], "STARTS": [1]}


def test_an_iterative_request_that_fails_midway_frees_its_sequence_slot(servers: dict[str, RunningServer]) -> None:
    outcomes = {}
    for name, server in servers.items():
        url = server.base + "/v2/models/iterative_failing/infer"
        seen = []
        for wanted in (99, 2):  # the first fails on its second execution; the second needs the only slot
            body = {"inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32", "data": [wanted]}]}
            answer = requests.post(url, json=body, timeout=30)
            outputs = {o["name"]: o["data"] for o in answer.json().get("outputs", [])}
            seen.append((answer.status_code, outputs, "failing on purpose" in answer.json().get("error", "")))
        outcomes[name] = seen
    assert outcomes["nereid"] == outcomes["triton"]
    assert outcomes["triton"][1] == (200, {"OUT": [2], "STARTS": [1]}, False)
