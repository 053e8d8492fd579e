"""A model without batching that reports how many requests each execute() received (SEEN) and which call of
execute() it was (CALL). MODE 'raise' makes execute() raise, 'fail' answers an error."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().reshape(-1)[0]
            if mode == b"raise":
                raise ValueError("this request was asked to raise")
            if mode == b"fail":
                error = pb_utils.TritonError("this request was asked to fail", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            seen = pb_utils.Tensor("SEEN", np.array([len(requests)], dtype=np.int32))
            call = pb_utils.Tensor("CALL", np.array([self.calls], dtype=np.int64))
            responses.append(pb_utils.InferenceResponse([seen, call]))
        return responses
