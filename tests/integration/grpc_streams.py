"""One request's every response on a gRPC stream, and the inputs of the decoupled test model `repeat`: for the
Python-backend tests and their differential twin."""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from tests.servers import RunningServer


def _tensor(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def stream(server: RunningServer, model: str, inputs: list[Any], outputs: list[str] | None = None) -> list[Any]:
    """Every response of one request on a gRPC stream: (outputs by name, is_final) or the error's message."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    collected: list[Any] = []
    try:
        requested = [grpcclient.InferRequestedOutput(n) for n in outputs] if outputs else None
        client.async_stream_infer(model, inputs, outputs=requested, request_id="s-1", enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=60)
            if error is not None:
                collected.append(error.message())
                continue
            response = result.get_response()
            assert response.id == "s-1"
            final = response.parameters["triton_final_response"].bool_param
            collected.append(({o.name: result.as_numpy(o.name) for o in response.outputs}, final))
            if final:
                return collected
    finally:
        client.stop_stream()
        client.close()


def repeat_inputs(values: list[int], data_size: int | None = None, threaded: bool = False, after_next: bool = False) -> list[Any]:
    """The inputs of tests/models/python/repeat: one response per element of IN (an error for a negative one) with
    DATA_SIZE floats of DATA each, sent from a thread after execute returns when THREADED (and only once the model's
    next execute() has begun, AFTER_NEXT)."""
    inputs = [_tensor("IN", np.array(values, np.int32), "INT32")]
    if data_size is not None:
        inputs.append(_tensor("DATA_SIZE", np.array([data_size], np.int32), "INT32"))
    if threaded:
        inputs.append(_tensor("THREADED", np.array([True]), "BOOL"))
    if after_next:
        inputs.append(_tensor("AFTER_NEXT", np.array([True]), "BOOL"))
    return inputs
