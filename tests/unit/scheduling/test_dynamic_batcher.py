"""The dynamic batcher over a fake instance whose execution the test holds open: preferred batch sizes, the
queue delay, priority order, the equal-shapes rule, preserve_ordering, and failures mapped to every request of
the batch. Batches are made while the instance is held, so nothing depends on timing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
import uvloop

from nereid.backends.base import ExecutionTimes
from nereid.config.model_config import parse_pbtxt
from nereid.core.errors import NereidError, Status
from nereid.core.statistics import ModelStatistics
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor
from nereid.scheduling.dynamic_batcher import BatchingScheduler
from nereid.scheduling.rate_limiter import InstanceLimits


class HeldInstance:
    """Records each batch's request ids; every execution waits until the test opens the gate."""

    name = "held_0"

    def __init__(self, answer: Callable[[list[InferenceRequest]], list[InferenceResponse]] | None = None) -> None:
        self.batches: list[list[str]] = []
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.answer = answer

    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        self.batches.append([r.id for r in requests])
        self.started.set()
        await self.gate.wait()
        if self.answer is not None:
            return self.answer(requests), ExecutionTimes()
        return [InferenceResponse(r.model_name, "1", r.id) for r in requests], ExecutionTimes()

    async def close(self) -> None:
        pass


def _config(batching: str, max_batch_size: int = 8, instances: int = 1) -> str:
    return (
        f'name: "m" backend: "python" max_batch_size: {max_batch_size} '
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ] '
        f"instance_group [ {{ count: {instances} }} ] {batching}"
    )


class Harness:
    def __init__(self, config: str, *instances: HeldInstance) -> None:
        self.instances = list(instances)
        self.stats = ModelStatistics("m", "1")
        self.scheduler = BatchingScheduler(parse_pbtxt(config, "m"), self.instances, self.stats)  # type: ignore[arg-type]
        self.responses: dict[str, InferenceResponse] = {}
        self.order: list[str] = []

    def submit(self, rid: str, width: int = 2, priority: int = 0) -> None:
        x = np.zeros((1, width), np.float32)
        request = InferenceRequest("m", "", [InputTensor("X", "FP32", x.shape, x)], id=rid, priority=priority)
        request.respond = self._record(rid)
        self.scheduler.submit(request)

    def _record(self, rid: str) -> Callable[[InferenceResponse], None]:
        def respond(response: InferenceResponse) -> None:
            self.responses[rid] = response
            self.order.append(rid)

        return respond

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        async with asyncio.timeout(10):
            while not condition():
                await asyncio.sleep(0.001)  # polling with a deadline, not a fixed wait
        assert condition(), what

    async def hold_first(self, instance: HeldInstance) -> None:
        """Occupy the instance with one request so the next ones queue."""
        self.submit("blocker")
        await asyncio.wait_for(instance.started.wait(), 10)


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def test_dynamic_batcher_honours_preferred_batch_size() -> None:
    async def scenario() -> None:
        instance = HeldInstance()
        h = Harness(_config("dynamic_batching { preferred_batch_size: [ 2, 4 ] }"), instance)
        await h.hold_first(instance)
        for n in range(7):
            h.submit(f"r{n}")
        instance.gate.set()
        await h.until(lambda: len(h.responses) == 8, "every request answered")
        # 7 queued, fewer than max_batch_size 8: the largest preferred size that fits, then the next, then the rest.
        assert [len(b) for b in instance.batches] == [1, 4, 2, 1]
        assert instance.batches[1] == ["r0", "r1", "r2", "r3"]
        await h.scheduler.close()

    _run(scenario)


def test_a_full_queue_fills_max_batch_size_without_preferred_sizes() -> None:
    async def scenario() -> None:
        instance = HeldInstance()
        h = Harness(_config("dynamic_batching { }", max_batch_size=3), instance)
        await h.hold_first(instance)
        for n in range(5):
            h.submit(f"r{n}")
        instance.gate.set()
        await h.until(lambda: len(h.responses) == 6, "every request answered")
        assert [len(b) for b in instance.batches] == [1, 3, 2]
        assert h.stats.execution_count == 3
        await h.scheduler.close()

    _run(scenario)


@pytest.mark.parametrize("batching", ["dynamic_batching { }", "dynamic_batching { max_queue_delay_microseconds: 2000 }"])
def test_a_burst_is_shared_between_the_idle_instances_it_woke(batching: str) -> None:
    """Requests that arrive together while two instances sit idle run on both, half each, not as one batch on the
    instance that woke first while the other stays idle (a burst from an ensemble step or a set of clients in step),
    also when both hold the batch open for the queue delay."""

    async def scenario() -> None:
        first, second = HeldInstance(), HeldInstance()
        h = Harness(_config(batching, max_batch_size=32, instances=2), first, second)
        await asyncio.sleep(0)  # the instances' loops start and park, idle, as a running server's have
        for n in range(16):
            h.submit(f"r{n}")  # all queued before either idle instance's loop runs
        await h.until(lambda: first.batches and second.batches, "both instances handed a batch")
        assert sorted(len(b) for b in first.batches + second.batches) == [8, 8]
        first.gate.set()
        second.gate.set()
        await h.until(lambda: len(h.responses) == 16, "every request answered")
        assert h.stats.execution_count == 2
        await h.scheduler.close()

    _run(scenario)


def test_queue_delay_holds_a_batch_open_until_it_reaches_the_preferred_size() -> None:
    async def scenario() -> None:
        instance = HeldInstance()
        instance.gate.set()
        # A delay far longer than the test: the batch can only leave by reaching its preferred size.
        h = Harness(_config("dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 60000000 }"), instance)
        h.submit("a")
        h.submit("b")
        for _ in range(50):
            await asyncio.sleep(0)
        assert instance.batches == []  # still waiting for a third request
        h.submit("c")
        await h.until(lambda: len(h.responses) == 3, "the batch left once full")
        assert instance.batches == [["a", "b", "c"]]
        await h.scheduler.close()

    _run(scenario)


def test_queue_delay_sends_a_partial_batch_once_the_oldest_request_has_waited() -> None:
    async def scenario() -> None:
        instance = HeldInstance()
        instance.gate.set()
        h = Harness(_config("dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 2000 }"), instance)
        h.submit("lonely")
        await h.until(lambda: "lonely" in h.responses, "sent after the delay")
        assert instance.batches == [["lonely"]]
        await h.scheduler.close()

    _run(scenario)


def test_a_sub_millisecond_queue_delay_holds_the_batch_open_for_a_request_within_it() -> None:
    """On the server's loop (uvloop, whose own timers count whole milliseconds and would send this batch on the next
    loop turn): a request 100 µs after the first joins its batch, as in Triton, which keeps the microseconds."""

    async def scenario() -> list[list[str]]:
        instance = HeldInstance()
        instance.gate.set()
        h = Harness(_config("dynamic_batching { max_queue_delay_microseconds: 400 }"), instance)
        for attempt in range(5):
            h.submit(f"first{attempt}")
            start = time.monotonic_ns()
            while time.monotonic_ns() - start < 100_000:
                await asyncio.sleep(0)  # the loop turns: the worker is waiting for the batch to fill
            h.submit(f"second{attempt}")
            answered = 2 * attempt + 2
            await h.until(lambda answered=answered: len(h.responses) == answered, "both answered")
        await h.scheduler.close()
        return instance.batches

    batches = uvloop.run(scenario())
    joined = sum(len(batch) == 2 for batch in batches)
    assert joined >= 3, batches  # most, allowing for a loaded machine that delays a turn past the 400 µs


def test_higher_priority_requests_are_batched_first() -> None:
    async def scenario() -> None:
        instance = HeldInstance()
        h = Harness(_config("dynamic_batching { priority_levels: 2 default_priority_level: 2 }", max_batch_size=2), instance)
        await h.hold_first(instance)
        h.submit("low1", priority=2)
        h.submit("low2", priority=2)
        h.submit("high", priority=1)
        instance.gate.set()
        await h.until(lambda: len(h.responses) == 4, "every request answered")
        assert instance.batches[1:] == [["high", "low1"], ["low2"]]
        await h.scheduler.close()

    _run(scenario)


def test_requests_with_different_shapes_never_share_a_batch() -> None:
    async def scenario() -> None:
        instance = HeldInstance()
        h = Harness(_config("dynamic_batching { }"), instance)
        await h.hold_first(instance)
        h.submit("w2a", width=2)
        h.submit("w3", width=3)
        h.submit("w2b", width=2)
        instance.gate.set()
        await h.until(lambda: len(h.responses) == 4, "every request answered")
        assert instance.batches[1:] == [["w2a", "w2b"], ["w3"]]  # the odd one waits, keeping its place
        await h.scheduler.close()

    _run(scenario)


def test_preserve_ordering_releases_responses_in_arrival_order() -> None:
    async def scenario() -> None:
        slow, fast = HeldInstance(), HeldInstance()
        fast.gate.set()
        h = Harness(_config("dynamic_batching { preserve_ordering: true }", max_batch_size=1, instances=2), slow, fast)
        h.submit("first")
        await asyncio.wait_for(slow.started.wait(), 10)
        h.submit("second")
        await h.until(lambda: fast.batches == [["second"]], "the second ran on the other instance")
        for _ in range(20):
            await asyncio.sleep(0)
        assert h.order == []  # finished, but held behind the first
        slow.gate.set()
        await h.until(lambda: len(h.order) == 2, "both answered")
        assert h.order == ["first", "second"]
        await h.scheduler.close()

    _run(scenario)


def test_a_wrong_response_count_fails_every_request_of_the_batch() -> None:
    async def scenario() -> None:
        instance = HeldInstance(answer=lambda requests: [])
        instance.gate.set()
        h = Harness(_config(""), instance)
        h.submit("a")
        await h.until(lambda: "a" in h.responses, "answered")
        error = h.responses["a"].error
        assert error is not None and error.status == Status.INTERNAL
        assert error.message == "model 'm' returned 0 responses for 1 requests"
        await h.scheduler.close()

    _run(scenario)


def test_a_backend_error_reaches_each_request_with_its_status() -> None:
    def refuse(requests: list[InferenceRequest]) -> list[InferenceResponse]:
        raise NereidError.unavailable("instance is restarting")

    async def scenario() -> None:
        instance = HeldInstance(answer=refuse)
        h = Harness(_config("dynamic_batching { }"), instance)
        await h.hold_first(instance)
        h.submit("a")
        h.submit("b")
        instance.gate.set()
        await h.until(lambda: len(h.responses) == 3, "every request answered")
        for rid in ("blocker", "a", "b"):
            error = h.responses[rid].error
            assert error is not None and (error.status, error.message) == (Status.UNAVAILABLE, "instance is restarting")
        await h.scheduler.close()

    _run(scenario)


def test_submit_after_close_is_refused() -> None:
    async def scenario() -> None:
        instance = HeldInstance()
        h = Harness(_config(""), instance)
        await h.scheduler.close()
        try:
            h.submit("late")
        except NereidError as exc:
            assert exc.status == Status.UNAVAILABLE and exc.message == "model 'm' is unloading"
        else:
            raise AssertionError("a closed scheduler took a request")

    _run(scenario)


class PipelinedInstance(HeldInstance):
    pipelined_batches = 2  # the capability: it takes a second batch while it runs one


def test_a_pipelined_instance_takes_the_next_batch_while_it_runs_one() -> None:
    async def scenario() -> None:
        instance = PipelinedInstance()
        h = Harness(_config("dynamic_batching { }"), instance)
        await h.hold_first(instance)
        h.submit("next")
        await h.until(lambda: len(instance.batches) == 2, "the second batch was handed over")
        assert h.stats.pending == 1  # still awaiting execution behind the first, as Triton counts it
        instance.gate.set()
        await h.until(lambda: len(h.responses) == 2, "both answered")
        assert h.stats.pending == 0
        await h.scheduler.close()

    _run(scenario)


class GatedGroupInstance(PipelinedInstance):
    """Takes the queued requests of a model without batching together (the capability), each answered on its own;
    a request whose id starts with 'bad' gets an error response."""

    group_limit = 8

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[list[str]] = []

    async def execute_group(self, requests: list[InferenceRequest]) -> list[tuple[InferenceResponse, ExecutionTimes]]:
        self.groups.append([r.id for r in requests])
        await self.gate.wait()
        answers = []
        for index, r in enumerate(requests):
            error = NereidError.invalid("asked to fail") if r.id.startswith("bad") else None
            answers.append((InferenceResponse(r.model_name, "1", r.id, error=error), ExecutionTimes(1, 10, 1, index)))
        return answers


_UNBATCHED = (
    'name: "m" backend: "python" max_batch_size: 0 input [ { name: "X" data_type: TYPE_FP32 dims: [ 1, -1 ] } ]'
)


def test_queued_requests_of_a_model_without_batching_go_to_the_instance_together_but_count_one_by_one() -> None:
    async def scenario() -> None:
        instance = GatedGroupInstance()
        h = Harness(_UNBATCHED, instance)
        await h.hold_first(instance)
        for n in range(12):
            h.submit("bad" if n == 3 else f"r{n}")
        await h.until(lambda: len(instance.groups) == 1, "the queued requests were handed over together")
        assert instance.groups[0] == ["r0", "r1", "r2", "bad", "r4", "r5", "r6", "r7"]  # group_limit, in order
        assert h.stats.pending == 12  # all still behind the blocker
        instance.gate.set()
        await h.until(lambda: len(h.responses) == 13, "every request answered")
        assert instance.groups[1] == ["r8", "r9", "r10", "r11"]
        assert instance.batches == [["blocker"]]
        assert h.responses["bad"].error is not None and h.responses["bad"].error.message == "asked to fail"
        assert all(r.error is None for rid, r in h.responses.items() if rid != "bad")
        assert (h.stats.execution_count, h.stats.inference_count) == (12, 12)  # one execution per success
        assert (h.stats.success.count, h.stats.fail.count) == (12, 1)
        assert h.stats.pending == 0
        await h.scheduler.close()

    _run(scenario)


def test_a_group_counts_the_requests_behind_its_first_as_pending_until_it_ends() -> None:
    async def scenario() -> None:
        instance = GatedGroupInstance()
        h = Harness(_UNBATCHED, instance)
        h.submit("r0")
        h.submit("r1")  # both queued before the idle instance's worker wakes: one group
        await h.until(lambda: len(instance.groups) == 1, "the two were handed over together")
        assert instance.groups[0] == ["r0", "r1"]
        assert h.stats.pending == 1  # r1 waits in the worker behind r0, as Triton counts a request behind a running one
        instance.gate.set()
        await h.until(lambda: len(h.responses) == 2, "both answered")
        assert h.stats.pending == 0
        await h.scheduler.close()

    _run(scenario)


def test_requests_that_arrive_together_go_to_idle_instances_before_forming_a_group() -> None:
    async def scenario() -> None:
        first, second = GatedGroupInstance(), GatedGroupInstance()
        h = Harness(_UNBATCHED, first, second)
        await asyncio.sleep(0)  # the instances' loops start and park, idle, as a running server's have
        h.submit("r0")
        h.submit("r1")  # both queued before either idle instance's loop runs

        def handed() -> list[list[str]]:
            return [*first.batches, *second.batches, *first.groups, *second.groups]

        await h.until(lambda: sum(map(len, handed())) == 2, "both handed over")
        assert first.groups == second.groups == []  # no group while another instance sat idle
        assert sorted(first.batches + second.batches) == [["r0"], ["r1"]]
        first.gate.set()
        second.gate.set()
        await h.until(lambda: len(h.responses) == 2, "both answered")
        await h.scheduler.close()

    _run(scenario)


@pytest.mark.parametrize(
    ("group_limit", "batching"),
    [
        (1, ""),  # the instance cannot now: e.g. a Python model whose execute() is a coroutine, or a slow one
        # A request handed over early could no longer time out in the queue: a queue policy keeps one at a time.
        (8, "dynamic_batching { default_queue_policy { default_timeout_microseconds: 60000000 } }"),
    ],
    ids=["instance-says-one", "queue-policy"],
)
def test_requests_go_one_at_a_time_where_groups_do_not_apply(group_limit: int, batching: str) -> None:
    async def scenario() -> None:
        instance = GatedGroupInstance()
        instance.group_limit = group_limit
        h = Harness(f"{_UNBATCHED} {batching}", instance)
        await h.hold_first(instance)
        for n in range(3):
            h.submit(f"r{n}")
        instance.gate.set()
        await h.until(lambda: len(h.responses) == 4, "every request answered")
        assert instance.groups == [] and [len(b) for b in instance.batches] == [1, 1, 1, 1]
        await h.scheduler.close()

    _run(scenario)


def test_a_removed_instance_finishes_its_batch_and_the_queue_moves_to_the_instance_added() -> None:
    async def scenario() -> None:
        old, new = HeldInstance(), HeldInstance()
        h = Harness(_config("", max_batch_size=0), old)
        await h.hold_first(old)
        h.submit("queued")
        gone = h.scheduler.remove_instance(old)
        h.scheduler.add_instance(new, InstanceLimits())  # type: ignore[arg-type]
        new.gate.set()
        await h.until(lambda: "queued" in h.responses, "the queued request served by the new instance")
        assert not gone.done()  # the removed instance still runs its batch
        old.gate.set()
        await asyncio.wait_for(gone, 10)
        assert old.batches == [["blocker"]] and new.batches == [["queued"]]
        assert h.responses["blocker"].error is None and h.responses["queued"].error is None
        h.submit("later")
        await h.until(lambda: "later" in h.responses, "later requests go to the new instance")
        assert new.batches[-1] == ["later"]
        await h.scheduler.close()

    _run(scenario)


def test_removing_an_idle_instance_is_immediate_and_the_others_serve_on() -> None:
    async def scenario() -> None:
        first, second = HeldInstance(), HeldInstance()
        first.gate.set()
        second.gate.set()
        h = Harness(_config("", max_batch_size=0, instances=2), first, second)
        for _ in range(20):
            await asyncio.sleep(0)  # both workers park idle
        await asyncio.wait_for(h.scheduler.remove_instance(first), 1)
        for n in range(3):
            h.submit(f"r{n}")
        await h.until(lambda: len(h.responses) == 3, "every request answered")
        assert first.batches == [] and sorted(sum(second.batches, [])) == ["r0", "r1", "r2"]
        await h.scheduler.close()

    _run(scenario)
