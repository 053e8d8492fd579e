"""An XGBoost binary classifier as a Python-backend model, for real Triton in the benchmarks (its FIL backend does not
ship on PyPI): the route a Triton user takes without it, one XGBoost call per batch of requests. Copied as model.py
beside xgboost.json; input `input__0`, output `output__0` with both classes' probabilities, as the FIL backend's
`predict_proba` gives them."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils
import xgboost


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.booster = xgboost.Booster(model_file=os.path.join(folder, "xgboost.json"))
        self.booster.set_param({"nthread": 1})

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "input__0").as_numpy() for r in requests]
        p = self.booster.inplace_predict(np.concatenate(arrays)).astype(np.float32)
        proba = np.stack([1.0 - p, p], axis=1)
        responses, offset = [], 0
        for array in arrays:
            part = proba[offset : offset + len(array)]
            offset += len(array)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("output__0", part)]))
        return responses
