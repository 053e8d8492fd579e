"""Grammar-constrained decoding on the tiny random-weight model: whatever the random weights prefer, the masked
sampler produces JSON that parses and matches the schema, and the job ends with `stop` when the grammar is done."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import jsonschema
import pytest
import torch

from nereid.backends.llm.engine import ContinuousBatchingEngine, EngineLimits, GenerationJob, JobEvent
from nereid.backends.llm.llama_model import LlamaModel
from nereid.backends.llm.metrics import LlmMetrics
from nereid.backends.llm.sampling import parse_sampling_params
from nereid.backends.llm.structured_output import GrammarCompiler
from nereid.backends.llm.tiny_model import cached_tiny_model
from nereid.core.errors import NereidError

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "units": {"enum": ["metric", "imperial"]},
        "ok": {"type": "boolean"},
    },
    "required": ["city", "days", "units", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(cached_tiny_model()), local_files_only=True)


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def test_llm_constraint_masks_every_token_the_grammar_refuses(compiler: GrammarCompiler, tokenizer: Any) -> None:
    constraint = compiler.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    row = torch.zeros(len(tokenizer))
    constraint.apply(row)
    allowed = [t for t in range(len(tokenizer)) if row[t] == 0]
    # Only tokens that can begin the object survive: each decodes to text starting with '{'.
    assert allowed and all(tokenizer.decode([t]).startswith("{") for t in allowed)
    assert int(torch.isinf(row).sum()) == len(tokenizer) - len(allowed)
    done = False
    for token in tokenizer('{"a": 7}', add_special_tokens=False)["input_ids"]:
        done = constraint.advance(token)
    assert done and constraint.accepting


def test_llm_invalid_schema_is_a_client_error(compiler: GrammarCompiler) -> None:
    with pytest.raises(NereidError) as info:
        compiler.json_schema('{"type": "object", "properties": ')
    assert info.value.status.name == "INVALID_ARG" and "schema" in info.value.message


def _run(engine: ContinuousBatchingEngine, jobs: list[GenerationJob]) -> dict[int, list[JobEvent]]:
    events: dict[int, list[JobEvent]] = {id(j): [] for j in jobs}
    done = threading.Semaphore(0)
    lock = threading.Lock()

    def deliver(batch: list[JobEvent]) -> None:
        with lock:
            for event in batch:
                events[id(event.job)].append(event)
                if event.finished:
                    done.release()

    engine.deliver = deliver
    for job in jobs:
        engine.submit(job)
    for _ in jobs:
        assert done.acquire(timeout=60), "a constrained job did not finish"
    return events


def test_llm_constrained_jobs_produce_schema_valid_json_with_random_weights(compiler: GrammarCompiler, tokenizer: Any) -> None:
    limits = EngineLimits(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)
    engine = ContinuousBatchingEngine(
        LlamaModel(cached_tiny_model()), tokenizer.backend_tokenizer, limits, lambda e: None, LlmMetrics(8 * 256), [tokenizer.eos_token_id], "t", 1
    )
    try:
        prompt = tokenizer("Give me the weather as JSON")["input_ids"]
        jobs = []
        # Greedy, sampled with seeds, hot sampling and ignore_eos: the grammar decides the end every time; one
        # unconstrained job in the same batch is unaffected by its neighbours' masks.
        for values in ({"temperature": 0}, {"seed": 1}, {"seed": 2, "temperature": 1.5}, {"seed": 3, "ignore_eos": True}):
            job = GenerationJob(prompt, parse_sampling_params({"max_tokens": 120, **values}), False, lambda: False, time.monotonic_ns())
            job.constraint = compiler.json_schema(SCHEMA)
            jobs.append(job)
        free = GenerationJob(prompt, parse_sampling_params({"max_tokens": 20, "temperature": 0, "ignore_eos": True}), False, lambda: False, time.monotonic_ns())
        events = _run(engine, [*jobs, free])
        for job in jobs:
            final = events[id(job)][-1]
            assert final.finish_reason == "stop", (final.finish_reason, job.text)
            jsonschema.validate(json.loads(job.text), SCHEMA)
        assert events[id(free)][-1].finish_reason == "length" and len(free.output_ids) == 20
    finally:
        engine.close()
