"""Not decoupled, yet answers after execute() returned, from a thread of its own (as Triton's response_sender QA
model does). OUT = 2 * IN and COUNT = the number of requests in the batch, answered the way MODE says: 0 from the
thread, the response then the final flag in a second send; 1 returned by execute(); 2 the thread takes the sender
and ends without a word (the request fails: its sender is gone). execute() returns None when no request is 1."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        later, returned = [], []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0, 0])
            response = pb_utils.InferenceResponse(
                [
                    pb_utils.Tensor("OUT", values * 2),
                    pb_utils.Tensor("COUNT", np.full(values.shape, len(requests), np.int32)),
                ]
            )
            if mode == 1:
                returned.append(response)
                continue
            later.append((request.get_response_sender(), response if mode == 0 else None))
            returned.append(None)
        threading.Thread(target=self._answer, args=(later,), daemon=True).start()
        return returned if any(r is not None for r in returned) else None

    @staticmethod
    def _answer(later):
        time.sleep(0.2)  # well after execute() returned
        for sender, response in later:
            if response is not None:
                sender.send(response)
                sender.send(flags=FINAL)
