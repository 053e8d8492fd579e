"""OUT = IN * 2 in bfloat16, through torch: numpy has no bfloat16, so BF16 tensors travel by DLPack."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        import torch  # only this model needs torch; the test skips it where torch is not installed

        responses = []
        for request in requests:
            tensor = torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, "IN").to_dlpack())
            if tensor.dtype != torch.bfloat16:
                raise TypeError(f"IN arrived as {tensor.dtype}")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUT", tensor * 2)]))
        return responses
