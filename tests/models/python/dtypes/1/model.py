"""OUT_<TYPE> = IN_<TYPE> for every input the request carries; the dtype must survive the round trip."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for tensor in request.inputs():
                array = tensor.as_numpy()
                expected = pb_utils.triton_to_numpy_type(pb_utils.numpy_to_triton_type(array.dtype))
                if array.dtype != expected and array.dtype.kind != "O":
                    raise TypeError(f"{tensor.name()} arrived as {array.dtype}")
                outputs.append(pb_utils.Tensor(tensor.name().replace("IN_", "OUT_"), array))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
