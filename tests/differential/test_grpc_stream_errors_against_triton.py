"""Triton's `triton_grpc_error: true` stream metadata, against real Triton: the first error ends the stream with its
gRPC status (INTERNAL for a model's TritonError) instead of going out as a message, and nothing follows it, also when
the model sends its final flag later (qa/L0_backend_python/lifecycle, test_triton_grpc_error_decoupled_delayed_final,
which real Triton 2.51 does not survive: that case is checked on Nereid alone, last). Without the metadata the error is
a message and the stream goes on."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.differential.pair import Pair, start_pair
from tests.integration.onnx_builders import write

_DECOUPLED_ERROR = '''
import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().flat[0].decode()
            threading.Thread(target=self._respond, args=(request.get_response_sender(), values, mode)).start()
        return None

    def _respond(self, sender, values, mode):
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values)]))
        error = pb_utils.InferenceResponse(error=pb_utils.TritonError("An error occurred during execution"))
        if mode == "error_final":
            sender.send(error, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        sender.send(error)
        if mode == "error_then_late_final":
            time.sleep(0.5)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    repository = tmp_path_factory.mktemp("repo") / "models"
    write(repository / "decoupled_error" / "1" / "model.py", _DECOUPLED_ERROR)
    write(
        repository / "decoupled_error" / "config.pbtxt",
        'backend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
        'input [{ name: "IN" data_type: TYPE_FP32 dims: [2] }, { name: "MODE" data_type: TYPE_STRING dims: [1] }]\n'
        'output [{ name: "OUT" data_type: TYPE_FP32 dims: [2] }]\n',
    )
    both = start_pair(repository)
    yield both
    both.close()


def _stream(url: str, mode: str, headers: dict[str, str] | None, requests: int = 1) -> list[Any]:
    """What the callback gets within 2 s of the last answer: arrays for responses, (status, message) for errors."""
    got: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=partial(lambda q, result, error: q.put(error if error else result), got), headers=headers)
    values = np.array([1.5, -2.0], np.float32)
    for _ in range(requests):
        inputs = [grpcclient.InferInput("IN", [2], "FP32"), grpcclient.InferInput("MODE", [1], "BYTES")]
        inputs[0].set_data_from_numpy(values)
        inputs[1].set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
        client.async_stream_infer("decoupled_error", inputs)
    seen: list[Any] = []
    while True:
        try:
            item = got.get(timeout=2)
        except queue.Empty:
            break
        if isinstance(item, InferenceServerException):
            seen.append((item.status(), item.message()))
        else:
            seen.append(item.as_numpy("OUT").tolist())
    client.stop_stream()
    client.close()
    return seen


def test_with_triton_grpc_error_the_first_error_ends_the_stream_with_its_status(pair: Pair) -> None:
    triton = _stream(pair.triton.grpc_url, "error_final", {"triton_grpc_error": "true"})
    nereid = _stream(pair.nereid.grpc_url, "error_final", {"triton_grpc_error": "true"})
    assert triton[0] == [1.5, -2.0] and triton[1][0] == "StatusCode.INTERNAL" and len(triton) == 2, triton
    assert nereid == triton


def test_without_it_an_error_is_a_message_and_the_stream_goes_on(pair: Pair) -> None:
    triton = _stream(pair.triton.grpc_url, "error_then_final", None, requests=2)
    nereid = _stream(pair.nereid.grpc_url, "error_then_final", None, requests=2)
    assert len(triton) == 4 and sorted(map(str, nereid)) == sorted(map(str, triton))


@pytest.mark.parametrize("mode", ["error_then_final", "error_then_late_final"])
def test_a_final_flag_after_the_error_sends_nothing_more(pair: Pair, mode: str) -> None:
    """Not compared: Triton 2.51 crashes here (a use after free that later releases fixed, with this case as its
    regression test). What those releases do: the response, the error's INTERNAL status, then nothing."""
    nereid = _stream(pair.nereid.grpc_url, mode, {"triton_grpc_error": "true"})
    assert nereid == [[1.5, -2.0], ("StatusCode.INTERNAL", "An error occurred during execution")]
    assert grpcclient.InferenceServerClient(pair.nereid.grpc_url).is_server_live()
