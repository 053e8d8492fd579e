"""The commands of the BLS test drivers, as JSON, and their results as JSON (shared by bls_driver and bls_async).

    {"op": "infer", "model": "py_add_sub", "version": -1, "inputs": [{"name", "datatype", "shape", "data"}],
     "outputs": ["OUTPUT0"], "decoupled": false, "timeout": 0, "request_id": "", "parameters": {},
     "mode": "sync" | "thread" | "asyncio"}  (asyncio: async_exec in asyncio.run)
    {"op": "load", "model": "m", "config": "", "files": {"file:1/model.py": "text"}}
    {"op": "unload", "model": "m", "unload_dependents": false}
    {"op": "ready", "model": "m", "version": ""}
    {"op": "steps", "steps": [command, ...]}

An infer command answers {"responses": [{"error": null | {"message", "code"}, "outputs": {name: {"dtype",
"shape", "data"}}}]}; a call that raises answers {"exception": "TypeName: message"}.
"""

import asyncio
import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

DTYPES = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
CODES = ("UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS", "CANCELLED")


def code_name(code):
    for name in CODES:
        if code == getattr(pb_utils.TritonError, name):
            return name
    return str(code)


def make_tensor(spec):
    if spec["datatype"] == "BYTES":
        array = np.array([str(v).encode() for v in spec["data"]], dtype=np.object_)
    else:
        array = np.array(spec["data"], dtype=DTYPES[spec["datatype"]])
    return pb_utils.Tensor(spec["name"], array.reshape(spec["shape"]))


def describe_tensor(tensor):
    array = tensor.as_numpy()
    if array.dtype == np.object_:
        data = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
    else:
        data = array.reshape(-1).tolist()
    return {"dtype": str(array.dtype), "shape": list(array.shape), "data": data}


def describe_response(response):
    if response.has_error():
        error = response.error()
        return {"error": {"message": error.message(), "code": code_name(error.code())}, "outputs": {}}
    outputs = {t.name(): describe_tensor(t) for t in response.output_tensors()}
    return {"error": None, "outputs": dict(sorted(outputs.items()))}


# How a command may spell the names of its request, as models do: bytes read out of a BYTES tensor, numpy strings.
NAME_FORMS = {
    "str": str,
    "bytes": lambda name: np.array([name.encode()], dtype=np.object_)[0],
    "numpy_bytes": lambda name: np.bytes_(name.encode()),
    "numpy_str": np.str_,
    "bytearray": lambda name: bytearray(name.encode()),
}


def build_request(command):
    spell = NAME_FORMS[command.get("names_as", "str")]
    kwargs = {
        "model_name": spell(command["model"]),
        "requested_output_names": [spell(name) for name in command.get("outputs", [])],
        "inputs": [make_tensor(spec) for spec in command.get("inputs", [])],
    }
    for key, name in (("version", "model_version"), ("timeout", "timeout"), ("request_id", "request_id"),
                      ("parameters", "parameters"), ("correlation_id", "correlation_id"), ("flags", "flags")):
        if key in command:
            kwargs[name] = command[key]
    return pb_utils.InferenceRequest(**kwargs)


def collect(result, decoupled, cancel_after=None):
    if decoupled and cancel_after is not None:
        # ResponseIterator.cancel() after `cancel_after` responses, and once more after the last (a no-op then).
        responses = []
        for response in result:
            responses.append(response)
            if len(responses) == cancel_after:
                result.cancel()
        result.cancel()
    else:
        responses = list(result) if decoupled else [result]
    return {"responses": [describe_response(r) for r in responses]}


def run_infer(command):
    request = build_request(command)
    decoupled = bool(command.get("decoupled", False))
    mode = command.get("mode", "sync")
    if mode == "sync":
        return collect(request.exec(decoupled=decoupled), decoupled, command.get("cancel_after"))
    if mode == "asyncio":  # async_exec from an event loop of the model's own, in a plain execute()

        async def call():
            return await request.async_exec(decoupled=decoupled)

        return collect(asyncio.run(call()), decoupled, command.get("cancel_after"))
    if mode == "thread":
        box = {}

        def work():
            try:
                box["result"] = collect(request.exec(decoupled=decoupled), decoupled)
            except Exception as exc:
                box["result"] = {"exception": f"{type(exc).__name__}: {exc}"}

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
        return box["result"]
    raise ValueError(f"unknown mode {mode!r}")


def run(command):
    op = command["op"]
    try:
        if op == "infer":
            return run_infer(command)
        if op == "load":
            files = {k: v.encode() for k, v in (command.get("files") or {}).items()} or None
            pb_utils.load_model(model_name=command["model"], config=command.get("config", ""), files=files)
            return {"loaded": True}
        if op == "unload":
            pb_utils.unload_model(command["model"], unload_dependents=command.get("unload_dependents", False))
            return {"unloaded": True}
        if op == "ready":
            return {"ready": bool(pb_utils.is_model_ready(command["model"], command.get("version", "")))}
        if op == "steps":
            return {"steps": [run(step) for step in command["steps"]]}
        raise ValueError(f"unknown op {op!r}")
    except Exception as exc:
        return {"exception": f"{type(exc).__name__}: {exc}"}


def answer(result):
    text = json.dumps(result, sort_keys=True)
    return pb_utils.InferenceResponse([pb_utils.Tensor("RESULT", np.array([text.encode()], dtype=np.object_))])


def command_of(request):
    return json.loads(pb_utils.get_input_tensor_by_name(request, "COMMAND").as_numpy()[0])
