"""Nereid's continuous-batching engine on the tiny random-weight model, without a server: batching must not
change what each sequence gets, chunked prefill must not either, and finished or cancelled sequences leave."""

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
from nereid.backends.llm.sampling import SamplingParams, parse_sampling_params
from tests.unit.backends.llm.engine_harness import Collector, greedy_job


@pytest.fixture
def engine(folder: Path, tokenizer: Any) -> Iterator[tuple[ContinuousBatchingEngine, Collector]]:
    collector = Collector()
    limits = EngineLimits(max_num_seqs=6, max_num_batched_tokens=24, max_model_len=256)
    metrics = LlmMetrics(6 * 256)
    eng = ContinuousBatchingEngine(
        LlamaModel(folder), tokenizer.backend_tokenizer, limits, collector.deliver, metrics, [tokenizer.eos_token_id], "test", threads=1
    )
    yield eng, collector
    eng.close()


def _run(eng: ContinuousBatchingEngine, collector: Collector, jobs: list[GenerationJob]) -> list[list[JobEvent]]:
    for job in jobs:
        collector.watch(job)
        eng.submit(job)
    return [collector.wait(job) for job in jobs]


def _prompts(tokenizer: Any, count: int) -> list[list[int]]:
    words = ["the server", "a model of", "how is it", "what you", "and to the", "tell me", "in the end", "it is"]
    return [tokenizer(f"{words[i % len(words)]} number {i} " * (1 + i % 4))["input_ids"] for i in range(count)]


def test_llm_engine_batched_sequences_get_exactly_their_solo_tokens(engine: Any, tokenizer: Any) -> None:
    eng, collector = engine
    prompts = _prompts(tokenizer, 10)
    solo = []
    for ids in prompts:
        job = greedy_job(ids)
        _run(eng, collector, [job])
        solo.append(list(job.output_ids))
    # Ten at once through six slots and a 24-token budget: waiting, chunked prefill and slot compaction.
    jobs = [greedy_job(ids) for ids in prompts]
    events = _run(eng, collector, jobs)
    for job, expected, job_events in zip(jobs, solo, events):
        assert job.output_ids == expected
        streamed = "".join(e.text for e in job_events)
        assert streamed == job.text
        assert job_events[-1].finished and job_events[-1].finish_reason == "length"
        assert sum(len(e.token_ids) for e in job_events) == 12


def test_llm_engine_long_prompt_is_prefilled_in_chunks_without_changing_results(engine: Any, tokenizer: Any) -> None:
    eng, collector = engine
    long_ids = tokenizer("the server and the model " * 30)["input_ids"]
    assert len(long_ids) > 3 * 24
    solo = greedy_job(long_ids, max_tokens=8)
    _run(eng, collector, [solo])
    short = greedy_job(_prompts(tokenizer, 1)[0], max_tokens=40)
    collector.watch(short)
    eng.submit(short)
    deadline = time.monotonic() + 30
    while len(short.output_ids) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    during = len(short.output_ids)
    eng.blocks.reset_prefix_cache()  # the solo run's blocks are cached: forget them, so the prompt is computed again
    chunked = greedy_job(long_ids, max_tokens=8)
    _run(eng, collector, [chunked])
    collector.wait(short)
    assert chunked.output_ids == solo.output_ids
    # The running stream kept producing tokens while the long prompt was prefilled chunk by chunk.
    assert during >= 3 and len(short.output_ids) == 40


def test_llm_engine_caps_prompt_tokens_per_step_while_streams_decode(folder: Path, tokenizer: Any) -> None:
    """With streams decoding, a joining prompt is prefilled at most max(cap, decoding rows, backlog / 4)
    tokens per step, and the chunking changes no token."""
    collector = Collector()
    # No prefix cache: the joining prompt equals the first one, and must be computed again, chunk by chunk.
    limits = EngineLimits(
        max_num_seqs=4, max_num_batched_tokens=256, max_model_len=256, max_prefill_tokens_while_decoding=8, enable_prefix_caching=False
    )
    eng = ContinuousBatchingEngine(
        LlamaModel(folder), tokenizer.backend_tokenizer, limits, collector.deliver, LlmMetrics(4 * 256), [tokenizer.eos_token_id], "cap", threads=1
    )
    steps: list[tuple[int, int]] = []
    forward = eng.model.forward

    def recording(step: Any) -> Any:
        steps.append((step.n_decode, sum(length for _slot, _start, length in step.prefills)))
        return forward(step)

    eng.model.forward = recording  # type: ignore[method-assign]
    try:
        long_ids = tokenizer("the server and the model " * 6)["input_ids"]
        assert 16 < len(long_ids) < 36  # a backlog under 4 x 9 tokens: the cap of 8 holds for every chunk
        solo = greedy_job(long_ids, max_tokens=4)
        _run(eng, collector, [solo])
        assert steps[0] == (0, len(long_ids))  # alone, a prompt goes in whole
        runner = greedy_job(_prompts(tokenizer, 1)[0], max_tokens=40)
        collector.watch(runner)
        eng.submit(runner)
        while len(runner.output_ids) < 2:
            time.sleep(0.002)
        steps.clear()
        joined = greedy_job(long_ids, max_tokens=4)
        _run(eng, collector, [joined])
        collector.wait(runner)
    finally:
        eng.close()
    assert joined.output_ids == solo.output_ids
    prefill_steps = [(nd, prefill) for nd, prefill in steps if prefill]
    assert len(prefill_steps) >= len(long_ids) // 8
    assert all(prefill <= max(8, nd) for nd, prefill in prefill_steps if nd)


def test_llm_engine_streams_one_event_per_token_even_while_text_is_held_back(engine: Any, tokenizer: Any) -> None:
    """A token whose text is held back (a stop string could be forming) still gets its event at once, so a
    streaming client sees every token as it is made."""
    eng, collector = engine
    job = greedy_job(_prompts(tokenizer, 1)[0], max_tokens=16, stop=["\x00never\x00"])
    events = _run(eng, collector, [job])[0]
    assert [len(e.token_ids) for e in events] == [1] * 16
    assert "".join(e.text for e in events) == job.text


def test_llm_engine_cancelled_sequence_leaves_its_slot(engine: Any, tokenizer: Any) -> None:
    eng, collector = engine
    flag = threading.Event()
    job = greedy_job(_prompts(tokenizer, 1)[0], cancelled=flag.is_set, max_tokens=200)
    collector.watch(job)
    eng.submit(job)
    deadline = time.monotonic() + 30
    while len(job.output_ids) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert eng.metrics.running == 1
    flag.set()
    events = collector.wait(job)
    assert events[-1].finish_reason == "cancelled"
    assert len(job.output_ids) < 200
    assert eng.metrics.running == 0 and not eng._running
    assert eng.blocks.num_used == 0 and eng.metrics.kv_blocks_used == 0  # its KV blocks went back to the pool at once


def test_llm_engine_stop_strings_cut_the_text_and_hold_back_partial_matches(engine: Any, tokenizer: Any) -> None:
    eng, collector = engine
    ids = _prompts(tokenizer, 2)[1]
    free = greedy_job(ids, max_tokens=30)
    _run(eng, collector, [free])
    text = free.text
    stop = text[6:9]
    assert len(stop) == 3
    cut = text.index(stop)
    stopped = greedy_job(ids, max_tokens=30, stop=[stop])
    events = _run(eng, collector, [stopped])[0]
    assert stopped.text == text[:cut]
    assert "".join(e.text for e in events) == text[:cut]
    assert events[-1].finish_reason == "stop"
    kept = greedy_job(ids, max_tokens=30, stop=[stop], include_stop_str_in_output=True)
    _run(eng, collector, [kept])
    assert kept.text == text[: cut + len(stop)]


def test_llm_engine_seeded_sampling_is_reproducible_and_min_tokens_holds_eos(engine: Any, tokenizer: Any) -> None:
    eng, collector = engine
    ids = _prompts(tokenizer, 3)[2]
    a, b, c = (greedy_job(ids, temperature=1.0, top_p=0.9, seed=s, max_tokens=16) for s in (7, 7, 8))
    _run(eng, collector, [a, b, c])
    assert a.output_ids == b.output_ids
    assert a.output_ids != c.output_ids
    eos = tokenizer.eos_token_id
    held = greedy_job(ids, ignore_eos=False, min_tokens=10, max_tokens=10, stop_token_ids=[a.output_ids[0]], temperature=1.0, seed=3)
    _run(eng, collector, [held])
    assert len(held.output_ids) == 10 and eos not in held.output_ids and a.output_ids[0] not in held.output_ids


def test_llm_engine_logprobs_are_the_models_distribution(engine: Any, tokenizer: Any) -> None:
    eng, collector = engine
    job = greedy_job(_prompts(tokenizer, 1)[0], max_tokens=4, logprobs=3)
    events = _run(eng, collector, [job])[0]
    entries = [entry for e in events for entry in (e.logprobs or [])]
    assert [token for token, _lp, _top in entries] == job.output_ids
    for token, logprob, top in entries:
        assert len(top) == 3 and logprob <= 0
        # Greedy: the chosen token is the most likely one.
        assert top[0][0] == token and abs(top[0][1] - logprob) < 1e-5


def test_llm_engine_runs_at_most_max_num_seqs_and_the_rest_wait(engine: Any, tokenizer: Any) -> None:
    eng, collector = engine
    jobs = [greedy_job(ids, max_tokens=24) for ids in _prompts(tokenizer, 8)]
    for job in jobs:
        collector.watch(job)
        eng.submit(job)
    # (running, waiting) pairs. The engine may start the first jobs while the rest are still being submitted,
    # and those count as waiting then, so only the pairs say whether the limit held.
    seen: set[tuple[int, int]] = set()
    while not all(collector.done[id(job)].is_set() for job in jobs):
        seen.add((eng.metrics.running, eng.metrics.waiting))
        time.sleep(0.001)
    assert max(running for running, _ in seen) == 6, seen
    assert (6, 2) in seen, seen
    assert eng.metrics.running == 0 and eng.metrics.waiting == 0
    assert all(len(job.output_ids) == 24 for job in jobs)


def test_llm_sampling_parameters_are_validated_with_clear_errors() -> None:
    from nereid.core.errors import NereidError

    params = parse_sampling_params({"temperature": "0.5", "max_tokens": "7", "stop": "x", "ignore_eos": "true", "unknown": 1})
    assert params == SamplingParams(temperature=0.5, max_tokens=7, stop=["x"], ignore_eos=True)
    assert parse_sampling_params({}).max_tokens == 16  # vLLM's default
    assert parse_sampling_params({"max_tokens": None}).max_tokens is None  # up to the context
    for bad, word in (({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens"), ({"temperature": "hot"}, "temperature"), ({"n": 2}, "'n'")):
        with pytest.raises(NereidError) as info:
            parse_sampling_params(bad, "[model 'm' version 1]")
        assert word in info.value.message and info.value.message.startswith("[model 'm' version 1]")


def test_llm_top_k_and_top_p_keep_only_the_allowed_tokens() -> None:
    from nereid.backends.llm.sampling import SamplerRow, sample_rows

    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]] * 2)
    rows = [
        SamplerRow(SamplingParams(temperature=1.0, top_k=2), [], [], torch.Generator().manual_seed(0), []),
        SamplerRow(SamplingParams(temperature=1.0, top_p=0.5), [], [], torch.Generator().manual_seed(1), []),
    ]
    seen: list[set[int]] = [set(), set()]
    for _ in range(200):
        tokens, _ = sample_rows(logits, rows)
        for i, t in enumerate(tokens):
            seen[i].add(t)
    assert seen[0] == {0, 1}
    assert seen[1] == {0}  # p(token 0) = 0.64 already reaches top_p 0.5


def test_llm_engine_a_character_cut_by_the_token_limit_ends_the_text_as_a_whole_decode_does(engine: Any, tokenizer: Any) -> None:
    """The last token allowed may be the first byte of a multi-byte character: the decoder holds it back, and the
    finished text must still end with it (U+FFFD), as the tokens' own texts and a whole decode have it."""
    from tokenizers.decoders import DecodeStream

    eng, _ = engine
    word, first_byte = tokenizer.convert_tokens_to_ids("a"), tokenizer.convert_tokens_to_ids("\u00e2")  # byte 0xE2
    assert first_byte != tokenizer.unk_token_id
    job = greedy_job([word], max_tokens=2)
    job.max_tokens, job.decoder = 2, DecodeStream(ids=[], skip_special_tokens=True)
    eng._append(job, word, None, time.monotonic_ns())
    assert job.text == "a"
    event = eng._append(job, first_byte, None, time.monotonic_ns())
    assert event is not None and event.finished and event.finish_reason == "length"
    assert job.text == tokenizer.decode([word, first_byte]) == "a\ufffd"
