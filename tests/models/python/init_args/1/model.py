"""Returns the initialize() arguments as JSON, with what the model config helpers say about them."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        config = json.loads(args["model_config"])
        self.helpers = {
            "input": pb_utils.get_input_config_by_name(config, "IN"),
            "output": pb_utils.get_output_config_by_name(config, "ARGS"),
            "missing": pb_utils.get_input_config_by_name(config, "NOPE"),
            "decoupled": pb_utils.using_decoupled_model_transaction_policy(config),
            "fp32": pb_utils.triton_string_to_numpy("TYPE_FP32").__name__,
            "code_of_int64": pb_utils.numpy_to_triton_type(np.int64),
            "type_of_13": pb_utils.triton_to_numpy_type(13).__name__,
            "error_codes": [int(getattr(pb_utils.TritonError, n)) for n in ("UNKNOWN", "INTERNAL", "INVALID_ARG")],
            "flags": [pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL],
        }

    def execute(self, requests):
        text = json.dumps({"args": self.args, "helpers": self.helpers}).encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", np.array([text], dtype=object))]) for _ in requests]
