"""`PythonInstance` over a fake supervisor and worker (its `Supervisor` and `BatchWorker` seams): a batch goes to
the live worker (revived first when it died), its typed outcome becomes responses and execution times split at the
worker's stamps, failed batches raise their error, and request timeouts answer expired requests alone, recycling a
worker that nobody waits for any more."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from nereid.backends.python.backend_state import PythonBackendState
from nereid.backends.python.instance import GROUP_MOST, PythonInstance
from nereid.backends.python.process import WorkerSupervisor
from nereid.backends.python.worker_process import BatchOutcome, ignore_response
from nereid.core.errors import NereidError, Status
from nereid.core.types import InferenceRequest, InferenceResponse
from tests.unit.backends.python.fakes import context, instance_spec, recorded, request


class FakeWorker:
    """A worker whose batches wait until the test answers them (`answer`); it remembers when each was submitted."""

    def __init__(self, runs_groups: bool = False) -> None:
        self.alive = True
        self.pid = 4242
        self.runs_groups = runs_groups
        self.submitted: list[tuple[list[InferenceRequest], bool, int]] = []
        self.futures: list[asyncio.Future[BatchOutcome]] = []
        self.submitted_ns: list[int] = []

    def submit(
        self, requests: list[InferenceRequest], group: bool = False, poll_ns: int = 0
    ) -> tuple[int, asyncio.Future[BatchOutcome]]:
        self.submitted_ns.append(time.monotonic_ns())
        self.submitted.append((requests, group, poll_ns))
        future: asyncio.Future[BatchOutcome] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return len(self.futures), future

    def answer(self, outcome: BatchOutcome, batch: int = -1) -> None:
        self.futures[batch].set_result(outcome)


class FakeSupervisor:
    def __init__(self, worker: FakeWorker | None) -> None:
        self.worker = worker
        self.revived: list[FakeWorker] = []
        self.recycled: list[tuple[object, str]] = []
        self.calls: list[str] = []

    async def start(self) -> None:
        self.calls.append("start")

    async def close(self) -> None:
        self.calls.append("close")

    async def ready(self) -> bool:
        self.calls.append("ready")
        return True

    async def revive(self) -> FakeWorker:
        worker = FakeWorker()
        self.revived.append(worker)
        self.worker = worker
        return worker

    def recycle(self, worker: object, reason: str) -> None:
        self.recycled.append((worker, reason))


def _instance(
    tmp_path: Path, worker: FakeWorker | None, decoupled: bool = False
) -> tuple[PythonInstance, FakeSupervisor]:
    supervisor = FakeSupervisor(worker)
    return PythonInstance(context(tmp_path, decoupled), instance_spec(), supervisor=supervisor), supervisor


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 10))


async def _started(worker: FakeWorker, batches: int = 1) -> None:
    """Wait until the instance has handed `batches` batches to the worker."""
    while len(worker.futures) < batches:
        await asyncio.sleep(0)


def _response(req: InferenceRequest, note: str = "") -> InferenceResponse:
    return InferenceResponse(req.model_name, req.model_version, req.id, parameters={"note": note} if note else {})


def test_a_batch_goes_to_the_worker_and_its_time_is_split_at_the_workers_stamps(tmp_path: Path) -> None:
    async def main() -> None:
        worker = FakeWorker()
        instance, _ = _instance(tmp_path, worker)
        requests = [request("a"), request("b")]
        execution = asyncio.create_task(instance.execute(requests))
        await _started(worker)
        start = worker.submitted_ns[0] + 1_000
        answers = [_response(r, r.id) for r in requests]
        worker.answer(BatchOutcome(None, answers, (start, start + 5_000)))
        responses, times = await execution
        assert responses == answers
        assert worker.submitted[0] == (requests, False, 0)  # no server: nobody asks the worker to poll
        assert times.compute_infer_ns == 5_000 and times.waited_ns == 0
        assert times.compute_input_ns >= 1_000 and times.compute_output_ns > 0

    _run(main())


def test_a_batch_handed_over_while_the_one_before_ran_counts_the_wait_as_queue_time(tmp_path: Path) -> None:
    async def main() -> None:
        worker = FakeWorker()
        instance, _ = _instance(tmp_path, worker)
        first = asyncio.create_task(instance.execute([request("a")]))
        second = asyncio.create_task(instance.execute([request("b")]))
        await _started(worker, 2)
        t0 = worker.submitted_ns[1]
        worker.answer(BatchOutcome(None, [_response(request("a"))], (t0 - 10_000, t0 + 50_000)), 0)
        await first
        worker.answer(BatchOutcome(None, [_response(request("b"))], (t0 + 50_000, t0 + 60_000)), 1)
        _, times = await second
        # It started as the one before ended: all of its time before execute() was spent waiting for that one.
        assert times.waited_ns >= 50_000 and times.compute_input_ns == 0 and times.compute_infer_ns == 10_000

    _run(main())


def test_a_failed_batch_raises_its_error(tmp_path: Path) -> None:
    async def main() -> None:
        worker = FakeWorker()
        instance, _ = _instance(tmp_path, worker)
        execution = asyncio.create_task(instance.execute([request("a")]))
        await _started(worker)
        error = NereidError.internal("execute() raised")
        worker.answer(BatchOutcome(error, None, (1, 2)))
        with pytest.raises(NereidError) as raised:
            await execution
        assert raised.value is error

    _run(main())


def test_a_dead_worker_is_revived_before_the_batch_goes(tmp_path: Path) -> None:
    async def main() -> None:
        instance, supervisor = _instance(tmp_path, None)
        assert instance.pid is None and instance.group_limit == 1
        execution = asyncio.create_task(instance.execute([request("a")]))
        while not supervisor.revived:
            await asyncio.sleep(0)
        (worker,) = supervisor.revived
        await _started(worker)
        worker.answer(BatchOutcome(None, [_response(request("a"))], (1, 2)))
        await execution
        assert instance.pid == 4242
        worker.alive = False
        assert instance.pid is None

    _run(main())


def test_a_decoupled_batch_returns_no_responses_and_ignores_request_timeouts(tmp_path: Path) -> None:
    async def main() -> None:
        worker = FakeWorker()
        instance, _ = _instance(tmp_path, worker, decoupled=True)
        streaming = request("s", timeout_us=1)
        answered = recorded(streaming)
        execution = asyncio.create_task(instance.execute([streaming]))
        await _started(worker)
        await asyncio.sleep(0.01)  # far past its timeout: a decoupled model streams for as long as it likes
        worker.answer(BatchOutcome(None, None, (1, 2)))
        responses, _ = await execution
        assert responses == [] and answered == []

    _run(main())


def test_a_request_whose_timeout_expires_is_answered_alone_and_the_others_get_the_workers_responses(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        worker = FakeWorker()
        instance, supervisor = _instance(tmp_path, worker)
        hasty, patient = request("hasty", timeout_us=1_000), request("patient")
        early = recorded(hasty)
        execution = asyncio.create_task(instance.execute([hasty, patient]))
        while not early:
            await asyncio.sleep(0.001)
        (timed_out,) = early
        assert timed_out.error is not None and timed_out.error.status is Status.UNAVAILABLE
        assert timed_out.error.message == (
            "Request timeout expired: [model 'm' version 1] instance 'm_0' did not answer within 1000 us"
        )
        assert hasty.respond is ignore_response
        late = [_response(hasty, "late"), _response(patient, "in time")]
        worker.answer(BatchOutcome(None, late, (1, 2)))
        responses, _ = await execution
        assert responses == [timed_out, late[1]] and supervisor.recycled == []

    _run(main())


def test_a_batch_error_after_a_request_expired_answers_the_others_with_it(tmp_path: Path) -> None:
    async def main() -> None:
        worker = FakeWorker()
        instance, _ = _instance(tmp_path, worker)
        hasty, patient = request("hasty", timeout_us=1_000), request("patient")
        early = recorded(hasty)
        execution = asyncio.create_task(instance.execute([hasty, patient]))
        while not early:
            await asyncio.sleep(0.001)
        worker.answer(BatchOutcome(NereidError.internal("execute() raised"), None, (1, 2)))
        responses, _ = await execution
        assert responses[0] is early[0]
        assert responses[1].id == "patient" and responses[1].error is not None
        assert responses[1].error.message == "execute() raised"

    _run(main())


def test_when_every_request_expires_the_batch_is_abandoned_and_its_worker_recycled(tmp_path: Path) -> None:
    async def main() -> None:
        worker = FakeWorker()
        instance, supervisor = _instance(tmp_path, worker)
        requests = [request("a", timeout_us=1_000), request("b", timeout_us=2_000)]
        answered = [recorded(r) for r in requests]
        responses, times = await instance.execute(requests)
        assert [r.error.status for r in responses if r.error is not None] == [Status.UNAVAILABLE] * 2
        assert [a == [r] for a, r in zip(answered, responses, strict=True)] == [True, True]
        assert worker.futures[0].cancelled()
        assert supervisor.recycled == [
            (worker, "execute() did not finish before the timeouts of all its requests expired")
        ]
        assert times.compute_infer_ns == 0

    _run(main())


def test_requests_handed_over_as_one_execute_group_get_their_own_responses_and_times(tmp_path: Path) -> None:
    async def main() -> None:
        worker = FakeWorker(runs_groups=True)
        instance, _ = _instance(tmp_path, worker)
        assert instance.group_limit == min(GROUP_MOST, 2)  # execute() is first taken to last GROUP_HOLD_NS
        requests = [request("a"), request("b")]
        execution = asyncio.create_task(instance.execute_group(requests))
        await _started(worker)
        assert worker.submitted[0][1] is True
        t = worker.submitted_ns[0]
        answers = [_response(r, r.id) for r in requests]
        worker.answer(BatchOutcome(None, answers, (t + 100, t + 1_100, t + 1_100, t + 3_100)))
        (first, first_times), (second, second_times) = await execution
        assert (first, second) == tuple(answers)
        assert (first_times.compute_infer_ns, second_times.compute_infer_ns) == (1_000, 2_000)
        assert first_times.waited_ns == 0 and second_times.waited_ns > 0  # the second waited for the first

    _run(main())


def test_a_failed_execute_group_raises_its_error(tmp_path: Path) -> None:
    async def main() -> None:
        worker = FakeWorker(runs_groups=True)
        instance, _ = _instance(tmp_path, worker)
        execution = asyncio.create_task(instance.execute_group([request("a")]))
        await _started(worker)
        worker.answer(BatchOutcome(NereidError.unavailable("gone"), None, ()))
        with pytest.raises(NereidError, match="gone"):
            await execution

    _run(main())


def test_start_ready_and_close_are_the_supervisors(tmp_path: Path) -> None:
    async def main() -> None:
        instance, supervisor = _instance(tmp_path, FakeWorker())
        await instance.start()
        assert await instance.ready()
        await instance.close()
        assert supervisor.calls == ["start", "ready", "close"]

    _run(main())


def test_the_instance_hands_its_supervisor_what_a_worker_is_initialized_with(tmp_path: Path) -> None:
    ctx = context(tmp_path, decoupled=True)
    state = PythonBackendState()
    instance = PythonInstance(ctx, instance_spec("m_3"), state)
    assert isinstance(instance.supervisor, WorkerSupervisor)
    assert instance.supervisor.spares is state.spares and instance.supervisor.metrics is state.metrics
    spec = instance.supervisor.spec
    assert spec.label == instance.label == "[model 'm' version 1] instance 'm_3'"
    assert (spec.name, spec.decoupled, spec.model_file, spec.version_dir) == (
        "m_3",
        True,
        ctx.version_path / "model.py",
        str(ctx.version_path),
    )
    assert spec.args["model_instance_name"] == "m_3" and spec.args["model_name"] == "m"
    assert spec.args["model_version"] == "1" and spec.args["model_instance_kind"] == "CPU"
    assert json.loads(spec.args["model_config"])["name"] == "m"
    assert spec.server is None and spec.metrics_owner.startswith("m/1/m_3/")
