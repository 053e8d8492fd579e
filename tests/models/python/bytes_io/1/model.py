"""BYTES in and out: UPPER is each element upper-cased (as str objects), LENGTH its length in bytes."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([item.decode("utf-8").upper() for item in text.reshape(-1)], dtype=object)
            lengths = np.array([len(item) for item in text.reshape(-1)], dtype=np.int32)
            outputs = [
                pb_utils.Tensor("UPPER", upper.reshape(text.shape)),
                pb_utils.Tensor("LENGTH", lengths.reshape(text.shape)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
