"""Real vLLM as the engine, where `vllm` is installed on a machine with a GPU: the same model.json becomes
vLLM's AsyncEngineArgs (tensor/pipeline parallelism and Ray multi-node included), and vLLM's outputs become
the same `JobEvent`s Nereid's own engine produces. Elsewhere it refuses to start with a clear error."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from nereid.backends.llm.engine import GenerationJob, JobEvent
from nereid.backends.llm.engine_args import EngineArgs, vllm_engine_kwargs
from nereid.backends.llm.metrics import LlmMetrics
from nereid.backends.llm.tokenizer_loading import load_tokenizer
from nereid.core.errors import NereidError

__all__ = ["VllmEngine", "require_vllm"]

log = logging.getLogger("nereid.llm.vllm")


def require_vllm(where: str) -> Any:
    """The vllm module, or a clear error saying why it cannot be used here."""
    try:
        import vllm
    except ImportError:
        raise NereidError.unavailable(
            f"{where} model.json selects the vLLM engine, but the `vllm` package is not installed; install vllm on a "
            f"GPU machine, or set \"engine\": \"nereid\" (or leave it out) to use Nereid's own engine"
        ) from None
    try:
        import torch

        has_gpu = bool(torch.cuda.is_available())
    except Exception:
        has_gpu = False
    if not has_gpu:
        raise NereidError.unavailable(f"{where} the vLLM engine needs a CUDA GPU and none is visible to this process")
    return vllm


class VllmEngine:
    """vLLM's AsyncLLMEngine on an event loop of its own thread; jobs go in with run_coroutine_threadsafe."""

    def __init__(self, args: EngineArgs, deliver: Callable[[list[JobEvent]], None], where: str) -> None:
        require_vllm(where)
        from vllm import AsyncEngineArgs, AsyncLLMEngine

        self.deliver = deliver
        self._where = where
        kwargs = vllm_engine_kwargs(args)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="nereid-vllm", daemon=True)
        self._thread.start()

        async def start() -> Any:
            return AsyncLLMEngine.from_engine_args(AsyncEngineArgs(**kwargs))

        self._engine = asyncio.run_coroutine_threadsafe(start(), self._loop).result()
        self.tokenizer = load_tokenizer(kwargs["tokenizer"])
        config = asyncio.run_coroutine_threadsafe(self._engine.get_model_config(), self._loop).result()
        self.max_model_len = int(config.max_model_len)
        self.metrics = LlmMetrics(self.max_model_len * args.max_num_seqs)
        self._active: dict[str, GenerationJob] = {}

    def submit(self, job: GenerationJob) -> None:
        asyncio.run_coroutine_threadsafe(self._generate(job), self._loop)

    def _sampling(self, job: GenerationJob) -> Any:
        from vllm import SamplingParams

        p = job.params
        return SamplingParams(
            max_tokens=p.max_tokens,
            min_tokens=p.min_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k if p.top_k > 0 else -1,
            min_p=p.min_p,
            seed=p.seed,
            stop=p.stop or None,
            stop_token_ids=p.stop_token_ids or None,
            include_stop_str_in_output=p.include_stop_str_in_output,
            ignore_eos=p.ignore_eos,
            repetition_penalty=p.repetition_penalty,
            presence_penalty=p.presence_penalty,
            frequency_penalty=p.frequency_penalty,
            logprobs=p.logprobs,
            skip_special_tokens=p.skip_special_tokens,
            logit_bias=p.logit_bias or None,
        )

    async def _generate(self, job: GenerationJob) -> None:
        request_id = uuid.uuid4().hex
        self.metrics.waiting += 1  # on vLLM's loop thread, like every other update of these figures
        sent = 0
        tokens = 0
        try:
            stream = self._engine.generate({"prompt_token_ids": job.prompt_ids}, self._sampling(job), request_id)
            self.metrics.waiting -= 1
            self.metrics.running += 1
            async for output in stream:
                if job.cancelled():
                    await self._engine.abort(request_id)
                    self.deliver([JobEvent(job, "", [], None, True, "cancelled")])
                    return
                completion = output.outputs[0]
                now = time.monotonic_ns()
                if tokens == 0 and completion.token_ids:
                    self.metrics.observe_ttft((now - job.arrival_ns) / 1e9)
                new_ids = list(completion.token_ids[tokens:])
                tokens = len(completion.token_ids)
                job.output_ids = list(completion.token_ids)
                job.text = completion.text
                self.metrics.generation_tokens += len(new_ids)
                finished = bool(output.finished)
                if not job.stream and not finished:
                    continue
                delta = completion.text[sent:]
                sent = len(completion.text)
                logprobs = None
                if job.params.logprobs is not None and completion.logprobs:
                    logprobs = []
                    for token, entry in zip(new_ids, completion.logprobs[-len(new_ids):] if new_ids else []):
                        chosen = entry.get(token)
                        top = sorted(((t, lp.logprob) for t, lp in entry.items() if t != token), key=lambda x: -x[1])
                        logprobs.append((token, chosen.logprob if chosen else 0.0, top))
                if completion.cumulative_logprob is not None:
                    job.cumulative_logprob = completion.cumulative_logprob
                reason = completion.finish_reason if finished else None
                self.deliver([JobEvent(job, delta, new_ids, logprobs, finished, reason)])
        except Exception as exc:
            log.exception("%s vLLM generation failed", self._where)
            self.deliver([JobEvent(job, "", [], None, True, "error", f"vLLM failed: {exc}")])
        finally:
            self.metrics.running = max(self.metrics.running - 1, 0)

    def close(self) -> None:
        try:
            shutdown = getattr(self._engine, "shutdown", None)
            if shutdown is not None:
                self._loop.call_soon_threadsafe(shutdown)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
