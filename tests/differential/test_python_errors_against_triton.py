"""What a client reads when a Python model's execute() raises, against real Triton: the same status and the same
text, `Failed to process the request(s) for model '<instance>', message: <type>: <message>` followed by the model's
frames under `At:`, innermost first (Triton's QA matches the start of it: qa/L0_backend_python/lifecycle,
wrong_model). An execute() that returns None or a list of None is not compared: Triton 2.51 never answers it, where
Nereid answers with an error saying what execute() must return."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.differential.pair import Pair, start_pair
from tests.integration.onnx_builders import write

_RAISING = '''
import triton_python_backend_utils as pb_utils


def _check(value):
    if value > 0:
        raise ValueError(f"value {value} is too large")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = float(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if value == 1:
                undefined_name  # noqa: F821 - a NameError, as Triton's qa wrong_model
            if value == 2:
                raise pb_utils.TritonModelException("the model refuses")
            _check(value)
            responses.append(pb_utils.InferenceResponse([]))
        return responses
'''


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    repository = tmp_path_factory.mktemp("repo") / "models"
    write(repository / "raising" / "1" / "model.py", _RAISING)
    write(
        repository / "raising" / "config.pbtxt",
        'backend: "python"\nmax_batch_size: 0\ninput [{ name: "IN" data_type: TYPE_FP32 dims: [1] }]\n'
        'output [{ name: "OUT" data_type: TYPE_FP32 dims: [1] }]\n',
    )
    both = start_pair(repository)
    yield both
    both.close()


def _body(value: float) -> dict[str, object]:
    return {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1], "data": [value]}]}


@pytest.mark.parametrize("value", [1.0, 2.0, 3.0], ids=["name_error", "triton_model_exception", "nested_frames"])
def test_an_exception_in_execute_reaches_the_client_in_tritons_words(pair: Pair, value: float) -> None:
    triton, nereid = pair.http("POST", "/v2/models/raising/infer", _body(value))
    assert triton.status == 500, triton.body
    assert (nereid.status, nereid.error) == (triton.status, triton.error)
    assert nereid.error.startswith("Failed to process the request(s) for model 'raising_0', message: ")


def test_over_grpc_the_same_text_comes_with_internal(pair: Pair) -> None:
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name="raising")
    tensor = request.inputs.add(name="IN", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(3.0)
    triton, nereid = pair.rpc("ModelInfer", request)
    assert triton.code == "INTERNAL"
    assert (nereid.code, nereid.details) == (triton.code, triton.details)

