"""What pb_utils talks to inside a worker (worker_runtime.Runtime), against the server's end of its channel: custom
metric operations made inside execute() ride on the batch's Result and any other go out at once, a call first sends
what is pending, the repository calls word the server's refusal as Triton's stub does, cancellation is asked of the
server only for requests it sent, and what needs a loaded model is refused while auto_complete_config runs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from nereid.backends.python import pb_utils
from nereid.backends.python.protocol import CALL_CANCELLED, CALL_LOAD, INVALID_ARG_CODE, Call, CallReply, Log, Metrics
from nereid.backends.python.worker_runtime import ModelWorkerHooks, Runtime
from tests.unit.backends.python.worker_fakes import ServerEnd

OP: Any = (1, 2, 3.0)  # a metric operation: (operation, metric id, value)


@pytest.fixture()
def server() -> Iterator[ServerEnd]:
    end = ServerEnd()
    yield end
    end.close()


def _answer(server: ServerEnd, reply: Callable[[Call], CallReply], seen: list[Any]) -> threading.Thread:
    """A thread that keeps what the worker sends until a Call, and answers that with `reply`."""

    def run() -> None:
        while True:
            message = server.read()
            seen.append(message)
            if isinstance(message, Call):
                server.send(reply(message))
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _hooks() -> ModelWorkerHooks:
    def refuse(*args: Any) -> Any:
        raise AssertionError("not called")

    return ModelWorkerHooks("m_0", bls=refuse, bls_async=refuse, send_response=refuse)


def test_metric_operations_inside_execute_wait_for_the_result_and_any_other_go_out_at_once(server: ServerEnd) -> None:
    runtime = Runtime(server.channel, "")
    runtime.metric_op(OP)  # outside execute (initialize, a thread of the model's): at once
    assert server.read() == Metrics((OP,))
    runtime.in_execute = True
    runtime.metric_op(OP)
    runtime.metric_op(OP)
    assert server.nothing_sent()  # held for the batch's Result
    other = threading.Thread(target=runtime.metric_op, args=((4, 5, 6.0),))
    other.start()
    other.join()
    assert server.read() == Metrics((OP, OP, (4, 5, 6.0)))  # a thread's operation sends what was held with it
    runtime.metric_op(OP)
    assert runtime.take_ops() == (OP,) and runtime.take_ops() == ()


def test_a_call_sends_the_pending_operations_first_and_returns_the_servers_answer(server: ServerEnd) -> None:
    runtime = Runtime(server.channel, "")
    runtime.in_execute = True
    runtime.metric_op(OP)
    seen: list[Any] = []
    thread = _answer(server, lambda call: CallReply(call.call_id, None, {"value": 42}), seen)
    assert runtime.call("metric_value", 7) == {"value": 42}
    thread.join(5)
    assert seen[0] == Metrics((OP,)) and isinstance(seen[1], Call) and (seen[1].kind, seen[1].payload) == ("metric_value", 7)


def test_repository_calls_word_the_servers_refusal_as_tritons_stub_does(server: ServerEnd) -> None:
    runtime = Runtime(server.channel, "")
    with pytest.raises(pb_utils.TritonModelException, match="cannot load a model while auto_complete_config runs"):
        runtime.repository_call(CALL_LOAD, ("other", "", {}), "load")
    runtime.attach(_hooks())
    seen: list[Any] = []
    thread = _answer(server, lambda call: CallReply(call.call_id, (INVALID_ARG_CODE, "no such model"), None), seen)
    with pytest.raises(pb_utils.TritonModelException) as refused:
        runtime.repository_call(CALL_LOAD, ("other", "", {}), "load")
    thread.join(5)
    assert str(refused.value) == (
        "Failed to load model: Failed to process the request for model 'm_0', message: no such model"
    )
    assert seen[-1].kind == CALL_LOAD and seen[-1].payload == ("other", "", {})


def test_cancellation_is_asked_of_the_server_only_for_a_request_it_sent(server: ServerEnd) -> None:
    runtime = Runtime(server.channel, "")
    own = pb_utils.InferenceRequest(model_name="x", inputs=[pb_utils.Tensor("A", np.zeros(1, np.float32))])
    assert runtime.is_cancelled(own) is False and server.nothing_sent()
    received = pb_utils.InferenceRequest._received(("r", 0, 0, 0, {}, None, ()), b"", (), 9, 2)
    seen: list[Any] = []
    thread = _answer(server, lambda call: CallReply(call.call_id, None, True), seen)
    assert runtime.is_cancelled(received) is True
    thread.join(5)
    assert (seen[-1].kind, seen[-1].payload) == (CALL_CANCELLED, (9, 2))


def test_what_needs_a_loaded_model_is_refused_before_one_is_attached_and_logs_go_out(server: ServerEnd) -> None:
    runtime = Runtime(server.channel, "")
    request = pb_utils.InferenceRequest(model_name="x", inputs=[])
    with pytest.raises(pb_utils.TritonModelException, match="not available while auto_complete_config runs"):
        runtime.bls(request, False)
    with pytest.raises(pb_utils.TritonModelException, match="only for requests the model received"):
        runtime.send_response(request, None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    runtime.log(2, "hello", "model.py", 12)
    assert server.read() == Log(2, "hello", "model.py", 12)
