"""An autoregressive loop with BLS: call a model, look at what it produced, decide whether to call it again.

Like a text generator calling its model once per token until an end token, with 'add_sub_python' as the model: each
call's OUTPUT0 (state + STEP) is the next call's input, and the loop stops on a condition of the data (the sum of the
state reaches STOP_AT) or after MAX_STEPS calls. The number of calls is only known at run time, which an ensemble
cannot express.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            state = pb_utils.get_input_tensor_by_name(request, "STATE").as_numpy().reshape(1, 4)
            step = pb_utils.get_input_tensor_by_name(request, "STEP").as_numpy().reshape(1, 4)
            stop_at = float(pb_utils.get_input_tensor_by_name(request, "STOP_AT").as_numpy()[0])
            max_steps = int(pb_utils.get_input_tensor_by_name(request, "MAX_STEPS").as_numpy()[0])
            history = []
            error = None
            while len(history) < max_steps and float(state.sum()) < stop_at:
                reply = pb_utils.InferenceRequest(
                    model_name="add_sub_python",
                    requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor("INPUT0", state), pb_utils.Tensor("INPUT1", step)],
                ).exec()
                if reply.has_error():
                    error = pb_utils.TritonError(f"bls_autoregressive: step {len(history) + 1}: {reply.error().message()}")
                    break
                state = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0").as_numpy()
                history.append(state[0])
            if error is not None:
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            outputs = [
                pb_utils.Tensor("HISTORY", np.array(history, dtype=np.float32).reshape(-1, 4)),
                pb_utils.Tensor("STEPS", np.array([len(history)], dtype=np.int32)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
