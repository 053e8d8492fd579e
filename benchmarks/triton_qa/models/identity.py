"""A Python-backend stand-in for Triton's C++ identity backend: each INPUTn comes back as OUTPUTn, unchanged."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.outputs = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for tensor in request.inputs():
                name = tensor.name()
                if name.startswith("INPUT"):
                    outputs.append(pb_utils.Tensor("OUTPUT" + name[len("INPUT"):], tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
