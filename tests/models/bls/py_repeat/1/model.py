"""Decoupled: for each element of IN a response (OUT = the element, IDX = its index); a negative element gets an
error response in its place; then a bare TRITONSERVER_RESPONSE_COMPLETE_FINAL. An element 1000 waits (10 s at most)
for the request to be cancelled, and ends the stream with a CANCELLED error when it is."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for index, value in enumerate(values.tolist()):
                if value == 1000:
                    deadline = time.monotonic() + 10
                    while not request.is_cancelled() and time.monotonic() < deadline:
                        time.sleep(0.01)
                    if request.is_cancelled():
                        error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                        sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                        break
                    continue
                if value < 0:
                    error = pb_utils.TritonError(f"negative element {value}", pb_utils.TritonError.INVALID_ARG)
                    sender.send(pb_utils.InferenceResponse(error=error))
                    continue
                outputs = [
                    pb_utils.Tensor("OUT", np.array([value], np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], np.uint32)),
                ]
                sender.send(pb_utils.InferenceResponse(outputs))
            else:
                sender.send(flags=FINAL)
        return None
