"""The model's side of a Python-backend instance (model_worker.ModelWorker) in this process, spoken to as the server
speaks to it: a batch's responses come back through the output arena with the outputs the client asked for, what a
model gets wrong comes back as an error naming the instance and the model's line, a decoupled model's responses go
out as it sends them, and a shutdown runs finalize() before the worker says it is done."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nereid.backends.python import model_worker
from nereid.backends.python.model_worker import ModelWorker
from nereid.backends.python.protocol import (
    INTERNAL_CODE,
    INVALID_ARG_CODE,
    RESPONSE_COMPLETE_FINAL,
    Done,
    Execute,
    IsReady,
    Log,
    ReadyState,
    Response,
    Result,
    Shutdown,
)
from tests.unit.backends.python.worker_fakes import ADD_SUB_CONFIG, ServerEnd, model_args, write_model

ADD_SUB = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(outputs, parameters={"rid": request.request_id()}))
        return responses
"""

A = np.arange(4, dtype=np.float32).reshape(1, 4)
B = np.full((1, 4), 2, dtype=np.float32)


def _load(worker: ModelWorker, tmp_path: Path, source: str, config: dict[str, Any] | None = None) -> None:
    model_file, version_dir = write_model(tmp_path, source)
    worker.initialize(model_args(config), model_file, version_dir)


def _execute(server: ServerEnd, worker: ModelWorker, *requests: tuple[str, tuple[str, ...] | None]) -> Result:
    """Run one batch of add/sub requests ((id, requested outputs) each) and read back its Result."""
    wire = [server.wire_request(rid, {"INPUT0": A, "INPUT1": B}, requested) for rid, requested in requests]
    worker.execute(Execute(7, server.inputs.size, wire, 0))
    result = server.read()
    assert isinstance(result, Result) and result.seq == 7
    return result


def test_a_batchs_responses_come_back_in_the_output_arena_with_the_time_execute_took(
    served_worker: tuple[ServerEnd, ModelWorker], tmp_path: Path
) -> None:
    server, worker = served_worker
    _load(worker, tmp_path, ADD_SUB)
    result = _execute(server, worker, ("r1", None), ("r2", None))
    assert result.batch_error is None and result.responses is not None and len(result.responses) == 2
    for rid, (error, parameters, metas) in zip(("r1", "r2"), result.responses, strict=True):
        assert error is None and parameters == {"rid": rid}
        assert [meta[0] for meta in metas] == ["OUTPUT0", "OUTPUT1"]
        np.testing.assert_array_equal(server.output(metas[0]), A + B)
        np.testing.assert_array_equal(server.output(metas[1]), A - B)
    t1, t2 = result.times
    assert 0 < t1 <= t2


def test_only_the_outputs_the_client_asked_for_are_sent(
    served_worker: tuple[ServerEnd, ModelWorker], tmp_path: Path
) -> None:
    server, worker = served_worker
    _load(worker, tmp_path, ADD_SUB)
    result = _execute(server, worker, ("r1", ("OUTPUT1",)))
    assert result.responses is not None
    ((error, _, metas),) = result.responses
    assert error is None and [meta[0] for meta in metas] == ["OUTPUT1"]
    np.testing.assert_array_equal(server.output(metas[0]), A - B)


def test_an_exception_in_execute_is_the_batchs_error_naming_the_instance_and_the_models_line(
    served_worker: tuple[ServerEnd, ModelWorker], tmp_path: Path
) -> None:
    server, worker = served_worker
    _load(worker, tmp_path, "class TritonPythonModel:\n    def execute(self, requests):\n        raise ValueError('boom')\n")
    result = _execute(server, worker, ("r1", None))
    assert result.responses is None and result.batch_error is not None
    code, message = result.batch_error
    assert code == INTERNAL_CODE
    assert message.startswith("Failed to process the request(s) for model 'm_0', message: ValueError: boom")
    # The model's own frame, and none of the worker's.
    assert f"{tmp_path / 'm' / '1' / 'model.py'}(3): execute" in message and "model_worker.py" not in message


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("return [pb_utils.InferenceResponse([])]", "execute() returned 1 responses for 2 requests"),
        ("return None", "execute() returned None; it must return a list of 2 InferenceResponse objects"),
        ("return 3", "execute() returned a int; it must return a list of 2 InferenceResponse objects"),
    ],
    ids=["too-few", "none", "not-a-list"],
)
def test_a_wrong_answer_from_execute_is_refused_with_what_was_expected(
    served_worker: tuple[ServerEnd, ModelWorker], tmp_path: Path, body: str, expected: str
) -> None:
    server, worker = served_worker
    source = f"import triton_python_backend_utils as pb_utils\nclass TritonPythonModel:\n    def execute(self, requests):\n        {body}\n"
    _load(worker, tmp_path, source)
    result = _execute(server, worker, ("r1", None), ("r2", None))
    assert result.batch_error is not None and result.batch_error[0] == INTERNAL_CODE
    assert expected in result.batch_error[1] and "instance 'm_0'" in result.batch_error[1]


def test_an_error_response_travels_with_its_code_and_message_beside_a_good_one(
    served_worker: tuple[ServerEnd, ModelWorker], tmp_path: Path
) -> None:
    server, worker = served_worker
    source = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            bad = pb_utils.TritonError("bad input", pb_utils.TritonError.INVALID_ARG)
            return [pb_utils.InferenceResponse(error=bad), pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", requests[1].inputs()[0].as_numpy())])]
    """
    _load(worker, tmp_path, source)
    result = _execute(server, worker, ("r1", None), ("r2", None))
    assert result.batch_error is None and result.responses is not None
    (error, _, metas), (good_error, _, good_metas) = result.responses
    assert error == (INVALID_ARG_CODE, "bad input") and metas == ()
    assert good_error is None
    np.testing.assert_array_equal(server.output(good_metas[0]), A)


DECOUPLED = dict(ADD_SUB_CONFIG, model_transaction_policy={"decoupled": True})


def test_a_decoupled_models_responses_go_out_as_it_sends_them_then_its_final_flag(
    served_worker: tuple[ServerEnd, ModelWorker], tmp_path: Path
) -> None:
    server, worker = served_worker
    source = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                for i in range(2):
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.full(2, i, np.float32))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
    """
    _load(worker, tmp_path, source, DECOUPLED)
    worker.execute(Execute(3, server.inputs.size, [server.wire_request("r1", {"INPUT0": A, "INPUT1": B})], 0))
    sent = [server.read() for _ in range(4)]
    responses, result = sent[:3], sent[3]
    assert all(isinstance(r, Response) and (r.seq, r.request_index) == (3, 0) for r in responses)
    assert [r.flags for r in responses] == [0, 0, RESPONSE_COMPLETE_FINAL]  # type: ignore[union-attr]
    for i, response in enumerate(responses[:2]):
        assert response.error is None  # type: ignore[union-attr]
        np.testing.assert_array_equal(server.output(response.outputs[0]), np.full(2, i, np.float32))  # type: ignore[union-attr]
    assert responses[2].outputs is None  # type: ignore[union-attr]
    assert isinstance(result, Result) and result.batch_error is None and result.responses is None


def test_a_decoupled_model_that_returns_responses_is_told_to_return_none(
    served_worker: tuple[ServerEnd, ModelWorker], tmp_path: Path
) -> None:
    server, worker = served_worker
    _load(worker, tmp_path, ADD_SUB, DECOUPLED)
    worker.execute(Execute(7, server.inputs.size, [server.wire_request("r1", {"INPUT0": A, "INPUT1": B}, None)], 0))
    expected = (
        "Failed to process the request(s) for model 'm_0', message: Python model 'm_0' is using the decoupled mode and "
        "the execute function must return None."
    )  # Triton's words; its stub logs them too (the requests of a decoupled batch may be answered already)
    log, result = server.read(), server.read()
    assert isinstance(log, Log) and (log.level, log.message) == (2, expected)
    assert isinstance(result, Result) and result.batch_error == (INTERNAL_CODE, expected)


class _Exited(Exception):
    pass


def _exit(code: int) -> None:
    raise _Exited(code)


FINALIZING = """
import os

class TritonPythonModel:
    def initialize(self, args):
        self.folder = os.path.dirname(__file__)

    def execute(self, requests):
        return []

    def is_ready(self):
        raise RuntimeError("not yet")

    def finalize(self):
        open(os.path.join(self.folder, "finalized"), "w").close()
        {finalize_error}
"""


@pytest.mark.parametrize("fails", [False, True], ids=["clean", "finalize-raises"])
def test_a_shutdown_runs_finalize_then_says_done_with_its_error(
    served_worker: tuple[ServerEnd, ModelWorker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    server, worker = served_worker
    monkeypatch.setattr(model_worker, "exit_now", _exit)
    _load(worker, tmp_path, FINALIZING.format(finalize_error="raise OSError('disk gone')" if fails else ""))
    server.send(IsReady(5))
    server.send(Shutdown())
    with pytest.raises(_Exited):
        worker.serve()
    assert server.read() == ReadyState(5, False)  # is_ready() raised: not ready
    done = server.read()
    assert isinstance(done, Done) and (tmp_path / "m" / "1" / "finalized").exists()
    if fails:
        assert done.error is not None and done.error[0] == INTERNAL_CODE
        assert done.error[1].startswith("[model 'm' version 1] instance 'm_0': finalize() raised OSError: disk gone")
    else:
        assert done.error is None


def test_a_model_file_without_its_class_or_execute_fails_to_initialize_with_its_name(
    served_worker: tuple[ServerEnd, ModelWorker], tmp_path: Path
) -> None:
    _, worker = served_worker
    with pytest.raises(AttributeError, match="defines no class TritonPythonModel"):
        _load(worker, tmp_path, "x = 1\n")
    with pytest.raises(AttributeError, match="TritonPythonModel has no execute"):
        _load(worker, tmp_path, "class TritonPythonModel:\n    pass\n")
