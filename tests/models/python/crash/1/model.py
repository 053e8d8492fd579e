"""MODE 'segfault', 'exit' or 'kill' ends the worker process the hard way; anything else returns its pid."""

import ctypes
import os
import signal

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        mode = pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy().reshape(-1)[0].decode()
        if mode == "segfault":
            ctypes.string_at(0)
        elif mode == "exit":
            os._exit(3)
        elif mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        pid = np.array([os.getpid()], dtype=np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]) for _ in requests]
