"""Decoupled: streams 0, 1, 2 ... from a thread, every 20 ms, until the client cancels (or 500 responses); logs
"<TAG> cancelled after N" when sender.is_cancelled() turns true."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            tag = pb_utils.get_input_tensor_by_name(request, "TAG").as_numpy().reshape(-1)[0].decode()
            threading.Thread(target=self.stream, args=(request, tag), daemon=True).start()
        return None

    def stream(self, request, tag):
        sender = request.get_response_sender()
        for count in range(500):
            if sender.is_cancelled():
                pb_utils.Logger.log_info(f"{tag} cancelled after {count} (request says {request.is_cancelled()})")
                break
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([count], np.int32))]))
            time.sleep(0.02)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
