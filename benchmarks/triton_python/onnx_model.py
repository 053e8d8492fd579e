"""An ONNX Runtime session as a Python-backend model, for real Triton in the benchmarks: Triton's ONNX Runtime
backend does not ship on PyPI, so a Triton user without it would serve the session this way. Copied as model.py
beside the model.onnx; the inputs and outputs are those of the model's config, and every request of a batch goes
through one `session.run`. The config's `intra_op_thread_count` parameter sets the session's threads, as the ONNX
Runtime backend reads it."""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.inputs = [tensor["name"] for tensor in config["input"]]
        self.outputs = [tensor["name"] for tensor in config["output"]]
        options = ort.SessionOptions()
        threads = config.get("parameters", {}).get("intra_op_thread_count", {}).get("string_value")
        if threads:
            options.intra_op_num_threads = int(threads)
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.session = ort.InferenceSession(
            os.path.join(folder, "model.onnx"), options, providers=["CPUExecutionProvider"]
        )

    def execute(self, requests):
        parts = {
            name: [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for r in requests] for name in self.inputs
        }
        sizes = [len(part) for part in parts[self.inputs[0]]]
        results = self.session.run(self.outputs, {name: np.concatenate(arrays) for name, arrays in parts.items()})
        responses, start = [], 0
        for size in sizes:
            tensors = [
                pb_utils.Tensor(name, result[start : start + size]) for name, result in zip(self.outputs, results)
            ]
            responses.append(pb_utils.InferenceResponse(tensors))
            start += size
        return responses
