"""Not decoupled, yet answers through the response sender. OUT = IN squared, sent in the way MODE says: 0 (or no
MODE) one response with the final flag, execute() returns None; 1 the response, then the final flag alone; 2 the
response, then a second one (the sender refuses it, execute() raises); 3 the response with the final flag, and
execute() returns another response too (OUT = -1), which Triton drops."""

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        returned = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            mode = pb_utils.get_input_tensor_by_name(request, "MODE")
            mode = 0 if mode is None else int(mode.as_numpy()[0])
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values * values)])
            sender = request.get_response_sender()
            if mode == 1:
                sender.send(response)
                sender.send(flags=FINAL)
            elif mode == 2:
                sender.send(response)
                sender.send(response)
            else:
                sender.send(response, flags=FINAL)
            returned.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.full(values.shape, -1, np.float32))]))
        return returned if mode == 3 else None
