"""Logs at every level through pb_utils.Logger; MARKER makes each execute's lines findable in the server log.
finalize() logs too, so a test can see that unloading called it."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info("logging model initialized")

    def execute(self, requests):
        responses = []
        for request in requests:
            marker = pb_utils.get_input_tensor_by_name(request, "MARKER").as_numpy()
            text = marker.reshape(-1)[0].decode()
            pb_utils.Logger.log_info(f"info {text}")
            pb_utils.Logger.log_warn(f"warn {text}")
            pb_utils.Logger.log_error(f"error {text}")
            pb_utils.Logger.log_verbose(f"verbose {text}")
            pb_utils.Logger.log(f"leveled {text}", pb_utils.Logger.WARNING)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", marker)]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("logging model finalized")
