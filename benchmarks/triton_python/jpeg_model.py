"""JPEG bytes to a network's input, one image per batch row, as a Python-backend model that Nereid and real Triton
both serve. Copied as model.py with imaging.py beside it (which does the work); the input, the output and the image
size are those of the model's config (output dims [3, size, size])."""

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imaging import decode  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.input = config["input"][0]["name"]
        self.output = config["output"][0]["name"]
        self.size = int(config["output"][0]["dims"][-1])

    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, self.input).as_numpy().reshape(-1)
            pixels = np.stack([decode(bytes(jpeg), self.size) for jpeg in images])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.output, pixels)]))
        return responses
