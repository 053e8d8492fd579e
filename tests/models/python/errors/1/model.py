"""Each request's MODE picks a way to fail (or not): raising, error responses with every TritonError code,
too few or too many responses, responses of the wrong type, outputs the client did not ask for, and (Nereid only)
a BLS call (which succeeds: its answer is ignored; tests/integration/test_bls.py tests BLS) or a response sent
without the final flag."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _mode(request):
    return pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().reshape(-1)[0].decode()


class TritonPythonModel:
    def execute(self, requests):
        mode = _mode(requests[0])
        ok = pb_utils.Tensor("OUT", np.ones((1, 2), np.float32))
        if mode == "raise":
            raise ValueError("execute exploded")
        if mode == "model_exception":
            raise pb_utils.TritonModelException("the model refuses")
        if mode.startswith("code:"):
            code = getattr(pb_utils.TritonError, mode.split(":", 1)[1])
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("custom error", code)) for _ in requests]
        if mode == "default_code":
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("default code error")) for _ in requests]
        if mode == "too_few":
            return []
        if mode == "too_many":
            return [pb_utils.InferenceResponse([ok]) for _ in range(len(requests) + 1)]
        if mode == "none":
            return None
        if mode == "wrong_type":
            return ["not a response" for _ in requests]
        if mode == "bls":
            inputs = [pb_utils.Tensor("INPUT0", np.ones((1, 4), np.float32)), pb_utils.Tensor("INPUT1", np.ones((1, 4), np.float32))]
            bls = pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0"], inputs=inputs)
            bls.exec()
        if mode == "sender":
            requests[0].get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)  # no response yet
        if mode == "extra_output":
            extra = pb_utils.Tensor("NOT_IN_CONFIG", np.ones((1, 2), np.float32))
            return [pb_utils.InferenceResponse([ok, extra]) for _ in requests]
        if mode == "both":
            two = pb_utils.Tensor("OUT2", np.full((1, 1), 2.0, np.float32))
            return [pb_utils.InferenceResponse([ok, two]) for _ in requests]
        return [pb_utils.InferenceResponse([ok]) for _ in requests]
