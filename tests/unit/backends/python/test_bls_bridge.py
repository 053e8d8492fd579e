"""`BlsBridge` between a fake worker and a fake server: a model's BLS request becomes a server request (inputs read
from the worker, the request's fields kept), the common call is submitted without a task and answered from the
scheduler's callback, and every other outcome (a decoupled model, a model not ready, a timeout, no server, an error
of the called model) comes back to the model as a response in Triton's words, never as a failed call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nereid.backends.python.bls_bridge import BlsBridge
from nereid.backends.python.protocol import INTERNAL_CODE, BlsRequest, ErrorInfo
from nereid.core.errors import NereidError
from nereid.core.tracing import NOT_TRACED, RequestTrace, TraceParent
from nereid.core.types import InferenceRequest, InferenceResponse, OutputTensor
from tests.unit.backends.python.fakes import request

LABEL = "[model 'caller' version 1] instance 'caller_0'"
INPUT = np.arange(4, dtype=np.float32).reshape(1, 4)


@dataclass
class Sent:
    call_id: int
    error: ErrorInfo | None
    parameters: dict[str, Any] | None
    outputs: list[OutputTensor] | None
    final: bool


class FakeWorker:
    """What the bridge uses of a worker: inputs to copy out, requests in flight, tasks, and the responses it sends."""

    def __init__(self, unreadable: bool = False) -> None:
        self.alive = True
        self.unreadable = unreadable
        self.consumed_up_to = 0
        self.in_flight: dict[tuple[int, int], InferenceRequest] = {}
        self.bls_calls: dict[int, InferenceRequest] = {}  # decoupled calls in flight, for ResponseIterator.cancel()
        self.tasks: list[asyncio.Task[None]] = []
        self.sent: list[Sent] = []

    def copy_out(self, out_size: int, metas: Any) -> list[tuple[str, str, Any, Any]]:
        if self.unreadable:
            raise ValueError("a tensor of 3 bytes cannot hold FP32 [1,4]")
        return [(name, datatype, shape, INPUT.copy()) for name, datatype, shape, _offset, _nbytes in metas]

    def consumed(self, oseq: int) -> None:
        self.consumed_up_to = oseq

    def request_of(self, seq: int, index: int) -> InferenceRequest | None:
        return self.in_flight.get((seq, index))

    def start_task(self, coroutine: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coroutine))

    def send_bls_response(
        self,
        call_id: int,
        error: ErrorInfo | None,
        parameters: dict[str, Any] | None,
        outputs: list[OutputTensor] | None,
        final: bool,
    ) -> None:
        self.sent.append(Sent(call_id, error, parameters, outputs, final))


@dataclass
class FakeModel:
    decoupled: bool = False


@dataclass
class FakeTracer:
    enabled: bool = False


@dataclass
class FakeServer:
    """The server's handle as a BLS call uses it. `models` are ready; `loading` become ready when waited for."""

    models: dict[str, FakeModel] = field(default_factory=dict)
    answer: Callable[[InferenceRequest], InferenceResponse] | None = None
    stream: list[InferenceResponse] = field(default_factory=list)
    delay_s: float = 0.0
    submit_error: NereidError | None = None
    tracer: FakeTracer = field(default_factory=FakeTracer)
    submitted: list[tuple[InferenceRequest, Callable[[InferenceResponse], None]]] = field(default_factory=list)
    inferred: list[InferenceRequest] = field(default_factory=list)

    def model(self, name: str, version: str = "") -> FakeModel:
        if name not in self.models:
            raise NereidError.unavailable(f"model '{name}' is not ready")
        return self.models[name]

    async def wait_model(self, name: str, version: str = "") -> FakeModel:
        return self.model(name, version)

    def submit(self, req: InferenceRequest, done: Callable[[InferenceResponse], None]) -> bool:
        if self.submit_error is not None:
            raise self.submit_error
        self.submitted.append((req, done))
        return True

    async def infer(self, req: InferenceRequest, *, raise_error: bool = True) -> InferenceResponse:
        self.inferred.append(req)
        await asyncio.sleep(self.delay_s)
        assert self.answer is not None
        return self.answer(req)

    async def infer_stream(self, req: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        self.inferred.append(req)
        for response in self.stream:
            yield response


def _bls(
    model: str = "callee",
    timeout_us: int = 0,
    decoupled: bool = False,
    trace_of: tuple[int, int] | None = None,
) -> BlsRequest:
    inputs = (("INPUT0", "FP32", (1, 4), 64, 16),)
    return BlsRequest(
        7, 12, 1 << 20, model, "2", "bls-1", "seq-9", 1, timeout_us, {"p": "v"}, ("OUT",), inputs, decoupled, trace_of
    )


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 10))


async def _settled(worker: FakeWorker) -> None:
    if worker.tasks:
        await asyncio.gather(*worker.tasks)


def _output(value: float) -> OutputTensor:
    return OutputTensor("OUT", "FP32", (1, 4), np.full((1, 4), value, dtype=np.float32))


def test_an_ordinary_call_is_submitted_without_a_task_and_answered_from_the_callback() -> None:
    async def main() -> None:
        server = FakeServer(models={"callee": FakeModel()})
        worker = FakeWorker()
        BlsBridge(server, LABEL).on_request(worker, _bls())  # type: ignore[arg-type]
        assert worker.tasks == [] and worker.consumed_up_to == 12
        ((sent_request, done),) = server.submitted
        assert (sent_request.model_name, sent_request.model_version, sent_request.id) == ("callee", "2", "bls-1")
        assert (sent_request.correlation_id, sent_request.flags, sent_request.parameters) == ("seq-9", 1, {"p": "v"})
        assert [o.name for o in sent_request.outputs or []] == ["OUT"] and sent_request.timeout_us == 0
        ((name, datatype, shape),) = [(t.name, t.datatype, t.shape) for t in sent_request.inputs]
        assert (name, datatype, shape) == ("INPUT0", "FP32", (1, 4))
        np.testing.assert_array_equal(sent_request.inputs[0].data, INPUT)
        assert sent_request.trace is None  # tracing is off and the caller asked for none
        response = InferenceResponse("callee", "2", "bls-1", [_output(1)], {"kept": 3, "dropped": [1, 2]})
        done(response)
        assert worker.sent == [Sent(7, None, {"kept": 3}, response.outputs, True)]

    _run(main())


def test_a_called_models_error_reaches_the_model_as_internal_whatever_its_code() -> None:
    async def main() -> None:
        server = FakeServer(models={"callee": FakeModel()})
        worker = FakeWorker()
        BlsBridge(server, LABEL).on_request(worker, _bls())  # type: ignore[arg-type]
        ((_, done),) = server.submitted
        done(InferenceResponse("callee", "2", "bls-1", error=NereidError.invalid("input 'INPUT0': bad shape")))
        assert worker.sent == [Sent(7, (INTERNAL_CODE, "input 'INPUT0': bad shape"), None, None, True)]

    _run(main())


def test_inputs_that_cannot_be_read_are_answered_with_an_error_and_their_space_released() -> None:
    async def main() -> None:
        server = FakeServer(models={"callee": FakeModel()})
        worker = FakeWorker(unreadable=True)
        BlsBridge(server, LABEL).on_request(worker, _bls())  # type: ignore[arg-type]
        assert worker.consumed_up_to == 12 and server.submitted == []
        assert worker.sent == [
            Sent(
                7,
                (
                    INTERNAL_CODE,
                    "the inputs of the BLS request could not be read: a tensor of 3 bytes cannot hold FP32 [1,4]",
                ),
                None,
                None,
                True,
            )
        ]

    _run(main())


def test_a_refused_submit_answers_the_model_in_tritons_words() -> None:
    async def main() -> None:
        server = FakeServer(models={"callee": FakeModel()}, submit_error=NereidError.invalid("input 'X' is missing"))
        worker = FakeWorker()
        BlsBridge(server, LABEL).on_request(worker, _bls())  # type: ignore[arg-type]
        error = (INTERNAL_CODE, "Model callee - Error when running inference: input 'X' is missing")
        assert worker.sent == [Sent(7, error, None, None, True)] and worker.tasks == []

    _run(main())


def test_a_model_that_is_not_ready_is_answered_in_tritons_words() -> None:
    async def main() -> None:
        worker = FakeWorker()
        BlsBridge(FakeServer(), LABEL).on_request(worker, _bls("absent"))  # type: ignore[arg-type]
        await _settled(worker)
        text = (
            "Model absent - Error when running inference: Failed for execute the inference request. Model 'absent' "
            "is not ready."
        )
        assert worker.sent == [Sent(7, (INTERNAL_CODE, text), None, None, True)]

    _run(main())


def test_a_decoupled_model_called_without_decoupled_exec_is_refused_in_tritons_words() -> None:
    async def main() -> None:
        worker = FakeWorker()
        server = FakeServer(models={"callee": FakeModel(decoupled=True)})
        BlsBridge(server, LABEL).on_request(worker, _bls(decoupled=False))  # type: ignore[arg-type]
        await _settled(worker)
        ((call_id, (code, text)),) = [(s.call_id, s.error) for s in worker.sent]  # type: ignore[misc]
        assert (call_id, code) == (7, INTERNAL_CODE)
        assert text.startswith("Model callee - Error when running inference: Model callee is using the decoupled.")
        assert server.inferred == []

    _run(main())


def test_a_decoupled_call_streams_each_response_and_ends_with_the_final_one() -> None:
    async def main() -> None:
        stream = [
            InferenceResponse("callee", "2", "bls-1", [_output(1)], final=False),
            InferenceResponse("callee", "2", "bls-1", [_output(2)], final=False),
            InferenceResponse("callee", "2", "bls-1", final=True, complete_only=True),
        ]
        server = FakeServer(models={"callee": FakeModel(decoupled=True)}, stream=stream)
        worker = FakeWorker()
        BlsBridge(server, LABEL).on_request(worker, _bls(decoupled=True))  # type: ignore[arg-type]
        await _settled(worker)
        assert [(s.outputs, s.final, s.error) for s in worker.sent] == [
            (stream[0].outputs, False, None),
            (stream[1].outputs, False, None),
            ([], True, None),
        ]
        assert worker.bls_calls == {}  # no longer cancellable once it ended

    _run(main())


def test_a_call_whose_timeout_expires_is_cancelled_and_answered_with_a_timeout_error() -> None:
    async def main() -> None:
        server = FakeServer(
            models={"callee": FakeModel()}, delay_s=5, answer=lambda r: InferenceResponse("callee", "2")
        )
        worker = FakeWorker()
        BlsBridge(server, LABEL).on_request(worker, _bls(timeout_us=2_000))  # type: ignore[arg-type]
        assert server.submitted == []  # a call with a timeout runs as a task that can give up
        await _settled(worker)
        (called,) = server.inferred
        assert called.cancelled
        error = (INTERNAL_CODE, "Request timeout expired: model 'callee' did not answer within 2000 us")
        assert worker.sent == [Sent(7, error, None, None, True)]

    _run(main())


def test_a_call_in_time_is_answered_once_with_the_called_models_response() -> None:
    async def main() -> None:
        answer = InferenceResponse("callee", "2", "bls-1", [_output(4)])
        server = FakeServer(models={"callee": FakeModel()}, delay_s=0, answer=lambda r: answer)
        worker = FakeWorker()
        BlsBridge(server, LABEL).on_request(worker, _bls(timeout_us=5_000_000))  # type: ignore[arg-type]
        await _settled(worker)
        assert worker.sent == [Sent(7, None, None, answer.outputs, True)]

    _run(main())


def test_without_a_server_bls_is_unavailable() -> None:
    async def main() -> None:
        worker = FakeWorker()
        BlsBridge(None, LABEL).on_request(worker, _bls())  # type: ignore[arg-type]
        await _settled(worker)
        text = (
            "Model callee - Error when running inference: BLS requests need the in-process server, which this "
            "instance was not given"
        )
        assert worker.sent == [Sent(7, (INTERNAL_CODE, text), None, None, True)]

    _run(main())


def test_a_request_traced_by_its_caller_goes_under_its_callers_trace_and_none_other_is_traced() -> None:
    async def main() -> None:
        server = FakeServer(models={"callee": FakeModel()}, tracer=FakeTracer(enabled=True))
        worker = FakeWorker()
        traced, untraced = request("traced"), request("untraced")
        traced.trace = RequestTrace(1, "caller", "traced")
        worker.in_flight[(3, 0)] = traced
        worker.in_flight[(3, 1)] = untraced  # not sampled
        bridge = BlsBridge(server, LABEL)
        for trace_of in ((3, 0), (3, 1), None):
            bridge.on_request(worker, _bls(trace_of=trace_of))  # type: ignore[arg-type]
        under_caller, *others = [sent.trace for sent, _ in server.submitted]
        assert isinstance(under_caller, TraceParent) and under_caller.parent is traced.trace
        assert others == [NOT_TRACED, NOT_TRACED]

    _run(main())
