"""Conditional execution with BLS: one request, and the model decides which other model of the server runs it.

The branch is data-dependent (USE_SIMPLE), which an ensemble cannot express. An error of the model it calls comes
back inside the BLS response (it does not raise), and is passed on to the client.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


def _simple_request(a, b):
    """'simple' takes INT32 [batch, 16]: round and zero-pad the four values."""

    def widen(values):
        return np.pad(np.rint(values).astype(np.int32), (0, 12)).reshape(1, 16)

    return pb_utils.InferenceRequest(
        model_name="simple",
        requested_output_names=["OUTPUT0", "OUTPUT1"],
        inputs=[pb_utils.Tensor("INPUT0", widen(a)), pb_utils.Tensor("INPUT1", widen(b))],
    )


def _add_sub_request(a, b):
    """'add_sub_python' takes FP32 [batch, 4]."""
    return pb_utils.InferenceRequest(
        model_name="add_sub_python",
        requested_output_names=["OUTPUT0", "OUTPUT1"],
        inputs=[pb_utils.Tensor("INPUT0", a.reshape(1, 4)), pb_utils.Tensor("INPUT1", b.reshape(1, 4))],
    )


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            use_simple = bool(pb_utils.get_input_tensor_by_name(request, "USE_SIMPLE").as_numpy()[0])
            route = "simple" if use_simple else "add_sub_python"
            call = _simple_request(a, b) if use_simple else _add_sub_request(a, b)
            reply = call.exec()
            if reply.has_error():
                error = pb_utils.TritonError(f"bls_conditional: '{route}' failed: {reply.error().message()}")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            outputs = [
                pb_utils.Tensor(name, pb_utils.get_output_tensor_by_name(reply, name).as_numpy()[0, :4].astype(np.float32))
                for name in ("OUTPUT0", "OUTPUT1")
            ]
            outputs.append(pb_utils.Tensor("ROUTE", np.array([route.encode()], dtype=np.object_)))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
