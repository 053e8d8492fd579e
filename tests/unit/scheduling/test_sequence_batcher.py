"""The sequence batcher over a fake instance that records what each execution received: Triton's refusals for
requests without a correlation ID or START, the control tensors (START, END, READY, CORRID) each request carries,
one slot per sequence with later sequences waiting for a free one, and a sequence's requests kept in order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from nereid.backends.base import ExecutionTimes
from nereid.config.model_config import parse_pbtxt
from nereid.core.errors import NereidError, Status
from nereid.core.sequence_flags import SEQUENCE_END, SEQUENCE_START
from nereid.core.settings import SchedulerDelay
from nereid.core.statistics import ModelStatistics
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor
from nereid.scheduling.sequence_batcher import SequenceBatcher

_CONTROLS = """
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
"""


class RecordingInstance:
    """Records every executed request as {input name: first value}; holds executions while `gate` is closed."""

    name = "seq_0"

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.batches: list[int] = []  # each execution's size, fillers included
        self.gate = asyncio.Event()
        self.gate.set()

    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        await self.gate.wait()
        self.batches.append(len(requests))
        for request in requests:
            self.seen.append({"id": request.id, **{t.name: np.asarray(t.data).ravel()[0].item() for t in request.inputs}})
        return [InferenceResponse(r.model_name, "1", r.id) for r in requests], ExecutionTimes()

    async def close(self) -> None:
        pass


def _config(max_batch_size: int = 0) -> str:
    return (
        f'name: "seq" backend: "python" max_batch_size: {max_batch_size} '
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ] ' + _CONTROLS
    )


class Harness:
    def __init__(self, config: str, instance: RecordingInstance, delay: SchedulerDelay | None = None, more: int = 0) -> None:
        self.instance = instance
        instances = [instance] + [RecordingInstance() for _ in range(more)]  # `more` instances beside `instance`
        self.batcher = SequenceBatcher(parse_pbtxt(config, "seq"), instances, ModelStatistics("seq", "1"), delay=delay)  # type: ignore[arg-type]
        self.responses: dict[str, InferenceResponse] = {}

    def submit(self, rid: str, corrid: int | str, flags: int = 0, batch_size: int = 1) -> None:
        x = np.zeros((1,), np.float32)
        request = InferenceRequest(
            "seq", "", [InputTensor("X", "FP32", x.shape, x)], id=rid, correlation_id=corrid, flags=flags, batch_size=batch_size
        )
        request.respond = self._record(rid)
        self.batcher.submit(request)

    def _record(self, rid: str) -> Callable[[InferenceResponse], None]:
        def respond(response: InferenceResponse) -> None:
            self.responses[rid] = response

        return respond

    async def until(self, condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not condition():
                await asyncio.sleep(0.001)  # polling with a deadline


def _run(scenario: Callable[[], Any]) -> None:
    asyncio.run(scenario())


def test_requests_without_a_correlation_id_or_a_start_are_refused_in_tritons_words() -> None:
    async def scenario() -> None:
        h = Harness(_config(), RecordingInstance())
        cases = [
            (dict(corrid=0, flags=SEQUENCE_START), "must specify a non-zero or non-empty correlation ID"),
            (dict(corrid=9), "inference request for sequence 9 to model 'seq' must specify the START flag on the first request of the sequence"),
            (dict(corrid=9, flags=SEQUENCE_START, batch_size=2), "must specify batch-size 1 due to requirements of sequence batcher"),
        ]
        for kwargs, words in cases:
            with pytest.raises(NereidError) as refused:
                h.submit("r", **kwargs)  # type: ignore[arg-type]
            assert refused.value.status == Status.INVALID_ARG
            assert words in refused.value.message
        await h.batcher.close()

    _run(scenario)


def test_each_request_carries_the_control_tensors_of_its_place_in_the_sequence() -> None:
    async def scenario() -> None:
        instance = RecordingInstance()
        h = Harness(_config(), instance)
        h.submit("first", 77, SEQUENCE_START)
        h.submit("middle", 77)
        h.submit("last", 77, SEQUENCE_END)
        await h.until(lambda: len(h.responses) == 3)
        assert all(r.error is None for r in h.responses.values())
        assert [(s["id"], s["START"], s["END"], s["READY"], s["CORRID"]) for s in instance.seen] == [
            ("first", 1, 0, 1, 77),
            ("middle", 0, 0, 1, 77),
            ("last", 0, 1, 1, 77),
        ]
        await h.batcher.close()

    _run(scenario)


def test_a_sequence_waits_for_a_free_slot_until_another_ends() -> None:
    async def scenario() -> None:
        instance = RecordingInstance()
        h = Harness(_config(), instance)  # max_batch_size 0: one slot
        h.submit("a1", 1, SEQUENCE_START)
        await h.until(lambda: "a1" in h.responses)
        h.submit("b1", 2, SEQUENCE_START | SEQUENCE_END)  # no slot while sequence 1 holds it
        for _ in range(50):
            await asyncio.sleep(0)
        assert "b1" not in h.responses
        h.submit("a2", 1, SEQUENCE_END)
        await h.until(lambda: len(h.responses) == 3)
        assert [s["id"] for s in instance.seen] == ["a1", "a2", "b1"]
        assert instance.seen[2]["CORRID"] == 2 and instance.seen[2]["START"] == 1
        await h.batcher.close()

    _run(scenario)


def test_sequences_in_different_slots_run_side_by_side_and_keep_their_order() -> None:
    async def scenario() -> None:
        instance = RecordingInstance()
        instance.gate.clear()
        h = Harness(_config(max_batch_size=2), instance)  # two slots
        h.submit("a1", 10, SEQUENCE_START)
        h.submit("b1", 20, SEQUENCE_START)
        h.submit("a2", 10, SEQUENCE_END)
        h.submit("b2", 20, SEQUENCE_END)
        instance.gate.set()
        await h.until(lambda: len(h.responses) == 4)
        real = [s for s in instance.seen if s["READY"] == 1]
        by_sequence: dict[int, list[str]] = {}
        for s in real:
            by_sequence.setdefault(s["CORRID"], []).append(s["id"])
        assert by_sequence == {10: ["a1", "a2"], 20: ["b1", "b2"]}
        await h.batcher.close()

    _run(scenario)


def test_a_closed_batcher_refuses_new_sequences() -> None:
    async def scenario() -> None:
        h = Harness(_config(), RecordingInstance())
        await h.batcher.close()
        with pytest.raises(NereidError, match="stopped accepting new inference requests") as refused:
            h.submit("late", 5, SEQUENCE_START)
        assert refused.value.status == Status.UNAVAILABLE

    _run(scenario)


async def _settle() -> None:
    """Long enough for a held instance to have looked at its queue several times (it looks every 10 ms)."""
    await asyncio.sleep(0.05)


def test_tritonserver_delay_scheduler_holds_the_first_batch_until_that_many_requests_wait() -> None:
    """TRITONSERVER_DELAY_SCHEDULER=4, as Triton's L0_sequence_batcher uses it to make a batch of known size."""

    async def scenario() -> None:
        instance = RecordingInstance()
        h = Harness(_config(max_batch_size=4), instance, SchedulerDelay(queued=4))
        for corrid in (1, 2, 3):
            h.submit(f"s{corrid}", corrid, SEQUENCE_START | SEQUENCE_END)
        await _settle()
        assert instance.batches == []  # three of four: held
        h.submit("s4", 4, SEQUENCE_START | SEQUENCE_END)
        await h.until(lambda: len(h.responses) == 4)
        assert instance.batches == [4]
        h.submit("s5", 5, SEQUENCE_START | SEQUENCE_END)  # held once only: the next request runs alone
        await h.until(lambda: len(h.responses) == 5)
        assert instance.batches == [4, 1]
        await h.batcher.close()

    _run(scenario)


def test_tritonserver_backlog_delay_scheduler_also_waits_for_backlogged_requests() -> None:
    """TRITONSERVER_BACKLOG_DELAY_SCHEDULER=2 counts every backlogged request, those of sequences already ended too
    (L0_sequence_batcher's test_backlog_fill backlogs two sequences of one request each)."""

    async def scenario() -> None:
        instance = RecordingInstance()
        h = Harness(_config(), instance, SchedulerDelay(queued=1, backlogged=2))  # one slot
        h.submit("a1", 1, SEQUENCE_START)
        h.submit("b1", 2, SEQUENCE_START | SEQUENCE_END)  # backlogged: the slot is sequence 1's
        await _settle()
        assert instance.batches == []  # one request in the slot, one of two in the backlog
        h.submit("c1", 3, SEQUENCE_START | SEQUENCE_END)
        await h.until(lambda: "a1" in h.responses)
        h.submit("a2", 1, SEQUENCE_END)
        await h.until(lambda: len(h.responses) == 4)
        assert [s["id"] for s in instance.seen] == ["a1", "a2", "b1", "c1"]
        await h.batcher.close()

    _run(scenario)


def test_tritonserver_delay_scheduler_releases_every_instance_once_the_count_is_reached() -> None:
    """Two instances, one sequence each (L0_sequence_batcher's test_half_batch on four instances): the first instance
    to run takes its requests out of the count, and the other must not be held again."""

    async def scenario() -> None:
        h = Harness(_config(), RecordingInstance(), SchedulerDelay(queued=4), more=1)
        for corrid in (1, 2):
            h.submit(f"s{corrid}a", corrid, SEQUENCE_START)
        await _settle()
        assert h.responses == {}
        for corrid in (1, 2):
            h.submit(f"s{corrid}b", corrid, SEQUENCE_END)
        await h.until(lambda: len(h.responses) == 4)
        await h.batcher.close()

    _run(scenario)
