"""The batch runner both batchers share: a backend bug becomes INTERNAL for the batch, a wrong response count
fails it, and the statistics count an execution the way Triton does (succeeded items for the dynamic batcher;
every slot, fillers never as inferences, for the sequence batcher; decoupled responses through the recorder)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nereid.backends.base import ExecutionTimes
from nereid.core.errors import NereidError, Status
from nereid.core.statistics import ModelStatistics
from nereid.core.types import InferenceRequest, InferenceResponse
from nereid.scheduling.batch_runner import BatchRunner, Executed

Answer = Callable[[list[InferenceRequest]], list[InferenceResponse]]


class AnsweringInstance:
    name = "m_0"

    def __init__(self, answer: Answer) -> None:
        self.answer = answer

    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        return self.answer(requests), ExecutionTimes(10, 20, 30)

    async def close(self) -> None:
        pass


def _ok(requests: list[InferenceRequest]) -> list[InferenceResponse]:
    return [InferenceResponse("m", "1", r.id) for r in requests]


def _second_fails(requests: list[InferenceRequest]) -> list[InferenceResponse]:
    responses = _ok(requests)
    responses[1] = InferenceResponse("m", "1", requests[1].id, error=NereidError.invalid("bad row"))
    return responses


def _requests(*batch_sizes: int) -> list[InferenceRequest]:
    return [InferenceRequest("m", "", [], id=f"r{i}", batch_size=size) for i, size in enumerate(batch_sizes)]


def _run(runner: BatchRunner, answer: Answer, batch: list[InferenceRequest], fillers: list[bool] | None = None) -> Executed | NereidError:
    return asyncio.run(runner.run(AnsweringInstance(answer), batch, fillers))  # type: ignore[arg-type]


def test_a_backend_bug_becomes_an_internal_error_for_the_batch() -> None:
    def broken(requests: list[InferenceRequest]) -> list[InferenceResponse]:
        raise KeyError("OUTPUT0")

    stats = ModelStatistics("m", "1")
    outcome = _run(BatchRunner("m", stats, decoupled=False), broken, _requests(1))
    assert isinstance(outcome, NereidError)
    assert (outcome.status, outcome.message) == (Status.INTERNAL, "KeyError: 'OUTPUT0'")
    assert stats.execution_count == 0


def test_a_wrong_response_count_is_an_error_naming_the_model() -> None:
    outcome = _run(BatchRunner("m", ModelStatistics("m", "1"), decoupled=False), lambda rs: _ok(rs)[:1], _requests(1, 1))
    assert isinstance(outcome, NereidError) and outcome.message == "model 'm' returned 1 responses for 2 requests"


def test_the_dynamic_batcher_counts_only_the_items_that_succeeded() -> None:
    stats = ModelStatistics("m", "1")
    runner = BatchRunner("m", stats, decoupled=False)
    batch = _requests(2, 3, 1)
    executed = _run(runner, _second_fails, batch)
    assert isinstance(executed, Executed) and executed.compute == (10, 20, 30)
    assert (stats.execution_count, stats.inference_count) == (1, 3)
    assert list(stats.batches) == [3]
    assert stats.compute_infer.as_dict() == {"count": 2, "ns": 40}  # each succeeded request charged the batch's
    for request, response in zip(batch, executed.responses):
        runner.settle(request, response, executed)
    assert (stats.success.count, stats.fail.count) == (2, 1)


def test_the_sequence_batcher_counts_every_slot_but_fillers_and_failures_never_as_inferences() -> None:
    stats = ModelStatistics("m", "1")
    executed = _run(BatchRunner("m", stats, decoupled=False, slot_batches=True), _second_fails, _requests(1, 1, 1, 1), [False, False, False, True])
    assert isinstance(executed, Executed)
    assert list(stats.batches) == [4]
    assert (stats.execution_count, stats.inference_count) == (1, 2)


def test_a_decoupled_models_requests_respond_through_the_response_recorder() -> None:
    stats = ModelStatistics("m", "1")
    seen: list[InferenceResponse] = []
    batch = _requests(1, 1)
    for request in batch:
        request.respond = seen.append

    def streams(requests: list[InferenceRequest]) -> list[InferenceResponse]:
        requests[0].respond(InferenceResponse("m", "1", requests[0].id, final=True))
        return []

    executed = _run(BatchRunner("m", stats, decoupled=True, slot_batches=True), streams, batch, [False, True])
    assert isinstance(executed, Executed) and executed.responses == []
    assert [r.id for r in seen] == ["r0"]
    assert 0 in stats.responses  # the recorder charged the first response
    assert batch[1].respond == seen.append  # a filler is no one's request: its respond is left alone
    assert (stats.execution_count, stats.inference_count, list(stats.batches)) == (1, 1, [2])


def test_reject_charges_the_failure_reason_and_builds_the_answer() -> None:
    stats = ModelStatistics("m", "1")
    request = _requests(1)[0]
    response = BatchRunner("m", stats, decoupled=False).reject(request, NereidError.unavailable("Request timeout expired"), "REJECTED")
    assert response.id == "r0" and response.error is not None and response.error.message == "Request timeout expired"
    assert stats.failures_by_reason == {"REJECTED": 1} and stats.fail.count == 1
