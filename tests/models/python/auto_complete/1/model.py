"""No config.pbtxt: auto_complete_config supplies max_batch_size, inputs, outputs, batching and the policy."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        config = auto_complete_model_config
        config.set_max_batch_size(16)
        config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_input({"name": "B", "data_type": "TYPE_INT32", "dims": [-1], "optional": True})
        config.add_output({"name": "SUM", "data_type": "TYPE_FP32", "dims": [1]})
        config.set_dynamic_batching()
        config.set_model_transaction_policy({"decoupled": False})
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            total = a.sum(axis=1, keepdims=True).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", total)]))
        return responses
