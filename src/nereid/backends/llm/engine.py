"""Nereid's continuous-batching engine: one thread runs decode steps over a Llama-family model, with
requests joining at the next step, leaving at once when finished or cancelled, and long prompts prefilled
in chunks inside a per-step token budget so that running streams keep getting tokens.

The KV cache is a fixed pool of blocks (block_manager.py): a sequence holds only the blocks its tokens fill,
shares full prompt blocks with earlier sequences through the prefix cache, and is preempted (its blocks
freed, its tokens recomputed later) when the pool runs out. Waiting requests are bounded and ordered by
waiting_queue.py.

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

from nereid.backends.llm.block_manager import BlockManager, block_keys
from nereid.backends.llm.llama_model import DecodeGroup, LlamaModel, StepBatch
from nereid.backends.llm.metrics import LlmMetrics
from nereid.backends.llm.sampling import SamplerRow, SamplingParams, sample_rows
from nereid.backends.llm.waiting_queue import WaitingQueue
from nereid.core.errors import NereidError

__all__ = ["GenerationJob", "JobEvent", "ContinuousBatchingEngine", "EngineLimits"]

log = logging.getLogger("nereid.llm")


@dataclass(slots=True)
class EngineLimits:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 256
    max_model_len: int = 2048
    max_prefill_tokens_while_decoding: int = 32  # 0: only max_num_batched_tokens bounds a step's prompt tokens
    block_size: int = 16
    num_blocks: int = 0  # 0: room for max_num_seqs sequences of max_model_len tokens
    enable_prefix_caching: bool = True
    max_num_queued_reqs: int = 4096
    max_num_queued_tokens: int = 2_097_152

    def pool_blocks(self) -> int:
        if self.num_blocks > 0:
            return self.num_blocks
        return self.max_num_seqs * -(-self.max_model_len // self.block_size)


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
    computed: int = 0  # tokens (prompt, then output) whose keys and values are in the cache
    priority: int = 0  # vLLM's request priority: lower runs earlier
    user: str = ""  # the end user, for fairness between users
    seq: int = 0  # arrival order, set when the waiting queue accepts the job
    kv_blocks: list[int] = field(default_factory=list)  # the block table: position p lives in kv_blocks[p // block_size]
    kv_keys: list[bytes] = field(default_factory=list)  # prefix-cache keys of the leading full blocks
    text: str = ""
    sent: int = 0  # characters of `text` already handed out
    pending_tokens: list[int] = field(default_factory=list)
    pending_logprobs: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)
    generator: torch.Generator | None = None
    decoder: Any = None
    held_ids: list[int] = field(default_factory=list)  # tokens the decoder holds back (an incomplete character)
    block_ids: list[int] = field(default_factory=list)  # token ids banned until min_tokens (not KV blocks)
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
        where: str = "",
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer (the fast tokenizer's backend)
        self.limits = limits
        self.deliver = deliver
        self.metrics = metrics
        self.eos_ids = eos_ids
        self._threads = threads
        self._where = where or f"[model '{name}']"  # how error messages name the model
        self._inbox: collections.deque[GenerationJob] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        self.waiting = WaitingQueue(limits.max_num_queued_reqs, limits.max_num_queued_tokens, self._where)
        self._running: list[GenerationJob] = []
        self._running_per_user: collections.Counter[str] = collections.Counter()
        self.blocks = BlockManager(limits.pool_blocks(), limits.block_size, limits.enable_prefix_caching)
        # Keep about 1% of the pool free when admitting, so that running sequences can grow a little before the
        # first preemption (admitting up to the last block would preempt on the very next step).
        self._watermark = max(1, self.blocks.num_blocks // 100)
        metrics.kv_blocks_total = self.blocks.num_blocks
        model.allocate_cache(self.blocks.num_blocks, limits.block_size)
        self._thread = threading.Thread(target=self._run, name=f"nereid-llm-{name}", daemon=True)
        self._thread.start()

    # -- any thread ------------------------------------------------------------------------------
    def submit(self, job: GenerationJob) -> None:
        """Queue a job, or raise at once: a prompt the whole KV pool cannot hold, or a full waiting queue
        (an overloaded error that says which limit and that a retry may succeed)."""
        capacity = self.blocks.num_blocks * self.blocks.block_size
        if len(job.prompt_ids) + 1 > capacity:
            raise NereidError.invalid(
                f"{self._where} the prompt is {len(job.prompt_ids)} tokens long, but the whole KV cache holds "
                f"{capacity} tokens ({self.blocks.num_blocks} blocks of {self.blocks.block_size}); raise "
                f"kv_cache_memory_bytes or shorten the prompt"
            )
        try:
            self.waiting.offer(job)
        finally:
            self.metrics.refused = self.waiting.refused
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
                    job = self._inbox.popleft()
                    try:
                        self.waiting.push(self._prepare(job))
                    except Exception as exc:  # this job's own problem: fail it alone, uncounted
                        self.waiting.forget(job)
                        self.deliver([JobEvent(job, "", [], None, True, "error", f"{type(exc).__name__}: {exc}")])
                if self._stopping:
                    self._abort_all("the model is unloading")
                    return
                events: list[JobEvent] = []
                self._drop_cancelled(events)
                if not self._running and not len(self.waiting):
                    self._update_gauges()
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

    def _update_gauges(self) -> None:
        metrics = self.metrics
        metrics.running = len(self._running)
        metrics.waiting = len(self.waiting) + len(self._inbox)
        metrics.kv_blocks_used = self.blocks.num_used
        metrics.prefix_cache_queries = self.blocks.prefix_queries
        metrics.prefix_cache_hits = self.blocks.prefix_hits
        metrics.refused = self.waiting.refused

    def _abort_all(self, message: str) -> None:
        jobs = list(self._running) + self.waiting.drain() + list(self._inbox)
        for job in self._inbox:
            self.waiting.forget(job)
        for job in self._running:
            self._free(job)
        self._running.clear()
        self._running_per_user.clear()
        self._inbox.clear()
        self._update_gauges()
        if jobs:
            self.deliver([JobEvent(job, "", [], None, True, "error", message) for job in jobs])

    # -- the block tables ------------------------------------------------------------------------
    def _free(self, job: GenerationJob) -> None:
        self.blocks.free(job.kv_blocks)
        job.kv_blocks = []
        job.kv_keys = []

    def _leave(self, job: GenerationJob) -> None:
        """A running job stops running (finished, cancelled or preempted): its blocks go back to the pool."""
        self._free(job)
        self._running.remove(job)
        self._running_per_user[job.user] -= 1
        if self._running_per_user[job.user] <= 0:
            del self._running_per_user[job.user]

    def _preempt(self, job: GenerationJob) -> None:
        """Recompute-style preemption: drop the job's cache and put it back at the head of the waiting queue.
        Its generated tokens are appended to what must be recomputed, so generation continues exactly (and
        its own full blocks stay in the prefix cache, so the recompute is often mostly hits)."""
        self._leave(job)
        job.computed = 0
        self.waiting.push_preempted(job)
        self.metrics.num_preemptions += 1

    def _tokens(self, job: GenerationJob, start: int, end: int) -> list[int]:
        """Tokens [start, end) of the job's whole sequence (prompt then output) without joining the lists."""
        prompt = job.prompt_ids
        n = len(prompt)
        if end <= n:
            return prompt[start:end]
        if start >= n:
            return job.output_ids[start - n : end - n]
        return prompt[start:] + job.output_ids[: end - n]

    def _grow(self, job: GenerationJob, length: int, younger: collections.deque[GenerationJob]) -> int:
        """Give the job blocks for `length` more tokens, preempting the youngest of `younger` (its right end)
        while the pool is short. Returns how many tokens it may compute: `length`, fewer for a chunk of
        several tokens, or 0 when it cannot run this step (then it has preempted itself, so that the older
        sequences always make progress and nothing deadlocks)."""
        bs = self.blocks.block_size
        have = len(job.kv_blocks)
        room = have * bs - job.computed + self.blocks.num_available * bs
        while room < length and younger:
            self._preempt(younger.pop())
            room = have * bs - job.computed + self.blocks.num_available * bs
        if room < length:
            if length > 1 and room > 0:
                length = room  # a shorter chunk now, the rest in a later step
            else:
                self._preempt(job)
                return 0
        need = -(-(job.computed + length) // bs) - have
        if need > 0:
            fresh = self.blocks.allocate(need)
            assert fresh is not None
            job.kv_blocks.extend(fresh)
        return length

    def _commit_full_blocks(self, job: GenerationJob) -> None:
        """Make the job's newly filled blocks findable by later sequences with the same prefix."""
        if not self.blocks.enable_prefix_caching:
            return
        bs = self.blocks.block_size
        full = job.computed // bs
        done = len(job.kv_keys)
        if full <= done:
            return
        parent = job.kv_keys[-1] if job.kv_keys else None
        tokens = self._tokens(job, done * bs, full * bs)
        keys = block_keys(tokens, bs, full - done) if parent is None else block_keys(tokens, bs, full - done, parent)
        for index, key in enumerate(keys, start=done):
            self.blocks.cache_block(job.kv_blocks[index], key)
        job.kv_keys.extend(keys)

    # -- scheduling ------------------------------------------------------------------------------
    def _drop_cancelled(self, events: list[JobEvent]) -> None:
        """A cancelled job's blocks go back to the pool before the next step."""
        for job in [job for job in self._running if job.cancelled()]:
            self._leave(job)
            events.append(JobEvent(job, "", [], None, True, "cancelled"))
        if len(self.waiting):
            events.extend(JobEvent(job, "", [], None, True, "cancelled") for job in self.waiting.drop_cancelled())

    def _too_long(self, job: GenerationJob, events: list[JobEvent]) -> None:
        self._leave(job)
        total = self.blocks.num_blocks
        events.append(
            JobEvent(
                job, "", [], None, True, "error",
                f"the sequence reached {job.computed + 1} tokens, more than the whole KV cache holds "
                f"({total} blocks of {self.blocks.block_size} tokens); raise kv_cache_memory_bytes or lower max_tokens",
            )
        )

    def _schedule(self, events: list[JobEvent]) -> tuple[StepBatch | None, list[GenerationJob], list[GenerationJob]]:
        """Each running job's next tokens (one for a decoding job, a chunk of a prompt or a recompute within the
        step's token budget), oldest and most urgent first so that they are never the ones preempted; then new
        jobs from the waiting queue while tokens, blocks and max_num_seqs allow."""
        limits = self.limits
        bs = self.blocks.block_size
        # Most urgent first: the lowest priority value, then the oldest. Preemption takes from the end.
        self._running.sort(key=lambda job: (job.priority, job.seq))
        total_len = {id(job): len(job.prompt_ids) + len(job.output_ids) for job in self._running}
        n_decoding = sum(1 for job in self._running if job.computed and total_len[id(job)] - job.computed == 1)
        budget = max(limits.max_num_batched_tokens - n_decoding, 0)
        if n_decoding and limits.max_prefill_tokens_while_decoding:
            # A prompt joining running streams is prefilled in chunks about as large as the decode share of
            # the step, so that each step of the streams grows by a bounded fraction instead of stalling for
            # the whole prompt. When prompts pile up faster than that, the cap rises to clear the backlog in
            # about four steps, so time to first token stays bounded under a burst of arrivals.
            backlog = sum(total_len[id(job)] - job.computed for job in self._running) - n_decoding
            backlog += self.waiting.queued_tokens
            budget = min(budget, max(limits.max_prefill_tokens_while_decoding, n_decoding, backlog // 4))
        decode: list[tuple[GenerationJob, int]] = []
        chunks: list[tuple[GenerationJob, int, int]] = []  # (job, start, length)
        preemptions = self.metrics.num_preemptions
        pending = collections.deque(self._running)  # the most urgent at the left, the first victim at the right
        while pending:
            job = pending.popleft()
            remaining = total_len[id(job)] - job.computed
            if -(-(job.computed + 1) // bs) > self.blocks.num_blocks:
                self._too_long(job, events)
                continue
            if job.computed and remaining == 1:
                if self._grow(job, 1, pending):
                    decode.append((job, job.computed))
            elif budget > 0:
                length = self._grow(job, min(remaining, budget), pending)
                if length:
                    chunks.append((job, job.computed, length))
                    budget -= length
        # New jobs (preempted ones first), while the step has tokens and the pool keeps its watermark. Not in a
        # step that had to preempt: the pool is short, and a job let in now would only be preempted next step.
        admitting = len(self.waiting) > 0 and self.metrics.num_preemptions == preemptions
        for job in self.waiting.order(self._running_per_user) if admitting else ():
            reserve = self._watermark if self._running else 0
            if len(self._running) >= limits.max_num_seqs or budget <= 0 or self.blocks.num_available <= reserve:
                break
            total = len(job.prompt_ids) + len(job.output_ids)
            if -(-total // bs) > self.blocks.num_blocks:
                self.waiting.take(job)
                self._running.append(job)
                self._running_per_user[job.user] += 1
                self._too_long(job, events)
                continue
            hits, keys = self.blocks.match_prefix(job.prompt_ids + job.output_ids)
            job.kv_blocks, job.kv_keys = hits, keys
            job.computed = len(hits) * bs
            length = min(total - job.computed, budget)
            room = (self.blocks.num_available - reserve) * bs
            if room < length:
                length = room
            if length <= 0:
                # It does not fit yet: give the prefix back (its blocks stay cached) and wait.
                self.blocks.prefix_queries -= total
                self.blocks.prefix_hits -= job.computed
                self._free(job)
                job.computed = 0
                break
            self.waiting.take(job)
            self._running.append(job)
            self._running_per_user[job.user] += 1
            need = -(-(job.computed + length) // bs) - len(job.kv_blocks)
            if need > 0:
                fresh = self.blocks.allocate(need)
                assert fresh is not None
                job.kv_blocks.extend(fresh)
            chunks.append((job, job.computed, length))
            budget -= length
        if not decode and not chunks:
            return None, [], []
        self.model.zero_blocks_below(self.blocks.high_water)
        # Rows: decoding jobs first (one token each), in groups that the model reads together (below); then the
        # chunks.
        for job, _position in decode:
            job.computed += 1
        decode, groups = self._decode_groups(decode)
        tokens: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        logit_rows: list[int] = []
        sampled: list[GenerationJob] = []
        for job, position in decode:
            tokens.append(job.output_ids[-1] if job.output_ids else job.prompt_ids[-1])
            positions.append(position)
            slot_mapping.append(job.kv_blocks[position // bs] * bs + position % bs)
            logit_rows.append(len(tokens) - 1)
            sampled.append(job)
        prefills: list[tuple[torch.Tensor, int, int]] = []
        for job, start, length in chunks:
            tokens.extend(self._tokens(job, start, start + length))
            positions.extend(range(start, start + length))
            table = job.kv_blocks
            slot_mapping.extend(table[p // bs] * bs + p % bs for p in range(start, start + length))
            prefills.append((torch.tensor(table, dtype=torch.long), start, length))
            job.computed += length
            if job.computed == total_len.get(id(job), len(job.prompt_ids) + len(job.output_ids)):
                logit_rows.append(len(tokens) - 1)
                sampled.append(job)
        step = StepBatch(
            tokens=torch.tensor(tokens, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.long),
            n_decode=len(decode),
            decode_lengths=torch.tensor([job.computed for job, _p in decode], dtype=torch.long),
            decode_groups=groups,
            prefills=prefills,
            logit_rows=torch.tensor(logit_rows, dtype=torch.long),
        )
        return step, sampled, [job for job, _s, _l in chunks] + [job for job, _p in decode]

    def _decode_groups(self, decode: list[tuple[GenerationJob, int]]) -> tuple[list[tuple[GenerationJob, int]], list[DecodeGroup]]:
        """The decode rows in the order the model reads them, and their groups: first each run of jobs whose
        tables start with the same blocks (prefix-cache hits on one prompt prefix, read once per run); then the
        other jobs by length, a new group wherever the table doubles, so that a long row does not widen the
        gather of every short one. Only blocks wholly before each job's current position are shared (cached
        blocks are full, so a job always writes into a block of its own)."""
        bs = self.blocks.block_size
        decode.sort(key=lambda item: item[0].kv_blocks[0])
        ordered: list[tuple[GenerationJob, int]] = []
        groups: list[DecodeGroup] = []
        alone: list[tuple[GenerationJob, int]] = []

        def add(rows: list[tuple[GenerationJob, int]], count: int) -> None:
            own = [job.kv_blocks[count:] for job, _p in rows]
            widest = max(len(blocks) for blocks in own)
            tables = torch.tensor([blocks + [0] * (widest - len(blocks)) for blocks in own], dtype=torch.long)
            shared = torch.tensor(rows[0][0].kv_blocks[:count], dtype=torch.long)
            groups.append(DecodeGroup(len(ordered), len(ordered) + len(rows), shared, tables))
            ordered.extend(rows)

        start = 0
        while start < len(decode):
            end = start + 1
            head = decode[start][0].kv_blocks
            while end < len(decode) and decode[end][0].kv_blocks[0] == head[0]:
                end += 1
            run = decode[start:end]
            count = 0
            if len(run) > 1:
                # `computed` has already moved past this step's token: the current position is computed - 1.
                count = min(min(job.computed - 1 for job, _p in run) // bs, min(len(job.kv_blocks) for job, _p in run))
                for job, _p in run[1:]:
                    blocks = job.kv_blocks
                    n = 0
                    while n < count and blocks[n] == head[n]:
                        n += 1
                    count = n
            if count:
                add(run, count)
            else:
                alone.extend(run)
            start = end
        alone.sort(key=lambda item: len(item[0].kv_blocks))
        first = 0
        for i in range(1, len(alone) + 1):
            if i == len(alone) or len(alone[i][0].kv_blocks) > 2 * len(alone[first][0].kv_blocks):
                add(alone[first:i], 0)
                first = i
        return ordered, groups

    def _step(self, events: list[JobEvent]) -> None:
        step, rows, computed = self._schedule(events)
        self._update_gauges()
        if step is None:
            return
        logits = self.model.forward(step)
        self.metrics.record_step(step.tokens.shape[0], sum(length for _t, _st, length in step.prefills))
        for job in computed:
            self._commit_full_blocks(job)
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
        for job in finished:
            self._leave(job)  # its blocks go back to the pool now (full ones stay cached)
        self._update_gauges()

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
