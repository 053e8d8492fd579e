"""A large tensor through BLS: MB megabytes of FP32 to py_add_sub and back, checked element by element."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            megabytes = int(pb_utils.get_input_tensor_by_name(request, "MB").as_numpy()[0])
            count = megabytes * 1024 * 1024 // 4
            a = np.arange(count, dtype=np.float32)
            b = np.full(count, 0.5, dtype=np.float32)
            call = pb_utils.InferenceRequest(
                model_name="py_add_sub",
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", b)],
            )
            response = call.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            total = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()
            difference = pb_utils.get_output_tensor_by_name(response, "OUTPUT1").as_numpy()
            ok = bool(np.array_equal(total, a + b) and np.array_equal(difference, a - b))
            outputs = [
                pb_utils.Tensor("OK", np.array([ok])),
                pb_utils.Tensor("CHECKSUM", np.array([float(total.sum(dtype=np.float64))])),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
