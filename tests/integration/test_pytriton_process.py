"""nereid.pytriton's `execution="process"`: bound functions in Python-backend worker processes, through tritonclient
(batching, decorators, a decoupled generator, errors), the functions pickled by reference from their module."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid.pytriton.exceptions import PyTritonBadParameterError
from nereid.pytriton.model_config import ModelConfig, Tensor
from nereid.pytriton.triton import Triton, TritonConfig
from tests.integration import pytriton_models as models
from tests.servers import free_port

F32 = np.float32


@pytest.fixture(scope="module")
def ports() -> Iterator[tuple[int, int]]:
    config = TritonConfig(http_address="127.0.0.1", grpc_address="127.0.0.1", allow_metrics=False,
                          http_port=free_port(), grpc_port=free_port())  # fmt: skip
    with Triton(config=config) as triton:
        vec = [Tensor(name="INPUT0", dtype=F32, shape=(4,)), Tensor(name="INPUT1", dtype=F32, shape=(4,))]
        outs = [Tensor(name="OUTPUT0", dtype=F32, shape=(4,)), Tensor(name="OUTPUT1", dtype=F32, shape=(4,))]
        triton.bind("add_sub", models.add_sub, vec, outs, config=ModelConfig(max_batch_size=8), execution="process")
        triton.bind("pid", [models.worker_pid, models.worker_pid], [Tensor(name="x", dtype=F32, shape=(1,))],
                    [Tensor(name="pid", dtype=np.int64, shape=(1,))], execution="process")  # fmt: skip
        triton.bind("countdown", models.countdown, [Tensor(name="start", dtype=np.int32, shape=(1,))],
                    [Tensor(name="value", dtype=np.int32, shape=(1,))],
                    config=ModelConfig(max_batch_size=4, decoupled=True), execution="process")  # fmt: skip
        triton.bind("fails", models.fails, [Tensor(name="x", dtype=F32, shape=(1,))], [Tensor(name="y", dtype=F32, shape=(1,))],
                    execution="process")  # fmt: skip
        with pytest.raises(PyTritonBadParameterError, match="callables that pickle"):
            triton.bind("closure", lambda requests: requests, [], [Tensor(name="y", dtype=F32, shape=(1,))], execution="process")
        yield config.http_port, config.grpc_port


def _infer(port: int, model: str, **arrays: np.ndarray) -> Any:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    inputs = []
    for name, array in arrays.items():
        item = httpclient.InferInput(name, list(array.shape), "FP32")
        item.set_data_from_numpy(array)
        inputs.append(item)
    return client.infer(model, inputs)


def test_a_process_bound_function_answers_from_a_worker_process(ports: tuple[int, int]) -> None:
    a = np.arange(8, dtype=F32).reshape(2, 4)
    result = _infer(ports[0], "add_sub", INPUT0=a, INPUT1=a)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - a)
    pid = int(_infer(ports[0], "pid", x=np.zeros((1, 1), F32)).as_numpy("pid")[0][0])
    assert pid != os.getpid()


def test_a_process_bound_generator_streams_and_errors_carry_the_traceback(ports: tuple[int, int]) -> None:
    assert models.stream_countdown(ports[1]) == [3, 2, 1]
    with pytest.raises(InferenceServerException, match="ValueError: the input was not welcome"):
        _infer(ports[0], "fails", x=np.zeros((1, 1), F32))


def test_an_unrecoverable_error_in_a_worker_process_stops_the_server() -> None:
    config = TritonConfig(http_address="127.0.0.1", grpc_address="127.0.0.1", allow_metrics=False,
                          http_port=free_port(), grpc_port=free_port())  # fmt: skip
    triton = Triton(config=config)
    triton.bind("doomed", models.unrecoverable, [Tensor(name="x", dtype=F32, shape=(1,))],
                [Tensor(name="y", dtype=F32, shape=(1,))], execution="process")  # fmt: skip
    triton.run()
    with pytest.raises(InferenceServerException, match="PyTritonUnrecoverableError: the device is gone"):
        _infer(config.http_port, "doomed", x=np.zeros((1, 1), F32))
    deadline = time.monotonic() + 60
    while triton.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not triton.is_alive()
