"""The Python functions the nereid.pytriton tests bind, written as a PyTriton user writes them, and the client
call the thread and process tests both make to the `countdown` generator."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any

import numpy as np

from nereid.pytriton.decorators import (
    batch,
    fill_optionals,
    first_value,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
    triton_context,
)
from nereid.pytriton.exceptions import PyTritonUnrecoverableError
from nereid.pytriton.proxy.types import Request


@batch
def add_sub(INPUT0: np.ndarray, INPUT1: np.ndarray) -> dict[str, np.ndarray]:
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


@sample
def scale(x: np.ndarray, factor: np.ndarray) -> dict[str, np.ndarray]:
    """A model without batching: @sample passes the single request's inputs as keyword arguments."""
    return {"y": (x * factor[0]).astype(np.float64)}  # float64 out: cast to the output's FP32 like PyTriton


def echo_parameters(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """Plain callable (no decorator): the request parameters and requested outputs come back as text."""
    results = []
    for request in requests:
        params = sorted(f"{k}={v}" for k, v in (request.parameters or {}).items())
        results.append(
            {
                "params": np.array([[";".join(params).encode()]], dtype=np.bytes_),
                "requested": np.array([[",".join(sorted(request.requested_output_names or [])).encode()]], dtype=np.bytes_),
            }
        )
    return results


@fill_optionals(offset=np.array([100], dtype=np.int32))
@group_by_keys
@batch
def optional_offset(value: np.ndarray, offset: np.ndarray) -> dict[str, np.ndarray]:
    return {"total": value + offset}


@batch
@group_by_values("mode")
def by_mode(data: np.ndarray, mode: np.ndarray) -> dict[str, np.ndarray]:
    # Each call sees one mode only: the group size tells how many samples shared it.
    assert len(np.unique(mode)) == 1
    factor = 2 if mode[0][0] == b"double" else 1
    return {"out": data * factor, "group_size": np.full((len(data), 1), len(data), dtype=np.int32)}


@batch
@first_value("temperature")
def with_temperature(prompt: np.ndarray, temperature: Any) -> dict[str, np.ndarray]:
    assert np.isscalar(temperature)  # squeezed to a scalar by @first_value
    return {"scaled": prompt * np.float32(temperature)}


@batch
@pad_batch
def padded(x: np.ndarray) -> dict[str, np.ndarray]:
    # The batch arrives padded (its last row repeated) to a preferred size (2 or 4) or max_batch_size 8. The caller
    # sends rows 0..n-1, so the original size is the last value + 1; @batch wants exactly that many rows back.
    original = int(x[-1][0]) + 1
    return {"seen": np.full((original, 1), x.shape[0], dtype=np.int32)}


class ContextModel:
    """A callable object whose __call__ is decorated, reading its model config through the triton context."""

    @triton_context
    @batch
    def __call__(self, triton_context: Any, **inputs: np.ndarray) -> dict[str, np.ndarray]:
        config = triton_context.model_configs[self]
        name = np.array([[config.model_name.encode()]] * len(inputs["x"]), dtype=np.bytes_)
        return {"model": name, "max_batch": np.full((len(inputs["x"]), 1), config.max_batch_size, dtype=np.int32)}


class ParallelInstance:
    """Two of these serve one model: each waits (bounded) until both have started a batch, proving instances run
    at the same time on threads of their own."""

    started = threading.Barrier(2)

    def __init__(self, index: int) -> None:
        self.index = index

    @batch
    def infer(self, x: np.ndarray) -> dict[str, np.ndarray]:
        try:
            self.started.wait(timeout=20)
            together = 1
        except threading.BrokenBarrierError:
            together = 0
        return {"instance": np.full((len(x), 1), self.index, dtype=np.int32), "together": np.full((len(x), 1), together, dtype=np.int32)}


@batch
def countdown(start: np.ndarray) -> Any:
    """Decoupled: one response per step, from a generator."""
    for value in range(int(start[0][0]), 0, -1):
        yield {"value": np.full((len(start), 1), value, dtype=np.int32)}


@batch
def fails(x: np.ndarray) -> dict[str, np.ndarray]:
    raise ValueError("the input was not welcome")


@batch
def wrong_dtype(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": x.astype(np.int64)}


def not_a_list(requests: list[Request]) -> Any:
    return {"y": np.zeros((1, 1), dtype=np.float32)}


@batch
def texts(text: np.ndarray) -> dict[str, np.ndarray]:
    upper = np.array([[t.upper() for t in row] for row in text], dtype=np.bytes_)
    return {"upper": upper}


async def async_double(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """A coroutine function (PyTriton awaits it; @batch does not take coroutines there either)."""
    await asyncio.sleep(0)
    return [{"y": r["x"] * 2} for r in requests]


class CallCounter:
    """Counts its calls, for the response-cache test."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    @batch
    def infer(self, x: np.ndarray) -> dict[str, np.ndarray]:
        with self.lock:
            self.calls += 1
        return {"y": x + 1}


def unrecoverable(requests: list[Request]) -> Any:
    raise PyTritonUnrecoverableError("the device is gone")


def slow(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    time.sleep(0.05)
    return [{"y": r["x"]} for r in requests]


@batch
def worker_pid(x: np.ndarray) -> dict[str, np.ndarray]:
    import os

    return {"pid": np.full((len(x), 1), os.getpid(), dtype=np.int64)}


def stream_countdown(grpc_port: int, start: int = 3) -> list[int]:
    """The values a bound `countdown` generator streams over a gRPC stream, up to its empty final response."""
    import tritonclient.grpc as grpcclient  # here, not at the top: worker processes import this module for its functions

    responses: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        tensor = grpcclient.InferInput("start", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[start]], dtype=np.int32))
        client.async_stream_infer("countdown", [tensor], enable_empty_final_response=True)
        values = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            result, error = responses.get(timeout=30)
            assert error is None
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            values.append(int(result.as_numpy("value")[0][0]))
        return values
    finally:
        client.stop_stream()
        client.close()


class ThreadRecorder:
    """Records the thread each call ran on; each call sleeps as long as its largest input says (seconds)."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    @batch
    def infer(self, x: np.ndarray) -> dict[str, np.ndarray]:
        self.threads.append(threading.current_thread().name)
        if x.max() > 0:
            time.sleep(float(x.max()))
        return {"y": x}
