"""Nereid's continuous-batching engine: one thread runs decode steps over a Llama-family model, with
requests joining at the next step, leaving at once when finished or cancelled, and long prompts prefilled
in chunks inside a per-step token budget so that running streams keep getting tokens.

The engine sees token ids and sampling parameters, never wire formats: each step it hands a list of
`JobEvent`s to the `deliver` callback (on the engine thread) and the backend turns them into responses.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from nereid.backends.llm.llama_model import LlamaModel, StepBatch
from nereid.backends.llm.metrics import LlmMetrics
from nereid.backends.llm.sampling import SamplerRow, SamplingParams, sample_rows

__all__ = ["GenerationJob", "JobEvent", "ContinuousBatchingEngine", "EngineLimits"]

log = logging.getLogger("nereid.llm")


@dataclass(slots=True)
class EngineLimits:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 256
    max_model_len: int = 2048
    max_prefill_tokens_while_decoding: int = 32  # 0: only max_num_batched_tokens bounds a step's prompt tokens


@dataclass(slots=True)
class JobEvent:
    """What one step produced for one job: new text (held back near a possible stop string), the new
    tokens, their logprobs, and whether and why the job finished."""

    job: GenerationJob
    text: str
    token_ids: list[int]
    logprobs: list[tuple[int, float, list[tuple[int, float]]]] | None
    finished: bool = False
    finish_reason: str | None = None  # stop | length | cancelled | error
    error: str | None = None


@dataclass(eq=False)
class GenerationJob:
    """A request inside the engine. Created by the backend; the engine owns everything below `context`."""

    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    cancelled: Callable[[], bool]
    arrival_ns: int
    context: Any = None  # the backend's own (the request and its response options)
    max_tokens: int = 0  # set by the engine: max_tokens clamped to the context
    output_ids: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose keys and values are in the cache
    slot: int = -1
    decoding: bool = False
    text: str = ""
    sent: int = 0  # characters of `text` already handed out
    pending_tokens: list[int] = field(default_factory=list)
    pending_logprobs: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)
    generator: torch.Generator | None = None
    decoder: Any = None
    held_ids: list[int] = field(default_factory=list)  # tokens the decoder holds back (an incomplete character)
    block_ids: list[int] = field(default_factory=list)
    first_token_ns: int = 0
    last_token_ns: int = 0
    cumulative_logprob: float = 0.0
    constraint: Any = None  # structured output (structured_output.JsonConstraint): masks the logits, advanced per token


class ContinuousBatchingEngine:
    def __init__(
        self,
        model: LlamaModel,
        tokenizer: Any,
        limits: EngineLimits,
        deliver: Callable[[list[JobEvent]], None],
        metrics: LlmMetrics,
        eos_ids: list[int],
        name: str = "llm",
        threads: int = 0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer (the fast tokenizer's backend)
        self.limits = limits
        self.deliver = deliver
        self.metrics = metrics
        self.eos_ids = eos_ids
        self._threads = threads
        self._inbox: collections.deque[GenerationJob] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        self._waiting: collections.deque[GenerationJob] = collections.deque()
        self._slots: list[GenerationJob] = []  # decode jobs first, then prefilling jobs
        self._n_decode = 0
        self._initialised_slots = 0
        model.allocate_cache(limits.max_num_seqs, limits.max_model_len)
        self._thread = threading.Thread(target=self._run, name=f"nereid-llm-{name}", daemon=True)
        self._thread.start()

    # -- any thread ------------------------------------------------------------------------------
    def submit(self, job: GenerationJob) -> None:
        self._inbox.append(job)
        self._wake.set()

    def close(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    # -- the engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        if self._threads > 0:
            torch.set_num_threads(self._threads)
        while True:
            try:
                while self._inbox:
                    self._waiting.append(self._prepare(self._inbox.popleft()))
                if self._stopping:
                    self._abort_all("the model is unloading")
                    return
                events: list[JobEvent] = []
                self._drop_cancelled(events)
                if not self._slots and not self._waiting:
                    self.metrics.waiting = len(self._inbox)
                    self.metrics.running = 0
                    if events:
                        self.deliver(events)
                    self._wake.wait()
                    self._wake.clear()
                    continue
                self._step(events)
                if events:
                    self.deliver(events)
            except Exception as exc:  # a bug must fail the jobs in flight, never kill the engine silently
                log.exception("LLM engine step failed")
                self._abort_all(f"engine step failed: {type(exc).__name__}: {exc}")

    def _prepare(self, job: GenerationJob) -> GenerationJob:
        from tokenizers.decoders import DecodeStream

        params = job.params
        room = self.limits.max_model_len - len(job.prompt_ids)
        job.max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        if params.seed is not None:
            job.generator = torch.Generator().manual_seed(params.seed)
        # Prime the incremental decoder with the prompt's tail so the first word's spacing is right.
        tail = job.prompt_ids[-4:]
        job.decoder = DecodeStream(ids=tail, skip_special_tokens=params.skip_special_tokens)
        job.block_ids = [] if params.min_tokens == 0 else list(params.stop_token_ids) + ([] if params.ignore_eos else self.eos_ids)
        return job

    def _abort_all(self, message: str) -> None:
        events = [
            JobEvent(job, "", [], None, True, "error", message)
            for job in list(self._slots) + list(self._waiting) + list(self._inbox)
        ]
        self._slots.clear()
        self._waiting.clear()
        self._inbox.clear()
        self._n_decode = 0
        self.metrics.running = 0
        self.metrics.waiting = 0
        if events:
            self.deliver(events)

    def _drop_cancelled(self, events: list[JobEvent]) -> None:
        """A cancelled job leaves its slot (and KV cache) before the next step."""
        gone = [job for job in self._slots if job.cancelled()]
        if gone:
            self._release(set(gone), [])
            self.metrics.running = len(self._slots)
            self.metrics.kv_used_tokens = sum(job.computed for job in self._slots)
            events.extend(JobEvent(job, "", [], None, True, "cancelled") for job in gone)
        if self._waiting and any(job.cancelled() for job in self._waiting):
            kept: collections.deque[GenerationJob] = collections.deque()
            for job in self._waiting:
                if job.cancelled():
                    events.append(JobEvent(job, "", [], None, True, "cancelled"))
                else:
                    kept.append(job)
            self._waiting = kept

    def _schedule(self) -> tuple[StepBatch, list[GenerationJob], list[GenerationJob]]:
        """Decode rows for every decoding job, then prefill chunks within the remaining token budget."""
        limits = self.limits
        while self._waiting and len(self._slots) < limits.max_num_seqs:
            job = self._waiting.popleft()
            job.slot = len(self._slots)
            if job.slot >= self._initialised_slots:
                # A slot's first use zeroes it: decode attention reads (masked) positions past a row's own
                # length, which must hold finite numbers, not whatever the allocator left there.
                self.model.zero_slot(job.slot)
                self._initialised_slots = job.slot + 1
            self._slots.append(job)
        nd = self._n_decode
        decode_jobs = self._slots[:nd]
        tokens = [job.output_ids[-1] for job in decode_jobs]
        positions = [job.computed for job in decode_jobs]
        slots = list(range(nd))
        logit_rows = list(range(nd))
        budget = max(limits.max_num_batched_tokens - nd, 0)
        if nd and limits.max_prefill_tokens_while_decoding:
            # A prompt joining running streams is prefilled in chunks about as large as the decode share of
            # the step, so that each step of the streams grows by a bounded fraction instead of stalling for
            # the whole prompt. When prompts pile up faster than that, the cap rises to clear the backlog in
            # about four steps, so time to first token stays bounded under a burst of arrivals.
            backlog = sum(len(job.prompt_ids) - job.computed for job in self._slots[nd:])
            budget = min(budget, max(limits.max_prefill_tokens_while_decoding, nd, backlog // 4))
        prefills: list[tuple[int, int, int]] = []
        completing: list[GenerationJob] = []
        for job in self._slots[nd:]:
            if budget <= 0:
                break
            start = job.computed
            length = min(len(job.prompt_ids) - start, budget)
            budget -= length
            tokens.extend(job.prompt_ids[start : start + length])
            positions.extend(range(start, start + length))
            slots.extend([job.slot] * length)
            prefills.append((job.slot, start, length))
            job.computed += length
            if job.computed == len(job.prompt_ids):
                logit_rows.append(len(tokens) - 1)
                completing.append(job)
        for job in decode_jobs:
            job.computed += 1
        step = StepBatch(
            tokens=torch.tensor(tokens, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            slots=torch.tensor(slots, dtype=torch.long),
            n_decode=nd,
            decode_lengths=torch.tensor([job.computed for job in decode_jobs], dtype=torch.long),
            prefills=prefills,
            logit_rows=torch.tensor(logit_rows, dtype=torch.long),
        )
        return step, decode_jobs, completing

    def _step(self, events: list[JobEvent]) -> None:
        step, decode_jobs, completing = self._schedule()
        self.metrics.running = len(self._slots)
        self.metrics.waiting = len(self._waiting) + len(self._inbox)
        rows = decode_jobs + completing
        if step.tokens.shape[0] == 0:
            return
        logits = self.model.forward(step)
        self.metrics.record_step(step.tokens.shape[0], sum(length for _s, _st, length in step.prefills))
        if not rows:
            return
        sampler_rows = [
            SamplerRow(
                job.params,
                job.prompt_ids,
                job.output_ids,
                job.generator,
                job.block_ids if len(job.output_ids) < job.params.min_tokens else [],
                job.constraint,
            )
            for job in rows
        ]
        tokens, logprobs = sample_rows(logits, sampler_rows)
        now = time.monotonic_ns()
        finished: set[GenerationJob] = set()
        for job, token, lp in zip(rows, tokens, logprobs):
            event = self._append(job, token, lp, now)
            if event is not None:
                events.append(event)
                if event.finished:
                    finished.add(job)
        self._release(finished, [job for job in completing if job not in finished])
        self.metrics.running = len(self._slots)
        self.metrics.kv_used_tokens = sum(job.computed for job in self._slots)

    def _append(
        self, job: GenerationJob, token: int, lp: tuple[float, list[tuple[int, float]]] | None, now: int
    ) -> JobEvent | None:
        params = job.params
        metrics = self.metrics
        if not job.output_ids:
            job.first_token_ns = now
            metrics.observe_ttft((now - job.arrival_ns) / 1e9)
        else:
            metrics.observe_itl((now - job.last_token_ns) / 1e9)
        job.last_token_ns = now
        job.output_ids.append(token)
        metrics.generation_tokens += 1
        job.pending_tokens.append(token)
        if lp is not None:
            job.cumulative_logprob += lp[0]
            job.pending_logprobs.append((token, lp[0], lp[1]))
        reason = None
        cut_by_stop_string = False
        stop_token = token in params.stop_token_ids or (token in self.eos_ids and not params.ignore_eos)
        if stop_token and len(job.output_ids) > params.min_tokens:
            reason = "stop"
        else:
            piece = job.decoder.step(self.tokenizer, token)
            if piece:
                job.text += piece
                job.held_ids.clear()
            else:
                job.held_ids.append(token)
            if params.stop and len(job.output_ids) > params.min_tokens and self._hit_stop(job, len(piece or "")):
                reason, cut_by_stop_string = "stop", True
        if reason is None and job.constraint is not None and job.constraint.advance(token):
            reason = "stop"  # the grammar is complete
        if reason is None and len(job.output_ids) >= job.max_tokens:
            reason = "length"
        if reason is not None:
            if job.held_ids and not cut_by_stop_string:
                # A character left unfinished when the sequence ends (the token limit, a stop token) ends the text
                # as a whole decode writes it (U+FFFD), as the tokens' own texts do, instead of vanishing with the
                # decoder's held-back bytes. A stop string's cut lies before them, so they are not text.
                job.text += self.tokenizer.decode(job.held_ids, skip_special_tokens=params.skip_special_tokens)
            out = JobEvent(job, job.text[job.sent :], job.pending_tokens, job.pending_logprobs if params.logprobs is not None else None, True, reason)
            job.sent = len(job.text)
            metrics.observe_finished(job, now)
            return out
        if not job.stream:
            return None
        # Every token goes out at once, even when its text is held back (an incomplete UTF-8 character, a
        # stop string that may be forming): the client sees a steady token cadence, as with vLLM.
        holdback = max((len(s) for s in params.stop), default=1) - 1
        safe = max(len(job.text) - holdback, job.sent)
        out = JobEvent(job, job.text[job.sent : safe], job.pending_tokens, job.pending_logprobs if params.logprobs is not None else None)
        job.sent = safe
        job.pending_tokens = []
        job.pending_logprobs = []
        return out

    def _hit_stop(self, job: GenerationJob, added: int) -> bool:
        """Look for a stop string in the text that this token could have completed; cut the text there."""
        text = job.text
        for stop in job.params.stop:
            begin = max(job.sent, len(text) - added - len(stop) + 1, 0)
            index = text.find(stop, begin)
            if index >= 0:
                job.text = text[: index + len(stop)] if job.params.include_stop_str_in_output else text[:index]
                return True
        return False

    def _release(self, finished: set[GenerationJob], now_decoding: list[GenerationJob]) -> None:
        """Drop finished jobs and move newly decoding ones next to the others, keeping decode slots dense."""
        if not finished and not now_decoding:
            return
        nd = self._n_decode
        # Fill each hole a finished decode job leaves with the last decode job: one move per hole.
        new_decode = list(self._slots[:nd])
        i = 0
        while i < len(new_decode):
            if new_decode[i] in finished:
                last = new_decode.pop()
                if i < len(new_decode):
                    new_decode[i] = last
                    continue
            i += 1
        new_decode.extend(now_decoding)
        prefill = [job for job in self._slots[nd:] if job not in finished and job not in now_decoding]
        layout = new_decode + prefill
        moves = [(job, job.slot, target) for target, job in enumerate(layout) if job.slot != target]
        if moves:
            cache = self.model.cache
            assert cache is not None
            saved = [(target, job.computed, cache[:, :, src, :, : job.computed].clone()) for job, src, target in moves]
            for target, length, data in saved:
                cache[:, :, target, :, :length] = data
            for job, _src, target in moves:
                job.slot = target
        for job in now_decoding:
            job.decoding = True
        self._slots = layout
        self._n_decode = len(new_decode)
