"""Differential tests: pb_utils takes strings as real Triton 2.51's python_backend takes them.

Triton's pybind11 layer converts str, numpy.str_, bytes, numpy.bytes_ and bytearray to a std::string wherever its
API wants one; python_backend's own `bls` example passes a model name it read out of a BYTES tensor. One model runs
every string-taking call of pb_utils with each of these forms on both servers and reports what happened; the
reports must agree, and the example's flow must give the same outputs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.differential.pair import Pair, start_pair

pytestmark = pytest.mark.differential

_TARGET_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

_TARGET = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", x * 2), pb_utils.Tensor("OUTPUT1", x + 1)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

# Like python_backend's examples/bls/sync_model.py: the target's name comes in a BYTES tensor, `.as_numpy()[0]`.
_BLS_CONFIG = """
name: "bls_by_name"
backend: "python"
max_batch_size: 0
input [
  { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

_BLS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            bls = pb_utils.InferenceRequest(
                model_name=model_name, requested_output_names=["OUTPUT0", "OUTPUT1"], inputs=[x]
            )
            answer = bls.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=answer.output_tensors()))
        return responses
"""

_PROBE_CONFIG = """
name: "string_forms"
backend: "python"
max_batch_size: 0
input [ { name: "DUMMY" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

# Every call of pb_utils that takes a string, with each form of string; "ok:<result>" or "error:<type>". (Forms
# that Triton refuses by raising inside its C++ layer, such as memoryview, are left out: some of those calls abort
# Triton's stub.)
_PROBE = '''
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FORMS = {
    "str": str,
    "bytes": lambda s: s.encode(),
    "numpy_bytes": lambda s: np.bytes_(s.encode()),
    "numpy_str": np.str_,
    "bytearray": lambda s: bytearray(s.encode()),
}
LOADME_CONFIG = json.dumps({
    "backend": "python", "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
               {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [-1]}],
})


def attempt(call):
    try:
        return "ok:" + repr(call())
    except Exception as exc:
        return "error:" + type(exc).__name__


def outputs(response):
    if response.has_error():
        return "response-error:" + response.error().message()
    return sorted((t.name(), t.as_numpy().tolist()) for t in response.output_tensors())


def bls(model_name="target", input_name="INPUT0", requested=("OUTPUT0",)):
    x = pb_utils.Tensor(input_name, np.array([1.0, 2.0], np.float32))
    request = pb_utils.InferenceRequest(model_name=model_name, inputs=[x], requested_output_names=list(requested))
    return outputs(request.exec())


def request(**kwargs):
    return pb_utils.InferenceRequest(model_name="target", inputs=[], requested_output_names=[], **kwargs)


def load(name, **kwargs):
    pb_utils.load_model(name, **kwargs)  # a model already loaded is loaded again (Triton reloads it in place)
    return pb_utils.is_model_ready("loadme")


def unload(name):
    pb_utils.unload_model(name)
    # Real Triton 2.51 returns before the unload has finished, and a load that overlaps it can crash the server
    # (SIGSEGV, seen on a loaded machine): let the unload end before the next form's probes load again.
    time.sleep(1.0)
    return pb_utils.is_model_ready("loadme")


def add_input(name):
    config = pb_utils.ModelConfig(json.dumps({"name": "probe", "max_batch_size": 0, "input": [], "output": []}))
    config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [1]})
    return json.dumps(config.as_dict()["input"])  # as the server reads an auto-completed config back


def checks(f, form, own_request):
    zeros = np.zeros(1, np.float32)
    model_py = open(__file__.replace("string_forms", "loadme"), "rb").read()
    response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", zeros)])
    return {
        "tensor_name": lambda: pb_utils.Tensor(f("OUT"), zeros).name(),
        "dlpack_name": lambda: pb_utils.Tensor.from_dlpack(f("OUT"), pb_utils.Tensor("x", zeros).to_dlpack()).name(),
        "error_message": lambda: pb_utils.TritonError(f("boom")).message(),
        "error_in_response": lambda: pb_utils.InferenceResponse(error=pb_utils.TritonError(f("boom"))).error().message(),
        "request_id": lambda: request(request_id=f("rid")).request_id(),
        "correlation_id": lambda: request(correlation_id=f("c1")).correlation_id(),
        "parameter_key": lambda: request(parameters={f("k"): "v"}).parameters(),
        "parameter_value": lambda: request(parameters={"k": f("v")}).parameters(),
        "bls_model_name": lambda: bls(model_name=f("target")),
        "bls_requested_output": lambda: bls(requested=[f("OUTPUT1")]),
        "bls_input_name": lambda: bls(input_name=f("INPUT0")),
        "input_by_name": lambda: pb_utils.get_input_tensor_by_name(own_request, f("DUMMY")) is not None,
        "logger": lambda: pb_utils.Logger.log_info(f(f"string form {form} logged")),
        "logger_level": lambda: pb_utils.Logger.log(f(f"string form {form} logged at a level"), pb_utils.Logger.INFO),
        "logger_warn": lambda: pb_utils.Logger.log_warn(f(f"string form {form} warned")),
        "logger_error": lambda: pb_utils.Logger.log_error(f(f"string form {form} errored")),
        "logger_verbose": lambda: pb_utils.Logger.log_verbose(f(f"string form {form} verbose")),
        "output_by_name": lambda: pb_utils.get_output_tensor_by_name(response, f("OUT")) is not None,
        "input_config_by_name": lambda: pb_utils.get_input_config_by_name(CONFIG, f("DUMMY")) is not None,
        "output_config_by_name": lambda: pb_utils.get_output_config_by_name(CONFIG, f("REPORT")) is not None,
        "string_to_numpy": lambda: pb_utils.triton_string_to_numpy(f("TYPE_FP32")).__name__,
        "model_config_add_input": lambda: add_input(f("IN")),
        "is_model_ready": lambda: pb_utils.is_model_ready(f("target")),
        "is_model_ready_version": lambda: pb_utils.is_model_ready("target", f("1")),
        "metric_family": lambda: type(
            pb_utils.MetricFamily(f(f"string_forms_{form}"), f("a family"), pb_utils.MetricFamily.COUNTER)
        ).__name__,
        "metric_label_key": lambda: type(
            pb_utils.MetricFamily(f"string_label_keys_{form}", "labels", pb_utils.MetricFamily.COUNTER).Metric(
                labels={f("a"): "b"}
            )
        ).__name__,
        "metric_label_value": lambda: type(
            pb_utils.MetricFamily(f"string_labels_{form}", "labels", pb_utils.MetricFamily.COUNTER).Metric(
                labels={"a": f("b")}
            )
        ).__name__,
        "load_model": lambda: load(f("loadme")),
        "load_model_config": lambda: load("loadme", config=f(LOADME_CONFIG)),
        "load_model_file_key": lambda: load("loadme", config=LOADME_CONFIG, files={f("file:1/model.py"): model_py}),
        "unload_model": lambda: unload(f("loadme")),  # last: the next form starts with the model unloaded
    }


CONFIG = {}


class TritonPythonModel:
    def initialize(self, args):
        CONFIG.update(json.loads(args["model_config"]))

    def execute(self, requests):
        responses = []
        for own_request in requests:
            report = {}
            for form, f in FORMS.items():
                report[form] = {name: attempt(call) for name, call in checks(f, form, own_request).items()}
            out = np.array([json.dumps(report).encode()], dtype=object)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("REPORT", out)]))
        return responses
'''

_FORMS = ["str", "bytes", "numpy_bytes", "numpy_str", "bytearray"]

# A BYTES output built from each form of string, in an object array or in the array numpy makes of it.
_OUTPUTS_CONFIG = """
name: "string_outputs"
backend: "python"
max_batch_size: 0
input [ { name: "FORM" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

_OUTPUTS = """
import numpy as np
import triton_python_backend_utils as pb_utils

FORMS = {"str": "ab", "bytes": b"ab", "numpy_bytes": np.bytes_(b"ab"), "numpy_str": np.str_("ab"), "int": 7}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            form, array = [x.decode() for x in pb_utils.get_input_tensor_by_name(request, "FORM").as_numpy()]
            value = FORMS[form]
            data = np.array([value], dtype=np.object_) if array == "object" else np.array([value])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)]))
        return responses
"""


def _write(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(code)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    repo = tmp_path_factory.mktemp("pb_strings") / "repo"
    repo.mkdir()
    _write(repo, "target", _TARGET_CONFIG.format(name="target"), _TARGET)
    _write(repo, "loadme", _TARGET_CONFIG.format(name="loadme"), _TARGET)  # loaded and unloaded by the probe
    _write(repo, "bls_by_name", _BLS_CONFIG, _BLS)
    _write(repo, "string_forms", _PROBE_CONFIG, _PROBE)
    _write(repo, "string_outputs", _OUTPUTS_CONFIG, _OUTPUTS)
    models = ("target", "bls_by_name", "string_forms", "string_outputs")
    flags = ["--model-control-mode=explicit", *[f"--load-model={m}" for m in models]]
    both = start_pair(repo, *flags)
    yield both
    both.close()


def _infer(pair: Pair, model: str, inputs: dict[str, tuple[np.ndarray, str]]) -> dict[str, Any]:
    results = {}
    for label, server in pair.servers():
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            tensors = []
            for name, (array, datatype) in inputs.items():
                tensor = httpclient.InferInput(name, list(array.shape), datatype)
                tensor.set_data_from_numpy(array)
                tensors.append(tensor)
            results[label] = client.infer(model, tensors)
        finally:
            client.close()
    return results


@pytest.mark.parametrize("target", ["target", "loadme"])
def test_the_bls_example_with_a_model_name_read_from_a_bytes_tensor_runs_alike(pair: Pair, target: str) -> None:
    if target == "loadme":  # a model loaded on request: the name from the tensor must find it too
        for _, server in pair.servers():
            client = httpclient.InferenceServerClient(server.http_url)
            client.load_model("loadme")
            client.close()
    try:
        inputs = {
            "MODEL_NAME": (np.array([target.encode()], dtype=np.object_), "BYTES"),
            "INPUT0": (np.array([0.5, -1.0, 3.0], np.float32), "FP32"),
        }
        results = _infer(pair, "bls_by_name", inputs)
        for name in ("OUTPUT0", "OUTPUT1"):
            np.testing.assert_array_equal(results["nereid"].as_numpy(name), results["triton"].as_numpy(name))
        np.testing.assert_array_equal(results["nereid"].as_numpy("OUTPUT0"), [1.0, -2.0, 6.0])
    finally:
        if target == "loadme":
            for _, server in pair.servers():
                client = httpclient.InferenceServerClient(server.http_url)
                client.unload_model("loadme")
                client.close()


@pytest.fixture(scope="module")
def reports(pair: Pair) -> dict[str, dict[str, dict[str, str]]]:
    results = _infer(pair, "string_forms", {"DUMMY": (np.array([b"x"], dtype=np.object_), "BYTES")})
    return {label: json.loads(result.as_numpy("REPORT")[0]) for label, result in results.items()}


_CHECKS = [
    "tensor_name",
    "dlpack_name",
    "error_message",
    "error_in_response",
    "request_id",
    "correlation_id",
    "parameter_key",
    "parameter_value",
    "bls_model_name",
    "bls_requested_output",
    "bls_input_name",
    "input_by_name",
    "logger",
    "logger_level",
    "logger_warn",
    "logger_error",
    "logger_verbose",
    "output_by_name",
    "input_config_by_name",
    "output_config_by_name",
    "string_to_numpy",
    "model_config_add_input",
    "is_model_ready",
    "is_model_ready_version",
    "metric_family",
    "metric_label_key",
    "metric_label_value",
    "load_model",
    "load_model_config",
    "load_model_file_key",
    "unload_model",
]


@pytest.mark.parametrize("form", _FORMS)
@pytest.mark.parametrize("check", _CHECKS)
def test_each_string_taking_call_accepts_or_refuses_each_form_alike(reports: Any, form: str, check: str) -> None:
    triton, nereid = reports["triton"][form][check], reports["nereid"][form][check]
    if triton.startswith("ok:"):
        assert nereid == triton
    else:
        assert nereid.startswith("error:"), (triton, nereid)


def test_the_forms_the_issue_names_are_accepted_for_names(reports: Any) -> None:
    """The case the issue reports, and the rest of the names: bytes and numpy strings are text on both servers."""
    for label in ("triton", "nereid"):  # every call was probed with every form on both servers
        assert sorted(reports[label]) == sorted(_FORMS)
        assert all(sorted(reports[label][form]) == sorted(_CHECKS) for form in _FORMS), label
    for form in _FORMS:
        for check in ("tensor_name", "request_id", "bls_model_name", "bls_requested_output", "is_model_ready", "load_model"):
            assert reports["triton"][form][check].startswith("ok:"), (form, check)
            assert reports["nereid"][form][check] == reports["triton"][form][check], (form, check)
        assert reports["nereid"][form]["tensor_name"] == "ok:'OUT'"
        assert reports["nereid"][form]["bls_model_name"] == "ok:[('OUTPUT0', [2.0, 4.0])]"


def _log_lines(pair: Pair, needle: str) -> dict[str, list[str]]:
    deadline = time.monotonic() + 10
    while True:
        lines = {
            label: [line.split("] ", 1)[1].strip().strip('"') for line in server.log().splitlines() if needle in line]
            for label, server in pair.servers()
        }
        if all(lines.values()) or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def test_log_messages_given_as_bytes_are_logged_as_text_alike(pair: Pair, reports: Any) -> None:
    for form in _FORMS:
        lines = _log_lines(pair, f"string form {form} logged")
        # Triton quotes the message; the text inside is the same.
        assert lines["nereid"] == lines["triton"] == [f"string form {form} logged", f"string form {form} logged at a level"]


@pytest.mark.parametrize("array", ["object", "numpy"])
@pytest.mark.parametrize("form", ["str", "bytes", "numpy_bytes", "numpy_str", "int"])
def test_bytes_outputs_made_of_each_form_of_string_reach_the_client_alike(pair: Pair, form: str, array: str) -> None:
    """What the client reads from a BYTES output built of str, bytes, numpy.bytes_, numpy.str_ or a number, in an
    object array or in numpy's own array of it. Two differences are deliberate, and asserted as such."""
    answers: dict[str, Any] = {}
    for label, server in pair.servers():
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            tensor = httpclient.InferInput("FORM", [2], "BYTES")
            tensor.set_data_from_numpy(np.array([form.encode(), array.encode()], dtype=np.object_))
            answers[label] = client.infer("string_outputs", [tensor]).as_numpy("OUT").tolist()
        except Exception as exc:  # tritonclient's InferenceServerException
            answers[label] = str(exc)
        finally:
            client.close()
    if array == "object" and form == "numpy_bytes":
        # Triton's serialize_byte_tensor writes str() of an element that is not exactly bytes: "b'ab'".
        assert answers == {"triton": [b"b'ab'"], "nereid": [b"ab"]}
    elif array == "numpy" and form in ("str", "numpy_str"):
        # numpy's unicode arrays: Triton refuses them; Nereid sends their UTF-8 text.
        assert "NumPy dtype is not supported." in answers["triton"] and answers["nereid"] == [b"ab"]
    else:
        assert answers["nereid"] == answers["triton"]
        assert answers["triton"] == ([7] if (form, array) == ("int", "numpy") else [b"7"] if form == "int" else [b"ab"])
