"""The server's side of one worker (`PythonWorkerProcess`) driven without a worker: batches go out as one Execute
with their inputs in the input arena, the worker's answers (written here into the output arena as a worker would)
come back as typed batch outcomes with each request's response, decoupled responses go straight to their requests,
and what the worker cannot settle itself goes to its owner's hooks."""

from __future__ import annotations

import asyncio
import decimal
from collections.abc import Coroutine
from typing import Any

import numpy as np
import pytest

from nereid.backends.python.arena import read_array
from nereid.backends.python.protocol import (
    CONSUMED,
    CONTROL_BYTES,
    RESCHEDULED_CODE,
    RESPONSE_COMPLETE_FINAL,
    BlsRequest,
    BlsResponse,
    Call,
    Execute,
    ExecuteGroup,
    IsReady,
    Metrics,
    ReadyState,
    TensorMeta,
    response_frame,
    result_frame,
    split_frames,
)
from nereid.backends.python.worker_process import (
    BatchOutcome,
    PythonWorkerProcess,
    WorkerHooks,
    ignore_response,
)
from nereid.core.errors import NereidError, Status
from tests.unit.backends.python.fakes import FakeProcess, arenas, recorded, request, sent_messages
from tests.unit.fakes.transport import FakeTransport

LABEL = "[model 'm' version 1] instance 'm_0'"


class Owner:
    """The worker's owner as the hooks let it see the worker: what reached it, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def hooks(self) -> WorkerHooks:
        return WorkerHooks(
            exited=lambda worker: self.seen.append(("exited", worker)),
            bls_request=lambda worker, message: self.seen.append(("bls", message)),
            call=lambda worker, message: self.seen.append(("call", message)),
            metrics=lambda ops: self.seen.append(("metrics", ops)),
        )


def _worker(decoupled: bool = False, owner: Owner | None = None) -> tuple[PythonWorkerProcess, FakeTransport]:
    inputs, outputs = arenas()
    hooks = (owner or Owner()).hooks()
    worker = PythonWorkerProcess(LABEL, decoupled, FakeProcess(), inputs, outputs, hooks)  # type: ignore[arg-type]
    transport = FakeTransport()
    worker.transport = transport  # type: ignore[assignment]
    return worker, transport


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 10))


def _write_outputs(worker: PythonWorkerProcess, arrays: dict[str, np.ndarray]) -> tuple[TensorMeta, ...]:
    """Lay tensors out in the output arena as a worker does; their metadata."""
    metas = []
    offset = CONTROL_BYTES
    for name, array in arrays.items():
        worker.outputs.mm[offset : offset + array.nbytes] = array.tobytes()
        metas.append((name, "FP32", tuple(array.shape), offset, array.nbytes))
        offset += (array.nbytes + 63) & ~63
    return tuple(metas)


def _deliver(worker: PythonWorkerProcess, frame: bytes) -> None:
    """A frame from the worker, read off the channel."""
    (message,), _ = split_frames(frame)
    worker.on_message(message)


def test_a_batch_goes_out_as_one_execute_with_its_inputs_in_the_input_arena() -> None:
    async def main() -> None:
        worker, transport = _worker()
        first, second = request("a"), request("b", timeout_us=5)
        seq, future = worker.submit([first, second], poll_ns=7)
        (execute,) = sent_messages(transport)
        assert isinstance(execute, Execute) and execute.seq == seq == 1 and execute.poll_ns == 7
        assert execute.in_arena_size == worker.inputs.size
        assert [wire[:4] for wire in execute.requests] == [("a", 0, 0, 0), ("b", 0, 0, 5)]
        for sent, wire in zip((first, second), execute.requests, strict=True):
            for tensor, (name, datatype, shape, offset, nbytes) in zip(sent.inputs, wire[6], strict=True):
                assert (name, datatype, tuple(shape)) == (tensor.name, tensor.datatype, tensor.shape)
                np.testing.assert_array_equal(
                    read_array(worker.inputs.mm, datatype, shape, offset, nbytes, True), tensor.data
                )
        assert not future.done() and worker.request_of(seq, 1) is second and worker.request_of(seq, 2) is None
        worker.submit([request("c")], group=True)
        (each,) = sent_messages(transport)
        assert isinstance(each, ExecuteGroup) and each.seq == 2

    _run(main())


def test_parameter_values_marshal_cannot_carry_go_as_their_text() -> None:
    async def main() -> None:
        worker, transport = _worker()
        worker.submit([request(parameters={"plain": 3, "odd": decimal.Decimal("1.5")})])
        (execute,) = sent_messages(transport)
        assert execute.requests[0][4] == {"plain": 3, "odd": "1.5"}

    _run(main())


def test_a_result_resolves_the_batch_with_each_requests_response_and_the_workers_stamps() -> None:
    async def main() -> None:
        worker, _ = _worker()
        requests = [request("a"), request("b")]
        seq, future = worker.submit(requests)
        out0 = np.array([[1, 2, 3, 4]], dtype=np.float32)
        metas = _write_outputs(worker, {"OUTPUT0": out0})
        answers = [(None, {"note": "x"}, metas), (None, None, metas)]
        _deliver(worker, result_frame(seq, 5, worker.outputs.size, None, answers, (100, 200), ()))
        outcome = future.result()
        assert type(outcome) is BatchOutcome and outcome.error is None and outcome.times == (100, 200)
        assert outcome.responses is not None
        assert [(r.id, r.parameters, r.error) for r in outcome.responses] == [
            ("a", {"note": "x"}, None),
            ("b", {}, None),
        ]
        for response in outcome.responses:
            (tensor,) = response.outputs
            assert (tensor.name, tensor.datatype, tuple(tensor.shape)) == ("OUTPUT0", "FP32", (1, 4))
            np.testing.assert_array_equal(tensor.data, out0)
        worker.outputs.mm[CONTROL_BYTES : CONTROL_BYTES + 16] = bytes(16)
        np.testing.assert_array_equal(outcome.responses[0].outputs[0].data, out0)  # copied: the worker reuses the space
        assert CONSUMED.unpack_from(worker.inputs.mm, 0) == (5,)  # the worker may reuse the output arena up to oseq 5
        assert worker.request_of(seq, 0) is None and not worker.pending and not worker.writer.live

    _run(main())


def test_each_requests_error_and_a_rescheduled_request_come_back_in_their_own_responses() -> None:
    async def main() -> None:
        worker, _ = _worker()
        requests = [request("bad"), request("again"), request("unreadable")]
        seq, future = worker.submit(requests)
        broken = (("OUTPUT0", "FP32", (1, 4), CONTROL_BYTES, 3),)  # 3 bytes cannot hold four floats
        answers = [((3, "INPUT0 is wrong"), {"p": 1}, ()), ((RESCHEDULED_CODE, ""), None, ()), (None, None, broken)]
        _deliver(worker, result_frame(seq, 1, worker.outputs.size, None, answers, (1, 2), ()))
        bad, again, unreadable = future.result().responses
        assert bad.error is not None and (bad.error.status, bad.error.message) == (
            Status.INVALID_ARG,
            "INPUT0 is wrong",
        )
        assert again.error is None and again.outputs == [] and requests[1].rescheduled
        assert not requests[0].rescheduled and not requests[2].rescheduled
        assert unreadable.error is not None and unreadable.error.status is Status.INTERNAL
        assert unreadable.error.message.startswith(f"{LABEL}: the model's outputs could not be read")

    _run(main())


def test_a_batch_error_fails_the_whole_batch_as_a_nereid_error() -> None:
    async def main() -> None:
        worker, _ = _worker()
        seq, future = worker.submit([request("a"), request("b")])
        _deliver(worker, result_frame(seq, 1, worker.outputs.size, (1, "execute() raised"), None, (3, 4), ()))
        outcome = future.result()
        assert outcome.responses is None and outcome.times == (3, 4)
        assert isinstance(outcome.error, NereidError)
        assert (outcome.error.status, outcome.error.message) == (Status.INTERNAL, "execute() raised")

    _run(main())


def test_a_result_with_a_response_too_few_is_an_internal_error_not_a_hang() -> None:
    async def main() -> None:
        worker, _ = _worker()
        seq, future = worker.submit([request("a"), request("b")])
        _deliver(worker, result_frame(seq, 1, worker.outputs.size, None, [(None, None, ())], (3, 4), ()))
        error = future.result().error
        assert error is not None and error.status is Status.INTERNAL and "1 responses for 2 requests" in error.message

    _run(main())


def test_a_result_nobody_waits_for_any_more_only_frees_its_space() -> None:
    async def main() -> None:
        worker, _ = _worker()
        seq, future = worker.submit([request("a")])
        future.cancel()  # every request of the batch timed out
        _deliver(worker, result_frame(seq, 9, worker.outputs.size, None, [(None, None, ())], (3, 4), ()))
        assert not worker.pending and not worker.batches and not worker.writer.live
        assert CONSUMED.unpack_from(worker.inputs.mm, 0) == (9,)

    _run(main())


def test_a_decoupled_models_responses_go_straight_to_their_requests_until_the_final_one() -> None:
    async def main() -> None:
        worker, _ = _worker(decoupled=True)
        streaming = request("s")
        responses = recorded(streaming)
        seq, future = worker.submit([streaming])
        out0 = np.array([[5, 6, 7, 8]], dtype=np.float32)
        metas = _write_outputs(worker, {"OUTPUT0": out0})
        size = worker.outputs.size
        _deliver(worker, response_frame(seq, 0, 1, size, None, {"step": 1}, metas, 0))
        _deliver(worker, response_frame(seq, 0, 2, size, (4, "not now"), None, (), 0))
        _deliver(worker, response_frame(seq, 0, 3, size, None, None, None, RESPONSE_COMPLETE_FINAL))
        _deliver(worker, response_frame(seq, 0, 4, size, None, None, metas, RESPONSE_COMPLETE_FINAL))  # too late
        first, failed, last = responses
        np.testing.assert_array_equal(first.outputs[0].data, out0)
        assert first.parameters == {"step": 1} and not first.final
        assert failed.error is not None and failed.error.status is Status.UNAVAILABLE and not failed.final
        assert last.final and last.complete_only and streaming.respond is ignore_response
        _deliver(worker, result_frame(seq, 5, size, None, None, (1, 2), ()))
        assert future.result() == BatchOutcome(None, None, (1, 2))
        assert CONSUMED.unpack_from(worker.inputs.mm, 0) == (5,)

    _run(main())


def test_a_failed_decoupled_batch_ends_each_open_stream_with_its_error() -> None:
    async def main() -> None:
        worker, _ = _worker(decoupled=True)
        done, open_ = request("done"), request("open")
        answered, waiting = recorded(done), recorded(open_)
        seq, future = worker.submit([done, open_])
        _deliver(worker, response_frame(seq, 0, 1, worker.outputs.size, None, None, None, RESPONSE_COMPLETE_FINAL))
        _deliver(worker, result_frame(seq, 2, worker.outputs.size, (1, "execute() raised"), None, (1, 2), ()))
        assert future.result().error is not None
        assert len(answered) == 1 and answered[0].error is None
        (ended,) = waiting
        assert ended.final and ended.error is not None and ended.error.message == "execute() raised"
        assert not worker.streams

    _run(main())


def test_a_rescheduled_decoupled_request_is_marked_and_stops_streaming_under_its_old_key() -> None:
    async def main() -> None:
        worker, _ = _worker(decoupled=True)
        again, ended = request("again"), request("ended")
        seq, future = worker.submit([again, ended])
        answers = [((RESCHEDULED_CODE, ""), None, ()), (None, None, ())]
        _deliver(worker, result_frame(seq, 1, worker.outputs.size, None, answers, (1, 2), ()))
        assert future.result() == BatchOutcome(None, None, (1, 2))
        assert again.rescheduled and not ended.rescheduled
        assert list(worker.streams) == [(seq, 1)]

    _run(main())


def test_what_the_worker_cannot_settle_goes_to_its_owners_hooks_and_the_channels_end_once() -> None:
    async def main() -> None:
        owner = Owner()
        worker, _ = _worker(owner=owner)
        bls = BlsRequest(1, 1, worker.outputs.size, "other", "", "id", 0, 0, 0, {}, (), (), False, None)
        call = Call(2, "cancelled", (1, 0))
        ops = (("i", "family", (("model", "m"),), 1.0),)
        worker.on_message(bls)
        worker.on_message(call)
        worker.on_message(Metrics(ops))  # for its Server's custom-metric registry
        worker.on_lost()
        worker.on_lost()
        assert owner.seen == [("bls", bls), ("call", call), ("metrics", ops), ("exited", worker)]
        assert not worker.alive

    _run(main())


def test_a_worker_that_failed_fails_everything_it_had() -> None:
    async def main() -> None:
        worker, _ = _worker(decoupled=True)
        streaming = request("s")
        responses = recorded(streaming)
        _, future = worker.submit([streaming])
        probe = asyncio.get_running_loop().create_task(worker.model_ready(5))
        await asyncio.sleep(0)
        worker.start_task(asyncio.sleep(5))  # a model's call into the server, under way
        (call,) = worker.calls
        error = NereidError.internal("the worker died")
        worker.fail(error)
        with pytest.raises(NereidError, match="the worker died"):
            future.result()
        assert [(r.error, r.final) for r in responses] == [(error, True)] and streaming.respond is ignore_response
        assert await probe is False
        await asyncio.sleep(0)
        assert call.cancelled()
        assert worker.ready.exception() is error and worker.done.exception() is error

    _run(main())


def test_model_ready_asks_the_model_and_gives_up_after_its_timeout() -> None:
    async def main() -> None:
        worker, transport = _worker()
        asking = asyncio.get_running_loop().create_task(worker.model_ready(5))
        await asyncio.sleep(0)
        (question,) = sent_messages(transport)
        assert isinstance(question, IsReady)
        worker.on_message(ReadyState(question.call_id, True))
        assert await asking is True
        assert await worker.model_ready(0.01) is False
        assert not worker.probes  # the unanswered probe is forgotten

    _run(main())


def test_a_bls_response_lays_its_outputs_in_the_input_arena_until_the_worker_takes_them() -> None:
    async def main() -> None:
        from nereid.core.types import OutputTensor

        worker, transport = _worker()
        data = np.array([[9, 8, 7, 6]], dtype=np.float32)
        worker.send_bls_response(3, None, {"p": True}, [OutputTensor("OUT", "FP32", (1, 4), data)], False)
        worker.send_bls_response(3, (1, "failed"), None, None, True)
        with_outputs, error_only = sent_messages(transport)
        assert isinstance(with_outputs, BlsResponse) and (with_outputs.call_id, with_outputs.reply_no) == (3, 1)
        assert with_outputs.parameters == {"p": True} and not with_outputs.final
        ((name, datatype, shape, offset, nbytes),) = with_outputs.outputs
        np.testing.assert_array_equal(read_array(worker.inputs.mm, datatype, shape, offset, nbytes, True), data)
        assert -1 in worker.writer.live  # held until the worker's REPLIES_TAKEN passes reply 1
        assert (error_only.error, error_only.outputs, error_only.final, error_only.reply_no) == (
            (1, "failed"),
            (),
            True,
            2,
        )
        worker.alive = False
        worker.send_bls_response(4, None, None, None, True)
        assert sent_messages(transport) == []

    _run(main())
