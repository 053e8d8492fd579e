"""The `model.py` of a function bound with `execution="process"`: it runs inside a Python-backend worker process,
loads the pickled callables `Triton.bind` left in the version folder, and serves them through pb_utils, with the
same Request objects, result checks and error texts as the in-process instances.

Imported only by a worker (it needs the worker's `triton_python_backend_utils`).
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import sys
import traceback
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

from nereid.pytriton._calls import iterate_results
from nereid.pytriton._results import ResultRules, cast_output, check_results
from nereid.pytriton.decorators import TritonContext
from nereid.pytriton.proxy.types import Request

__all__ = ["BINDING_FILE", "TritonPythonModel"]

BINDING_FILE = "binding.pkl"  # written by nereid.pytriton.triton.write_process_model


def _load_main(path: str) -> None:
    """Callables defined in the binding program's main script: run it as `__mp_main__` (as multiprocessing's spawn
    does, so its `if __name__ == "__main__":` block stays out) and let pickle find it as `__main__`."""
    spec = importlib.util.spec_from_file_location("__mp_main__", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import the binding program's script {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["__mp_main__"] = module
    spec.loader.exec_module(module)
    sys.modules["__main__"] = module


class _Loop:
    def __init__(self) -> None:
        import asyncio

        self._loop = asyncio.new_event_loop()

    def async_loop(self) -> Any:
        return self._loop


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        folder = Path(args["model_repository"]) / args["model_version"]
        with open(folder / BINDING_FILE, "rb") as handle:
            header = pickle.load(handle)
            for entry in header["sys_path"]:
                if entry not in sys.path:
                    sys.path.append(entry)
            if header["main_file"]:
                _load_main(header["main_file"])
            payload = pickle.load(handle)
        callables = payload["callables"]
        index = int(args["model_instance_name"].rsplit("_", 1)[-1]) % len(callables)
        self.function = callables[index]
        context = TritonContext()
        context.model_configs[self.function] = payload["spec"]
        target: Any = self.function.__self__ if hasattr(self.function, "__self__") else self.function
        target.__triton_context__ = context
        self.rules = ResultRules(
            config["name"],
            payload["strict"],
            int(config.get("max_batch_size", 0)) > 0,
            {o["name"]: o["data_type"].removeprefix("TYPE_").replace("STRING", "BYTES") for o in config["output"]},
            {o["name"]: tuple(int(d) for d in o["dims"]) for o in config["output"]},
        )
        self.decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        self.inputs = [i["name"] for i in config["input"]]
        self.loop = _Loop()

    def _requests(self, requests: list[Any]) -> list[Request]:
        proxies = []
        for request in requests:
            data = {}
            for name in self.inputs:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    data[name] = tensor.as_numpy()
            proxies.append(
                Request(data=data, parameters=json.loads(request.parameters()),
                        requested_output_names=list(request.requested_output_names()))  # fmt: skip
            )
        return proxies

    def _responses(self, requests: list[Any], outputs: Any) -> list[Any]:
        check_results(self.rules, outputs, len(requests))
        responses = []
        for request, result in zip(requests, outputs, strict=True):
            wanted = request.requested_output_names()
            tensors = [
                pb_utils.Tensor(name, cast_output(value, self.rules.output_types[name]))
                for name, value in result.items()
                if name in wanted and name in self.rules.output_types
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def execute(self, requests: list[Any]) -> Any:
        try:
            results = iterate_results(self.function(self._requests(requests)), self.loop)
            if not self.decoupled:
                produced = list(results)
                if len(produced) != 1:
                    raise ValueError(
                        f"`{self.rules.model_name}` inference callable produced {len(produced)} results for a model that "
                        f"is not decoupled"
                    )
                return self._responses(requests, produced[0])
            senders = [r.get_response_sender() for r in requests]
            for result in results:
                for sender, response in zip(senders, self._responses(requests, result), strict=True):
                    sender.send(response)
            for sender in senders:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        except Exception:
            text = traceback.format_exc()
            if self.decoupled:
                for request in requests:
                    request.get_response_sender().send(
                        pb_utils.InferenceResponse(error=pb_utils.TritonError(f"Model execute error: {text}")),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )
                return None
            raise pb_utils.TritonModelException(f"Model execute error: {text}") from None
