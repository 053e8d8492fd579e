"""An error response for every request; with RAISE an exception out of execute() instead."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            if bool(pb_utils.get_input_tensor_by_name(request, "RAISE").as_numpy()[0]):
                raise pb_utils.TritonModelException("py_fail raised on purpose")
            error = pb_utils.TritonError("py_fail refuses this request", pb_utils.TritonError.INVALID_ARG)
            responses.append(pb_utils.InferenceResponse(error=error))
        return responses
