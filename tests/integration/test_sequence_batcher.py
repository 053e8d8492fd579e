"""The sequence batcher through tritonclient (HTTP and gRPC) and raw HTTP: correlation IDs (uint64 and string)
with the sequence_start/sequence_end flags, the control tensors a model is fed, the direct and oldest
strategies, implicit state, idle release, the backlog, same-instance routing, and Triton's errors for misuse.

One server holds every model of tests/integration/sequence_models.py for the whole module; each test uses
its own correlation IDs and ends its sequences, so tests do not hold each other's batch slots."""

from __future__ import annotations

import itertools
import queue
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.integration.sequence_models import (
    INITIAL_STATE_VALUE,
    REPORT_IDLE_SECONDS,
    build_python_sequence_repository,
    build_sequence_repository,
)
from tests.reference_triton import ReferenceTriton
from tests.servers import RunningServer, start_nereid, start_real_triton

PROTOCOLS = ("http", "grpc")
_ids = itertools.count(1000)


def _next_id() -> int:
    return next(_ids)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = build_sequence_repository(tmp_path_factory.mktemp("sequence_models"))
    running = start_nereid(
        repo, "--exit-on-error=false", "--strict-readiness=false", log_dir=tmp_path_factory.mktemp("logs")
    )
    yield running
    running.stop()


def _client(server: RunningServer, protocol: str) -> tuple[Any, Any]:
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url, network_timeout=30, concurrency=8)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def _infer(
    module: Any,
    client: Any,
    model: str,
    value: int,
    sequence_id: int | str,
    start: bool = False,
    end: bool = False,
    shape: tuple[int, ...] = (1, 1),
) -> dict[str, np.ndarray]:
    tensor = module.InferInput("INPUT", list(shape), "INT32")
    tensor.set_data_from_numpy(np.full(shape, value, dtype=np.int32))
    result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    response = result.get_response()
    names = (
        [o["name"] for o in response["outputs"]] if isinstance(response, dict) else [o.name for o in response.outputs]
    )
    return {name: result.as_numpy(name) for name in names}


def _infer_alone(
    server: RunningServer,
    protocol: str,
    model: str,
    value: int,
    sequence_id: int | str,
    start: bool = False,
    end: bool = False,
    shape: tuple[int, ...] = (1, 1),
) -> dict[str, np.ndarray]:
    """`_infer` on a client of its own, for calls made from worker threads."""
    module, client = _client(server, protocol)
    try:
        return _infer(module, client, model, value, sequence_id, start, end, shape)
    finally:
        client.close()


def _raw(
    server: RunningServer, model: str, value: int, parameters: dict[str, Any], timeout: float = 30
) -> requests.Response:
    body = {
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [value]}],
        "parameters": parameters,
    }
    return requests.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=timeout)


def _outputs(response: requests.Response) -> dict[str, list[Any]]:
    assert response.status_code == 200, response.text
    return {o["name"]: o["data"] for o in response.json()["outputs"]}


def _stats(server: RunningServer, model: str) -> dict[str, Any]:
    return requests.get(f"{server.base}/v2/models/{model}/stats", timeout=5).json()["model_stats"][0]


def _run_sequence(module: Any, client: Any, model: str, sequence_id: int | str, values: list[int]) -> list[int]:
    """One whole sequence, request after request; the model's outputs."""
    outputs = []
    for i, value in enumerate(values):
        result = _infer(module, client, model, value, sequence_id, start=i == 0, end=i == len(values) - 1)
        outputs.append(int(result["OUTPUT"].reshape(-1)[0]))
    return outputs


def _run_sequence_alone(
    server: RunningServer, protocol: str, model: str, sequence_id: int, values: list[int]
) -> list[int]:
    module, client = _client(server, protocol)
    try:
        return _run_sequence(module, client, model, sequence_id, values)
    finally:
        client.close()


def _running_sums(values: list[int]) -> list[int]:
    return list(itertools.accumulate(values))


# -- accumulation across interleaved sequences -------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["acc_direct", "acc_oldest", "acc_two"])
def test_concurrent_interleaved_sequences_each_keep_their_own_state(
    server: RunningServer, protocol: str, model: str
) -> None:
    sequences = {_next_id(): [s * 10 + i for i in range(1, 6)] for s in range(1, 5)}
    with ThreadPoolExecutor(len(sequences)) as pool:
        futures = {
            sid: pool.submit(_run_sequence_alone, server, protocol, model, sid, values)
            for sid, values in sequences.items()
        }
        results = {sid: future.result(timeout=60) for sid, future in futures.items()}
    for sid, values in sequences.items():
        assert results[sid] == _running_sums(values)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_round_robin_sequences_with_string_and_integer_ids_stay_apart(server: RunningServer, protocol: str) -> None:
    module, client = _client(server, protocol)
    number = _next_id()
    # The integer N and the string "N" are different sequences, as in Triton.
    ids: list[int | str] = [number, str(number), f"sentence-{number}"]
    values = {sid: [i + 1 for i in range(4)] for sid in ids}
    values[str(number)] = [100, 200, 300, 400]
    outputs: dict[int | str, list[int]] = {sid: [] for sid in ids}
    for step in range(4):
        for sid in ids:
            result = _infer(module, client, "acc_direct", values[sid][step], sid, start=step == 0, end=step == 3)
            outputs[sid].append(int(result["OUTPUT"][0][0]))
    for sid in ids:
        assert outputs[sid] == _running_sums(values[sid]), sid
    client.close()


def test_sequences_streamed_on_one_grpc_stream_without_waiting(server: RunningServer) -> None:
    # Every request is written before any response is read: the stream's order is the sequence's order.
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    sequences = {_next_id(): [1, 2, 3, 4, 5], f"stream-{_next_id()}": [10, 20, 30, 40, 50]}
    expected: dict[str, int] = {}
    for step in range(5):
        for sid, values in sequences.items():
            tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[values[step]]], dtype=np.int32))
            request_id = f"{sid}/{step}"
            client.async_stream_infer(
                "acc_oldest",
                [tensor],
                request_id=request_id,
                sequence_id=sid,
                sequence_start=step == 0,
                sequence_end=step == 4,
            )
            expected[request_id] = _running_sums(values)[step]
    got: dict[str, int] = {}
    for _ in expected:
        result, error = results.get(timeout=30)
        assert error is None, error
        got[result.get_response().id] = int(result.as_numpy("OUTPUT")[0][0])
    client.stop_stream()
    client.close()
    assert got == expected


def test_state_outputs_stay_internal_and_start_resets_the_state(server: RunningServer) -> None:
    module, client = _client(server, "http")
    sid = _next_id()
    first = _infer(module, client, "acc_direct", 5, sid, start=True)
    assert set(first) == {"OUTPUT"}  # STATE_OUT is the server's, not the client's
    assert _infer(module, client, "acc_direct", 7, sid)["OUTPUT"][0][0] == 12
    # A second START on a live sequence is not an error in Triton: the sequence starts over.
    assert _infer(module, client, "acc_direct", 3, sid, start=True)["OUTPUT"][0][0] == 3
    assert _infer(module, client, "acc_direct", 4, sid, end=True)["OUTPUT"][0][0] == 7
    client.close()


# -- control tensors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_control_tensors_follow_the_sequence_flags(server: RunningServer, protocol: str) -> None:
    module, client = _client(server, protocol)
    sid = _next_id()
    start = _infer(module, client, "controls", 1, sid, start=True)
    middle = _infer(module, client, "controls", 2, sid)
    end = _infer(module, client, "controls", 3, sid, end=True)
    for result, start_value, end_value in ((start, 1, 0.0), (middle, 0, 0.0), (end, 0, 1.0)):
        assert result["START_OUT"].dtype == np.int32 and result["START_OUT"][0][0] == start_value
        assert result["END_OUT"].dtype == np.float32 and result["END_OUT"][0][0] == end_value
        assert result["READY_OUT"].dtype == np.bool_ and bool(result["READY_OUT"][0][0]) is True
        assert result["CORRID_OUT"].dtype == np.uint64 and int(result["CORRID_OUT"][0][0]) == sid
    single = _infer(module, client, "controls", 4, _next_id(), start=True, end=True)
    assert single["START_OUT"][0][0] == 1 and single["END_OUT"][0][0] == 1.0
    client.close()


def test_direct_strategy_sends_a_not_ready_filler_for_an_idle_lower_slot(server: RunningServer) -> None:
    module, client = _client(server, "http")
    before = _stats(server, "controls")
    first, second = _next_id(), _next_id()
    a = _infer(module, client, "controls", 1, first, start=True)  # slot 0
    b = _infer(module, client, "controls", 2, second, start=True)  # slot 1; slot 0 has nothing ready
    assert (a["BATCH_SIZE"][0][0], a["BATCH_READY"][0][0]) == (1, 1)
    assert (b["BATCH_SIZE"][0][0], b["BATCH_READY"][0][0]) == (2, 1)
    assert bool(b["READY_OUT"][0][0]) is True and int(b["CORRID_OUT"][0][0]) == second
    a_end = _infer(module, client, "controls", 3, first, end=True)
    assert (a_end["BATCH_SIZE"][0][0], a_end["BATCH_READY"][0][0]) == (1, 1)
    b_end = _infer(module, client, "controls", 4, second, end=True)  # slot 0 is free now, still filled
    assert (b_end["BATCH_SIZE"][0][0], b_end["BATCH_READY"][0][0]) == (2, 1)
    after = _stats(server, "controls")
    # Fillers count in the batch size of an execution but not as inferences, as in Triton.
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["execution_count"] - before["execution_count"] == 4

    def batches_of_two(stats: dict[str, Any]) -> int:
        return sum(b["compute_infer"]["count"] for b in stats["batch_stats"] if b["batch_size"] == 2)

    assert batches_of_two(after) - batches_of_two(before) == 2
    client.close()


def test_direct_strategy_waits_for_minimum_slot_utilization_up_to_the_queue_delay(server: RunningServer) -> None:
    module, client = _client(server, "http")
    first, second = _next_id(), _next_id()
    with ThreadPoolExecutor(2) as pool:
        starts = [
            pool.submit(_infer_alone, server, "http", "controls_wait", v, sid, True)
            for v, sid in ((1, first), (2, second))
        ]
        pair = [f.result(timeout=30) for f in starts]
    # Both slots ready (utilization 1.0) runs at once, together.
    assert [int(r["BATCH_READY"][0][0]) for r in pair] == [2, 2]
    began = time.monotonic()
    alone = _infer(module, client, "controls_wait", 3, first)
    waited = time.monotonic() - began
    # One of two slots ready is under minimum_slot_utilization 1.0: it waits for max_queue_delay (0.5 s).
    assert int(alone["BATCH_READY"][0][0]) == 1
    assert waited >= 0.4
    with ThreadPoolExecutor(2) as pool:
        ends = [
            pool.submit(_infer_alone, server, "http", "controls_wait", 4, sid, False, True) for sid in (first, second)
        ]
        assert [int(f.result(timeout=30)["BATCH_READY"][0][0]) for f in ends] == [2, 2]
    client.close()


def test_oldest_strategy_batches_the_ready_requests_of_different_sequences(server: RunningServer) -> None:
    with ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(_infer_alone, server, "grpc", "controls_oldest", value, _next_id(), True, True)
            for value in (1, 2)
        ]
        results = [f.result(timeout=30) for f in futures]
    # preferred_batch_size 2 is reached at once; the oldest strategy sends no fillers.
    for result in results:
        assert (int(result["BATCH_SIZE"][0][0]), int(result["BATCH_READY"][0][0])) == (2, 2)
        assert int(result["START_OUT"][0][0]) == 1 and float(result["END_OUT"][0][0]) == 1.0


# -- correlation IDs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_string_correlation_ids_reach_a_string_corrid_control(server: RunningServer, protocol: str) -> None:
    module, client = _client(server, protocol)
    sid = f"utterance-{_next_id()}"
    start = _infer(module, client, "controls_string", 1, sid, start=True)
    end = _infer(module, client, "controls_string", 2, sid, end=True)
    for result in (start, end):
        assert result["CORRID_OUT"][0][0] == sid.encode()
    client.close()


def test_largest_uint64_correlation_id_over_http(server: RunningServer) -> None:
    largest = 2**64 - 1
    outputs = _outputs(
        _raw(server, "controls", 5, {"sequence_id": largest, "sequence_start": True, "sequence_end": True})
    )
    assert outputs["CORRID_OUT"] == [largest]


@pytest.mark.parametrize("field", ["uint64_param", "int64_param"])
def test_largest_uint64_correlation_id_over_grpc(server: RunningServer, field: str) -> None:
    request = pb.ModelInferRequest(model_name="controls")
    tensor = request.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
    tensor.contents.int_contents.append(5)
    # tritonclient sends int64_param; Triton reads its bits as uint64, so -1 is 2**64-1.
    setattr(request.parameters["sequence_id"], field, 2**64 - 1 if field == "uint64_param" else -1)
    request.parameters["sequence_start"].bool_param = True
    request.parameters["sequence_end"].bool_param = True
    with grpc.insecure_channel(server.grpc_url) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    index = [o.name for o in response.outputs].index("CORRID_OUT")
    assert np.frombuffer(response.raw_output_contents[index], dtype="<u8")[0] == 2**64 - 1


def test_string_id_into_a_numeric_corrid_control_is_what_triton_writes(server: RunningServer) -> None:
    # Triton 2.51 copies the string's 4-byte length and first bytes into a UINT64 CORRID tensor.
    outputs = _outputs(
        _raw(server, "controls", 1, {"sequence_id": "abc", "sequence_start": True, "sequence_end": True})
    )
    assert outputs["CORRID_OUT"] == [int.from_bytes(b"\x03\x00\x00\x00abc\x00", "little")]


# -- implicit state ----------------------------------------------------------------------------------
def test_initial_state_zero_data_and_data_file(server: RunningServer) -> None:
    module, client = _client(server, "grpc")
    assert _run_sequence(module, client, "acc_zero", _next_id(), [5, 6, 7]) == [5, 11, 18]
    sid = _next_id()
    assert _run_sequence(module, client, "acc_file", sid, [5, 1]) == [INITIAL_STATE_VALUE + 5, INITIAL_STATE_VALUE + 6]
    # The same ID started again begins from the initial state again.
    assert _run_sequence(module, client, "acc_file", sid, [2]) == [INITIAL_STATE_VALUE + 2]
    client.close()


def test_non_batching_model_keeps_state_and_backlogs_a_second_sequence(server: RunningServer) -> None:
    # acc_single: max_batch_size 0 and one instance, so one slot; shapes carry no batch dimension.
    module, client = _client(server, "http")
    first, second = _next_id(), _next_id()
    assert _infer(module, client, "acc_single", 1, first, start=True, shape=(1,))["OUTPUT"][0] == 1
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_infer_alone, server, "http", "acc_single", 50, second, True, False, (1,))
        deadline = time.monotonic() + 10
        while _pending(server, "acc_single") < 1:
            assert time.monotonic() < deadline, "the second sequence never queued"
            assert not waiting.done(), waiting.result()
            time.sleep(0.02)
        # The slot is still the first sequence's: it keeps running while the second waits in the backlog.
        assert _infer(module, client, "acc_single", 2, first, shape=(1,))["OUTPUT"][0] == 3
        assert not waiting.done()
        assert _infer(module, client, "acc_single", 3, first, end=True, shape=(1,))["OUTPUT"][0] == 6
        assert waiting.result(timeout=30)["OUTPUT"][0] == 50
    assert _infer(module, client, "acc_single", 5, second, end=True, shape=(1,))["OUTPUT"][0] == 55
    client.close()


def _pending(server: RunningServer, model: str) -> float:
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
    match = re.search(rf'^nv_inference_pending_request_count{{model="{model}",version="1"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


# -- idle sequences ----------------------------------------------------------------------------------
def test_idle_sequence_releases_its_slot_and_then_needs_a_new_start(server: RunningServer) -> None:
    # acc_idle has one slot and max_sequence_idle_microseconds 300000.
    idle, other = _next_id(), _next_id()
    assert _outputs(_raw(server, "acc_idle", 4, {"sequence_id": idle, "sequence_start": True}))["OUTPUT"] == [4]
    time.sleep(0.7)  # the idle timeout itself is the behaviour under test
    # The slot was released: another sequence takes it without waiting.
    assert _outputs(_raw(server, "acc_idle", 9, {"sequence_id": other, "sequence_start": True}, timeout=10))[
        "OUTPUT"
    ] == [9]
    late = _raw(server, "acc_idle", 1, {"sequence_id": idle})
    assert late.status_code == 400
    assert late.json()["error"] == (
        f"inference request for sequence {idle} to model 'acc_idle' must specify the START flag on the first "
        "request of the sequence"
    )
    assert _outputs(_raw(server, "acc_idle", 1, {"sequence_id": other, "sequence_end": True}))["OUTPUT"] == [10]


# -- same-instance routing ---------------------------------------------------------------------------
def test_every_request_of_a_sequence_runs_on_the_instance_that_started_it(server: RunningServer) -> None:
    # route_py keeps each sum in its own worker process and fails a request for a sequence it never started.
    sequences = {_next_id(): [i + s for i in range(1, 7)] for s in range(4)}

    def run(sid: int, values: list[int]) -> list[tuple[int, int]]:
        seen = []
        for i, value in enumerate(values):
            result = _infer_alone(server, "grpc", "route_py", value, sid, start=i == 0, end=i == len(values) - 1)
            seen.append((int(result["OUTPUT"][0][0]), int(result["PID"][0][0])))
        return seen

    with ThreadPoolExecutor(len(sequences)) as pool:
        futures = {sid: pool.submit(run, sid, values) for sid, values in sequences.items()}
        results = {sid: f.result(timeout=60) for sid, f in futures.items()}
    pids = set()
    for sid, values in sequences.items():
        sums = [total for total, _ in results[sid]]
        assert sums == _running_sums(values)
        sequence_pids = {pid for _, pid in results[sid]}
        assert len(sequence_pids) == 1, f"sequence {sid} ran on {sequence_pids}"
        pids |= sequence_pids
    # Four sequences over two instances (two slots each) use both instances.
    assert len(pids) == 2


# -- misuse ------------------------------------------------------------------------------------------
def _error(
    module: Any, client: Any, model: str, sequence_id: int | str, start: bool = False, shape: tuple[int, ...] = (1, 1)
) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as excinfo:
        _infer(module, client, model, 1, sequence_id, start=start, shape=shape)
    return excinfo.value


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_misuse_gets_tritons_errors(server: RunningServer, protocol: str) -> None:
    module, client = _client(server, protocol)
    invalid = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"

    missing = _error(module, client, "acc_direct", 0)
    assert (
        missing.message()
        == "inference request to model 'acc_direct' must specify a non-zero or non-empty correlation ID"
    )
    assert str(missing.status()) == invalid
    assert "non-empty correlation ID" in _error(module, client, "acc_direct", "").message()

    never = _next_id()
    unstarted = _error(module, client, "acc_direct", never)
    assert unstarted.message() == (
        f"inference request for sequence {never} to model 'acc_direct' must specify the START flag on the first "
        "request of the sequence"
    )
    assert str(unstarted.status()) == invalid
    assert "sequence abc-never" in _error(module, client, "acc_direct", "abc-never").message()

    batched = _error(module, client, "acc_direct", _next_id(), start=True, shape=(2, 1))
    assert batched.message() == (
        "inference request to model 'acc_direct' must specify batch-size 1 due to requirements of sequence batcher"
    )

    ended = _next_id()
    assert _run_sequence(module, client, "acc_direct", ended, [1, 2]) == [1, 3]
    after_end = _error(module, client, "acc_direct", ended)
    assert f"sequence {ended} to model 'acc_direct' must specify the START flag" in after_end.message()
    client.close()


def test_unknown_sequence_errors_are_not_counted_as_inferences(server: RunningServer) -> None:
    before = _stats(server, "acc_direct")
    assert _raw(server, "acc_direct", 1, {"sequence_id": _next_id()}).status_code == 400
    after = _stats(server, "acc_direct")
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
    assert after["inference_count"] == before["inference_count"]


# -- configuration -----------------------------------------------------------------------------------
def test_config_shows_tritons_sequence_batching_defaults(server: RunningServer) -> None:
    config = requests.get(f"{server.base}/v2/models/controls_string/config", timeout=5).json()
    sequence = config["sequence_batching"]
    assert sequence["max_sequence_idle_microseconds"] == 1000000
    assert [c["name"] for c in sequence["control_input"]] == ["START", "END", "READY", "CORRID"]
    # Control inputs and state are the server's to feed: they are not model inputs a client sends.
    assert [i["name"] for i in config["input"]] == ["INPUT"]
    acc = requests.get(f"{server.base}/v2/models/acc_direct/config", timeout=5).json()
    assert [i["name"] for i in acc["input"]] == ["INPUT"]
    assert [o["name"] for o in acc["output"]] == ["OUTPUT"]


def test_a_malformed_control_fails_the_load_with_tritons_message(server: RunningServer) -> None:
    index = requests.post(f"{server.base}/v2/repository/index", json={}, timeout=5).json()
    entry = next(e for e in index if e["name"] == "bad_control")
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"] == (
        "sequence batching control 'int32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_START for "
        "bad_control"
    )


# -- the same questions to real Triton ---------------------------------------------------------------
@pytest.fixture(scope="module")
def pair(
    reference_triton: ReferenceTriton, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningServer, RunningServer]]:
    """Real Triton 2.51 and Nereid over the same Python-backend sequence models."""
    repo = build_python_sequence_repository(tmp_path_factory.mktemp("sequence_python"))
    triton = start_real_triton(repo)
    try:
        nereid = start_nereid(repo, log_dir=tmp_path_factory.mktemp("logs"))
    except BaseException:
        triton.stop()
        raise
    yield triton, nereid
    nereid.stop()
    triton.stop()


def _both(pair: tuple[RunningServer, RunningServer], model: str, parameters: dict[str, Any], rows: int = 1) -> Any:
    """Send the same request to both servers; their (status, body) answers, which must be equal."""
    answers = []
    for running in pair:
        body = {
            "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [rows, 1], "data": [7] * rows}],
            "parameters": parameters,
        }
        response = requests.post(f"{running.base}/v2/models/{model}/infer", json=body, timeout=30)
        answers.append((response.status_code, response.json()))
    triton, nereid = answers
    assert nereid == triton, f"{model} {parameters}"
    return nereid


@pytest.mark.parametrize("model", ["report_direct", "report_oldest"])
def test_controls_and_errors_match_real_triton(pair: tuple[RunningServer, RunningServer], model: str) -> None:
    number = _next_id()
    steps: list[tuple[dict[str, Any], int]] = [
        ({}, 400),
        ({"sequence_id": 0}, 400),
        ({"sequence_id": ""}, 400),
        ({"sequence_id": number}, 400),
        ({"sequence_id": number, "sequence_start": True}, 200),
        ({"sequence_id": number}, 200),
        ({"sequence_id": number, "sequence_start": True}, 200),  # a second START: accepted
        ({"sequence_id": number, "sequence_end": True}, 200),
        ({"sequence_id": number}, 400),  # after END
        ({"sequence_id": "abc", "sequence_start": True}, 200),  # a string ID into a UINT64 CORRID
        ({"sequence_id": "abc", "sequence_end": True}, 200),
        ({"sequence_id": 2**64 - 1, "sequence_start": True, "sequence_end": True}, 200),
    ]
    for parameters, status in steps:
        assert _both(pair, model, parameters)[0] == status, parameters
    assert _both(pair, model, {"sequence_id": _next_id(), "sequence_start": True}, rows=2)[0] == 400


def test_direct_fillers_match_real_triton(pair: tuple[RunningServer, RunningServer]) -> None:
    # The model reports len(requests): a sequence in slot 1 runs with a READY=false filler in slot 0.
    first, second = _next_id(), _next_id()
    for parameters in (
        {"sequence_id": first, "sequence_start": True},
        {"sequence_id": second, "sequence_start": True},
        {"sequence_id": second},
        {"sequence_id": first, "sequence_end": True},
        {"sequence_id": second},
        {"sequence_id": second, "sequence_end": True},
    ):
        assert _both(pair, "report_direct", parameters)[0] == 200


def test_idle_release_matches_real_triton(pair: tuple[RunningServer, RunningServer]) -> None:
    sid = _next_id()
    assert _both(pair, "report_direct", {"sequence_id": sid, "sequence_start": True})[0] == 200
    time.sleep(REPORT_IDLE_SECONDS * 2.5)  # the idle timeout itself is the behaviour under test
    assert _both(pair, "report_direct", {"sequence_id": sid})[0] == 400
