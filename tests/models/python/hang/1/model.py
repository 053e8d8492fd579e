"""MODE 'hang' never returns from execute; anything else returns the worker's pid."""

import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        mode = pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy().reshape(-1)[0].decode()
        if mode == "hang":
            pb_utils.Logger.log_info(f"hanging in execute (pid {os.getpid()})")
            threading.Event().wait()
        pid = np.array([os.getpid()], dtype=np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]
