"""OUT = IN * 2, passed through DLPack both ways (to_dlpack, then Tensor.from_dlpack)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            doubled = pb_utils.Tensor("DOUBLED", tensor.as_numpy() * 2)
            out = pb_utils.Tensor.from_dlpack("OUT", doubled.to_dlpack())
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
