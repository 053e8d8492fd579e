"""The worker's side of BLS (bls_client) through pb_utils, with the server's end played by a thread: a request
goes out with its inputs in the output arena and its fields as the model set them, its response comes back copied
out of the input arena (and the server is told it may reuse the space), a decoupled call iterates its responses,
and what the server refuses, a closed channel and a malformed request each give the model an error it can read."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from nereid.backends.python import pb_utils
from nereid.backends.python.model_worker import ModelWorker
from nereid.backends.python.protocol import INVALID_ARG_CODE, BlsRequest, BlsResponse, CallReply, Message
from tests.unit.backends.python.worker_fakes import ServerEnd

X = np.array([[1.5, 2.5, 3.5]], dtype=np.float32)


def _request(**overrides: object) -> pb_utils.InferenceRequest:
    fields: dict[str, object] = {
        "model_name": "callee",
        "inputs": [pb_utils.Tensor("X", X)],
        "requested_output_names": ["Y"],
        "request_id": "bls-1",
        "model_version": 2,
        "parameters": {"mode": "fast", "n": 3},
    }
    fields.update(overrides)
    return pb_utils.InferenceRequest(**fields)  # type: ignore[arg-type]


class _Server(threading.Thread):
    """Reads one BlsRequest and sends what `answer` makes of it."""

    def __init__(self, server: ServerEnd, answer: Callable[[BlsRequest], list[Message]]) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.answer = answer
        self.request: BlsRequest | None = None
        self.inputs: dict[str, np.ndarray] = {}

    def run(self) -> None:
        request = self.server.read()
        assert isinstance(request, BlsRequest)
        self.request = request
        self.inputs = {meta[0]: self.server.output(meta) for meta in request.inputs}
        for message in self.answer(request):
            self.server.send(message)


def _outputs(server: ServerEnd, request: BlsRequest, *values: float, final: bool = True, reply_no: int = 1) -> BlsResponse:
    metas = tuple(server.put("Y", np.full((1, 3), v, np.float32), "FP32") for v in values)
    return BlsResponse(request.call_id, server.inputs.size, None, {"served_by": "callee"}, metas, final, reply_no)


@pytest.fixture()
def server(served_worker: tuple[ServerEnd, ModelWorker]) -> Iterator[ServerEnd]:
    yield served_worker[0]


def test_exec_sends_the_request_as_the_model_built_it_and_returns_the_response_copied_out_of_the_arena(
    server: ServerEnd,
) -> None:
    thread = _Server(server, lambda request: [_outputs(server, request, 7.0)])
    thread.start()
    response = _request().exec()
    thread.join(5)
    sent = thread.request
    assert sent is not None
    assert (sent.model_name, sent.model_version, sent.request_id, sent.requested_outputs, sent.decoupled) == (
        "callee", "2", "bls-1", ("Y",), False,
    )  # fmt: skip
    assert sent.parameters == {"mode": "fast", "n": 3}
    np.testing.assert_array_equal(thread.inputs["X"], X)
    assert not response.has_error() and response.parameters() == '{"served_by":"callee"}'
    y = pb_utils.get_output_tensor_by_name(response, "Y").as_numpy()
    server.inputs.mm[:] = bytes(server.inputs.size)  # the server reuses the space: the model's copy stays
    np.testing.assert_array_equal(y, np.full((1, 3), 7.0, np.float32))
    assert server.replies_taken() == 1  # and the server was told it may


def test_a_decoupled_call_iterates_its_responses_in_order_and_ends_after_the_final_one(server: ServerEnd) -> None:
    def answer(request: BlsRequest) -> list[Message]:
        return [
            _outputs(server, request, 1.0, final=False, reply_no=1),
            _outputs(server, request, 2.0, final=False, reply_no=2),
            BlsResponse(request.call_id, server.inputs.size, None, None, (), True, 3),
        ]

    thread = _Server(server, answer)
    thread.start()
    responses = list(_request().exec(decoupled=True))
    thread.join(5)
    assert thread.request is not None and thread.request.decoupled
    values = [[t.as_numpy()[0, 0] for t in r.output_tensors()] for r in responses]
    assert values == [[1.0], [2.0], []] and not any(r.has_error() for r in responses)
    assert server.replies_taken() == 3


def test_a_request_the_server_refuses_gives_the_model_an_error_response_with_the_servers_words(server: ServerEnd) -> None:
    refusal = (INVALID_ARG_CODE, "Request for unknown model: 'callee' is not found")
    thread = _Server(server, lambda request: [CallReply(request.call_id, refusal, None)])
    thread.start()
    response = _request().exec()
    thread.join(5)
    error = response.error()
    assert response.has_error() and error is not None
    assert (error.code(), error.message()) == (pb_utils.TritonError.INVALID_ARG, refusal[1])
    assert response.output_tensors() == []


def test_a_closed_channel_ends_the_wait_with_an_error_response(server: ServerEnd) -> None:
    def close(request: BlsRequest) -> list[Message]:
        server.sock.close()
        return []

    thread = _Server(server, close)
    thread.start()
    response = _request().exec()
    thread.join(5)
    assert response.has_error() and response.error().message() == "the server closed the channel"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"model_name": ""}, "a BLS InferenceRequest needs a model_name"),
        ({"inputs": [np.zeros(2)]}, "inputs must be pb_utils.Tensor objects, got ndarray"),
        ({"model_version": "two"}, "model_version must be an integer, got 'two'"),
    ],
    ids=["no-model", "not-a-tensor", "bad-version"],
)
def test_a_malformed_request_raises_in_the_model_before_anything_is_sent(
    server: ServerEnd, served_worker: tuple[ServerEnd, ModelWorker], overrides: dict[str, object], words: str
) -> None:
    with pytest.raises(pb_utils.TritonModelException, match=words):
        _request(**overrides).exec()
    assert server.nothing_sent() and not served_worker[1].channel._sinks  # no call left waiting for an answer


def test_async_exec_from_a_plain_event_loop_resolves_once_the_response_is_in(server: ServerEnd) -> None:
    thread = _Server(server, lambda request: [_outputs(server, request, 4.0)])
    thread.start()

    async def call() -> pb_utils.InferenceResponse:
        return await _request().async_exec()  # type: ignore[no-any-return]

    response = asyncio.run(call())
    thread.join(5)
    y = pb_utils.get_output_tensor_by_name(response, "Y")
    assert y is not None and y.as_numpy()[0, 0] == 4.0
