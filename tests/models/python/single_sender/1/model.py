"""Not decoupled, yet answers through the response sender: one response with the final flag, and execute()
returns None. OUT = IN squared."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values * values)])
            request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
