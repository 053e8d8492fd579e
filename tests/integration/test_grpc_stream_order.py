"""A gRPC stream answers requests of a model that is not decoupled in the order they came, as Triton 2.51 writes them
(asked; qa/L0_sequence_batcher's SequenceBatcherPreserveOrderingTest counts on it), though they run concurrently."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.servers import RunningServer, start_nereid

_SLEEPY = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            ms = pb_utils.get_input_tensor_by_name(request, "MS").as_numpy()
            time.sleep(int(ms[0]) / 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", ms)]))
        return responses
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    model = tmp_path_factory.mktemp("repository") / "sleepy"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(_SLEEPY)
    (model / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\ninput [ { name: "MS" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n'
    )
    running = start_nereid(model.parent, log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


def test_a_slow_requests_answer_goes_before_a_later_fast_ones(server: RunningServer) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result.get_response().id))
    try:
        for request_id, ms in (("slow", 1000), ("fast", 0), ("bad", -1), ("fast2", 0)):
            tensor = grpcclient.InferInput("MS", [1], "INT32")
            tensor.set_data_from_numpy(np.array([ms], np.int32))
            model = "sleepy" if request_id != "bad" else "no_such_model"  # an error keeps its request's place too
            client.async_stream_infer(model, [tensor], request_id=request_id)
        got = [answers.get(timeout=30) for _ in range(4)]
    finally:
        client.stop_stream()
    assert got[:2] == ["slow", "fast"] and got[3] == "fast2"
    assert "no_such_model" in str(got[2])
