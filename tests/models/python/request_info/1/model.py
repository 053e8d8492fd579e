"""Echoes what the model sees of each request: parameters (JSON), id, correlation id, flags, timeout, and the
requested output names. With the request parameter `respond_with_parameters`, the response carries parameters
too (Nereid only: Triton 2.51's InferenceResponse takes no parameters)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = request.parameters()
            values = {
                "PARAMETERS": np.array([params.encode()], dtype=object),
                "REQUEST_ID": np.array([request.request_id().encode()], dtype=object),
                "CORRELATION_ID": np.array([str(request.correlation_id()).encode()], dtype=object),
                "FLAGS": np.array([request.flags()], dtype=np.int64),
                "TIMEOUT": np.array([request.timeout()], dtype=np.int64),
                "REQUESTED": np.array([",".join(sorted(request.requested_output_names())).encode()], dtype=object),
            }
            outputs = [pb_utils.Tensor(name, value) for name, value in values.items()]
            if json.loads(params).get("respond_with_parameters"):
                extra = {"echo": "yes", "count": 3, "flag": True}
                responses.append(pb_utils.InferenceResponse(outputs, parameters=extra))
            else:
                responses.append(pb_utils.InferenceResponse(outputs))
        return responses
