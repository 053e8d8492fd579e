"""Decoupled with `async def execute`: requests of one instance wait at the same time (Triton 24.04+)."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            ms = pb_utils.get_input_tensor_by_name(request, "MS").as_numpy().copy()
            sender = request.get_response_sender()
            await asyncio.sleep(int(ms[0]) / 1000)
            sender.send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", ms)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
