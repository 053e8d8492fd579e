"""The engine over its paged KV cache on the tiny random-weight model: greedy tokens equal transformers', a
shared prefix is computed once, a pool too small for the running set preempts and still gives every sequence
exactly its tokens, a sequence larger than the pool fails clearly, and the waiting queue's bound, priorities
and fairness between users hold."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from nereid.backends.llm.engine import ContinuousBatchingEngine, EngineLimits, GenerationJob, JobEvent
from nereid.backends.llm.llama_model import LlamaModel
from nereid.backends.llm.metrics import LlmMetrics
from nereid.core.errors import NereidError, Status
from tests.unit.backends.llm.engine_harness import Collector, greedy_job


@pytest.fixture(scope="module")
def model(folder: Path) -> LlamaModel:
    return LlamaModel(folder)


def _engine(model: LlamaModel, tokenizer: Any, collector: Collector, **limits: Any) -> ContinuousBatchingEngine:
    settings: dict[str, Any] = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "max_model_len": 256, "block_size": 4}
    settings.update(limits)
    metrics = LlmMetrics(1)
    return ContinuousBatchingEngine(
        model, tokenizer.backend_tokenizer, EngineLimits(**settings), collector.deliver, metrics, [tokenizer.eos_token_id], "test", threads=1
    )


@pytest.fixture
def collector() -> Collector:
    return Collector()


def _run(eng: ContinuousBatchingEngine, collector: Collector, jobs: list[GenerationJob]) -> list[list[JobEvent]]:
    for job in jobs:
        collector.watch(job)
        eng.submit(job)
    return [collector.wait(job) for job in jobs]


SYSTEM = "You are a helpful assistant of the server. Answer in the shortest way you can, and be kind. "


def _prompts(tokenizer: Any, count: int, shared: str = "") -> list[list[int]]:
    words = ["the server", "a model of", "how is it", "what you", "and to the", "tell me"]
    return [tokenizer(shared + f"{words[i % len(words)]} number {i} " * (1 + i % 3))["input_ids"] for i in range(count)]


@pytest.fixture(scope="module")
def reference(folder: Path, tokenizer: Any) -> Any:
    """Greedy continuations computed by transformers' own Llama, one token at a time over the whole sequence."""
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(str(folder), local_files_only=True, torch_dtype=torch.float32).eval()

    def greedy(ids: list[int], count: int) -> list[int]:
        sequence = list(ids)
        with torch.inference_mode():
            for _ in range(count):
                logits = hf(torch.tensor([sequence])).logits[0, -1]
                sequence.append(int(logits.argmax()))
        return sequence[len(ids) :]

    return greedy


@pytest.fixture
def engine(model: LlamaModel, tokenizer: Any, collector: Collector) -> Iterator[ContinuousBatchingEngine]:
    eng = _engine(model, tokenizer, collector)
    yield eng
    eng.close()


def test_llm_paged_engine_greedy_tokens_equal_transformers_with_and_without_prefix_hits(
    engine: ContinuousBatchingEngine, collector: Collector, tokenizer: Any, reference: Any
) -> None:
    prompts = _prompts(tokenizer, 4, shared=SYSTEM)
    expected = [reference(ids, 12) for ids in prompts]
    cold = [greedy_job(ids) for ids in prompts]
    _run(engine, collector, cold[:1])  # alone first, so the others find the system prompt's blocks cached
    _run(engine, collector, cold[1:])
    assert [job.output_ids for job in cold] == expected
    shared_blocks = len(tokenizer(SYSTEM)["input_ids"]) // 4 - 1
    assert engine.metrics.prefix_cache_hits >= 3 * shared_blocks * 4
    # Again, all at once: the whole prompts are cached now; only their last tokens are computed.
    hits_before = engine.metrics.prefix_cache_hits
    warm = [greedy_job(ids) for ids in prompts]
    _run(engine, collector, warm)
    assert [job.output_ids for job in warm] == expected
    assert engine.metrics.prefix_cache_hits - hits_before >= sum((len(ids) - 1) // 4 * 4 for ids in prompts)
    assert engine.metrics.prefix_cache_queries >= engine.metrics.prefix_cache_hits > 0
    assert engine.blocks.num_used == 0  # every finished sequence gave its blocks back


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_llm_engine_preempts_when_the_pool_is_too_small_and_every_sequence_still_gets_its_tokens(
    model: LlamaModel, tokenizer: Any, prefix_caching: bool
) -> None:
    prompts = _prompts(tokenizer, 6)
    roomy = Collector()
    eng = _engine(model, tokenizer, roomy, enable_prefix_caching=False)
    try:
        expected_jobs = [greedy_job(ids, max_tokens=24) for ids in prompts]
        _run(eng, roomy, expected_jobs)
        assert eng.metrics.num_preemptions == 0
    finally:
        eng.close()
    # About 40 tokens per sequence: 16 blocks of 4 hold fewer than two of the six running at once.
    tight = Collector()
    eng = _engine(model, tokenizer, tight, num_blocks=16, enable_prefix_caching=prefix_caching)
    try:
        jobs = [greedy_job(ids, max_tokens=24) for ids in prompts]
        events = _run(eng, tight, jobs)
        assert eng.metrics.num_preemptions > 0
        assert eng.blocks.num_used == 0
    finally:
        eng.close()
    for job, want, job_events in zip(jobs, expected_jobs, events):
        assert job.output_ids == want.output_ids
        assert job_events[-1].finish_reason == "length"
        assert [t for e in job_events for t in e.token_ids] == want.output_ids  # each token streamed once
        assert "".join(e.text for e in job_events) == want.text


def test_llm_engine_shared_prefixes_under_preemption_and_cancellation_keep_tokens_and_refcounts_right(
    model: LlamaModel, tokenizer: Any
) -> None:
    prompts = _prompts(tokenizer, 8, shared=SYSTEM)
    roomy = Collector()
    eng = _engine(model, tokenizer, roomy, enable_prefix_caching=False)
    try:
        expected = [greedy_job(ids, max_tokens=16) for ids in prompts]
        _run(eng, roomy, expected)
    finally:
        eng.close()
    tight = Collector()
    eng = _engine(model, tokenizer, tight, num_blocks=40, max_num_batched_tokens=32)
    gone = threading.Event()
    try:
        jobs = [greedy_job(ids, max_tokens=16) for ids in prompts]
        doomed = [greedy_job(ids, max_tokens=100, cancelled=gone.is_set) for ids in prompts[:3]]
        for job in doomed + jobs:
            tight.watch(job)
            eng.submit(job)
        deadline = time.monotonic() + 60
        while not any(job.output_ids for job in jobs):
            assert time.monotonic() < deadline
            time.sleep(0.002)
        gone.set()  # three clients go away mid-stream
        events = [tight.wait(job) for job in jobs]
        assert all(tight.wait(job)[-1].finish_reason == "cancelled" for job in doomed)
        assert eng.metrics.num_preemptions > 0 and eng.metrics.prefix_cache_hits > 0
        # Every reference is gone: nothing is in use, and every cached block is back in the evictable set.
        assert eng.blocks.num_used == 0 and all(eng.blocks.refcount(b) == 0 for b in range(eng.blocks.num_blocks))
    finally:
        gone.set()
        eng.close()
    for job, want, job_events in zip(jobs, expected, events):
        assert job.output_ids == want.output_ids
        assert [t for e in job_events for t in e.token_ids] == want.output_ids


def test_llm_engine_sequence_larger_than_the_pool_fails_clearly(model: LlamaModel, tokenizer: Any, collector: Collector) -> None:
    eng = _engine(model, tokenizer, collector, num_blocks=6)  # 24 tokens
    try:
        with pytest.raises(NereidError) as info:
            eng.submit(greedy_job(list(range(10, 40))))
        assert info.value.status is Status.INVALID_ARG and "whole KV cache holds 24 tokens" in info.value.message
        grows = greedy_job(_prompts(tokenizer, 1)[0], max_tokens=40)
        small = greedy_job(_prompts(tokenizer, 1)[0], max_tokens=4)
        events = _run(eng, collector, [grows, small])
        assert events[0][-1].finish_reason == "error" and "more than the whole KV cache holds" in str(events[0][-1].error)
        assert events[1][-1].finish_reason == "length"  # the others carry on
        assert eng.blocks.num_used == 0
    finally:
        eng.close()


def _blocker(tokenizer: Any, flag: threading.Event) -> GenerationJob:
    return greedy_job(_prompts(tokenizer, 1)[0], cancelled=flag.is_set, max_tokens=200, user="blocker")


def _wait_running(eng: ContinuousBatchingEngine, job: GenerationJob) -> None:
    deadline = time.monotonic() + 60
    while not job.output_ids:
        assert time.monotonic() < deadline
        time.sleep(0.002)


def test_llm_engine_refuses_past_the_waiting_queue_bound_and_frees_a_cancelled_waiter(
    model: LlamaModel, tokenizer: Any, collector: Collector
) -> None:
    eng = _engine(model, tokenizer, collector, max_num_seqs=1, max_num_queued_reqs=2)
    flag = threading.Event()
    try:
        blocker = _blocker(tokenizer, flag)
        collector.watch(blocker)
        eng.submit(blocker)
        _wait_running(eng, blocker)
        waiter_flag = threading.Event()
        waiters = [greedy_job(ids, cancelled=waiter_flag.is_set) for ids in _prompts(tokenizer, 2)]
        for job in waiters:
            collector.watch(job)
            eng.submit(job)
        with pytest.raises(NereidError) as info:
            eng.submit(greedy_job(_prompts(tokenizer, 1)[0]))
        assert info.value.status is Status.UNAVAILABLE and info.value.retry_after is not None
        assert "max_num_queued_reqs" in info.value.message and eng.metrics.refused == 1
        waiter_flag.set()  # the waiting clients go away: their places free up
        for job in waiters:
            assert collector.wait(job)[-1].finish_reason == "cancelled"
        late = greedy_job(_prompts(tokenizer, 1)[0], max_tokens=2)
        collector.watch(late)
        eng.submit(late)
        flag.set()
        assert collector.wait(late)[-1].finish_reason == "length"
    finally:
        flag.set()
        eng.close()


def test_llm_engine_admits_by_priority_then_round_robin_between_users(model: LlamaModel, tokenizer: Any, collector: Collector) -> None:
    eng = _engine(model, tokenizer, collector, max_num_seqs=1)
    flag = threading.Event()
    try:
        blocker = _blocker(tokenizer, flag)
        collector.watch(blocker)
        eng.submit(blocker)
        _wait_running(eng, blocker)
        ids = _prompts(tokenizer, 1)[0]
        heavy = [greedy_job(ids, max_tokens=2, user="heavy") for _ in range(4)]
        light = greedy_job(ids, max_tokens=2, user="light")
        late_urgent = greedy_job(ids, max_tokens=2, user="boss", priority=-5)
        queued = [*heavy, light, late_urgent]
        for job in queued:
            collector.watch(job)
            eng.submit(job)
        flag.set()  # the blocker leaves; the queue drains one at a time
        for job in queued:
            collector.wait(job)
    finally:
        flag.set()
        eng.close()
    order = [job for job in collector.started if job is not blocker]
    # The urgent request first though it came last; then the users take turns (one job at a time runs here, so
    # the user served least recently goes next): one user's backlog does not starve the other.
    assert order == [late_urgent, heavy[0], light, heavy[1], heavy[2], heavy[3]]


def test_llm_model_decode_reads_a_shared_prefix_once_with_the_same_logits(model: LlamaModel) -> None:
    """Decode rows whose tables start with the same blocks: attention over the shared blocks read once and
    merged with each row's own blocks gives the logits of reading every row's blocks whole."""
    from nereid.backends.llm.llama_model import DecodeGroup, StepBatch

    bs = 4
    model.allocate_cache(16, bs)
    model.zero_blocks_below(16)
    prefix = list(range(20, 32))  # 12 tokens: blocks 0, 1, 2
    tails = [[40, 41, 42, 43, 44], [50, 51]]
    tables = [[0, 1, 2, 3, 4], [0, 1, 2, 5]]

    def chunk(tokens: list[int], table: list[int], start: int) -> None:
        positions = list(range(start, start + len(tokens)))
        slots = [table[p // bs] * bs + p % bs for p in positions]
        model.forward(StepBatch(
            torch.tensor(tokens), torch.tensor(positions), torch.tensor(slots), 0, torch.empty(0, dtype=torch.long),
            [], [(torch.tensor(table), start, len(tokens))], torch.tensor([len(tokens) - 1]),
        ))

    chunk(prefix, tables[0], 0)
    for tail, table in zip(tails, tables):
        chunk(tail, table, len(prefix))  # each sequence's own tokens after the shared prefix
    positions = [len(prefix) + len(tail) for tail in tails]
    slots = [table[p // bs] * bs + p % bs for table, p in zip(tables, positions)]
    def decode(*groups: tuple[int, int, list[int], list[list[int]]]) -> torch.Tensor:
        return model.forward(StepBatch(
            torch.tensor([7, 8]), torch.tensor(positions), torch.tensor(slots), 2, torch.tensor(positions) + 1,
            [DecodeGroup(first, end, torch.tensor(shared, dtype=torch.long), torch.tensor(own)) for first, end, shared, own in groups],
            [], torch.tensor([0, 1]),
        ))

    whole = decode((0, 2, [], [tables[0], tables[1] + [0]]))
    cascaded = decode((0, 2, [0, 1, 2], [[3, 4], [5, 0]]))
    assert torch.allclose(whole, cascaded, atol=1e-5), float((whole - cascaded).abs().max())
    # A group of one row beside a row in no group, each read at its own width, reads the same too.
    partly = decode((0, 1, [0, 1, 2], [[3, 4]]), (1, 2, [], [tables[1]]))
    assert torch.allclose(whole, partly, atol=1e-5), float((whole - partly).abs().max())
    assert not torch.allclose(whole[0], whole[1])  # the rows differ: the comparison means something
