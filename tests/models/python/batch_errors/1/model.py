"""Answers a request whose MODE is 'fail' with an error and the others with the batch size it saw."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().reshape(-1)[0]
            if mode == b"fail":
                error = pb_utils.TritonError("this request was asked to fail", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                batch = np.array([[len(requests)]], dtype=np.int32)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("BATCH", batch)]))
        return responses
