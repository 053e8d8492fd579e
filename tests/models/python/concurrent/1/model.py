"""Sleeps SECONDS and returns [pid, start, end] (wall-clock), so a test can see two instances overlap."""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()[0])
            start = time.time()
            time.sleep(seconds)
            span = np.array([os.getpid(), start, time.time()], dtype=np.float64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", span)]))
        return responses
