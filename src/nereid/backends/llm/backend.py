"""The "vllm" backend: Triton's vLLM-backend conventions (model.json, text_input / stream / sampling_parameters /
exclude_input_in_output in, text_output out, decoupled) over Nereid's continuous-batching engine, or over
real vLLM where it is installed on a GPU machine.

`execute` only parses each request into a generation job and hands it to the engine thread; responses go
back through `request.respond` on the event loop. No wire formats here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from nereid.backends.base import ExecutionTimes, InstanceSpec, ModelContext
from nereid.backends.llm.engine_args import EngineArgs, read_engine_args
from nereid.backends.llm.metrics import LlmMetrics, MetricSample
from nereid.backends.llm.sampling import SamplingParams, parse_sampling_params
from nereid.backends.llm.tokenizer_loading import load_tokenizer
from nereid.backends.llm.tool_parsers import ToolCallStream, ToolExtractor, call_array, hermes, named_call, parser_for
from nereid.config.model_config import mc
from nereid.core.errors import NereidError, Status
from nereid.core.types import InferenceRequest, InferenceResponse, OutputTensor

__all__ = ["BACKEND", "LlmBackend", "LlmInstance", "CHAT_PARAMETER", "STRICT_CONTEXT_PARAMETER"]

log = logging.getLogger("nereid.llm")

# Request parameters the OpenAI frontend sets: chat messages to render with the tokenizer's chat template
# (JSON), and "refuse prompt + max_tokens beyond the context" instead of stopping at the context's end.
CHAT_PARAMETER = "nereid_chat_messages"
STRICT_CONTEXT_PARAMETER = "nereid_strict_context"
# Tools for the chat template (JSON list), how to read the output as tool calls ("none" | "auto" | "required" |
# "function:<name>"), and a JSON schema the output must follow (structured decoding). Tool calls go back as the
# response parameter "tool_calls": a JSON list of {"index", "name" (a call's first delta), "arguments"} deltas.
TOOLS_PARAMETER = "nereid_tools"
TOOL_CHOICE_PARAMETER = "nereid_tool_choice"
JSON_SCHEMA_PARAMETER = "nereid_json_schema"
# An embedding request (OpenAI's /v1/embeddings): the prompt is text_input or, as a JSON list, these token ids; the
# answer is one response with the output "embedding" (FP32 [hidden_size]) and the parameter "prompt_tokens".
EMBED_PARAMETER = "nereid_embed"
TOKEN_IDS_PARAMETER = "nereid_token_ids"

# Inputs and outputs as Triton's vLLM backend auto-completes them.
_INPUTS = [
    ("text_input", mc.TYPE_STRING, [1], False),
    ("stream", mc.TYPE_BOOL, [1], True),
    ("sampling_parameters", mc.TYPE_STRING, [1], True),
    ("exclude_input_in_output", mc.TYPE_BOOL, [1], True),
    ("return_finish_reason", mc.TYPE_BOOL, [1], True),
    ("return_cumulative_logprob", mc.TYPE_BOOL, [1], True),
    ("return_logprobs", mc.TYPE_BOOL, [1], True),
    ("return_num_input_tokens", mc.TYPE_BOOL, [1], True),
    ("return_num_output_tokens", mc.TYPE_BOOL, [1], True),
]
_OUTPUTS = [
    ("text_output", mc.TYPE_STRING, [-1]),
    ("finish_reason", mc.TYPE_STRING, [-1]),
    ("cumulative_logprob", mc.TYPE_FP32, [-1]),
    ("logprobs", mc.TYPE_STRING, [-1]),
    ("num_input_tokens", mc.TYPE_UINT32, [1]),
    ("num_output_tokens", mc.TYPE_UINT32, [-1]),
]
_RETURNS = ("return_finish_reason", "return_cumulative_logprob", "return_logprobs", "return_num_input_tokens", "return_num_output_tokens")


def _bytes_array(value: bytes) -> np.ndarray:
    array = np.empty(1, dtype=object)
    array[0] = value
    return array


@dataclass(slots=True)
class _RequestState:
    """What the backend keeps per request to shape its responses."""

    request: InferenceRequest
    prompt: str
    prepend: bool
    returns: frozenset[str]
    wanted: frozenset[str] | None
    n_input: int
    sent_tokens: int = 0
    tools: ToolCallStream | None = None  # reads tool calls out of the text (chat with tools)
    generated: str = ""  # with tools: the text the engine has handed out so far


class LlmInstance:
    """One engine (and one copy of the weights) per instance."""

    def __init__(self, context: ModelContext, spec: InstanceSpec, args: EngineArgs) -> None:
        self.name = spec.name
        self._model = context.name
        self._version = str(context.version)
        self._where = f"[model '{context.name}' version {context.version}]"
        self._args = args
        self._loop = asyncio.get_running_loop()
        self.tokenizer: Any = None
        self.engine: Any = None
        self.metrics: LlmMetrics | None = None
        self.max_model_len = 0
        self.grammars: Any = None  # structured_output.GrammarCompiler (Nereid's engine only)
        self._weights: Any = None  # the LlamaModel, for embeddings (Nereid's engine only)
        self._embedding_tasks: set[asyncio.Task[None]] = set()
        self._labels = {"model": context.name, "version": str(context.version)}

    # -- loading -------------------------------------------------------------------------------------
    def load(self) -> None:
        """Runs on a worker thread: tokenizer, weights, engine thread."""
        args = self._args
        engine = args.engine
        if engine == "auto":
            engine = "vllm" if _vllm_usable() else "nereid"
        if engine == "vllm":
            from nereid.backends.llm.vllm_engine import VllmEngine

            self.engine = VllmEngine(args, self._deliver, self._where)
            self.tokenizer = self.engine.tokenizer
            self.max_model_len = self.engine.max_model_len
            self.metrics = self.engine.metrics
            return
        if args.world_size > 1:
            raise NereidError.unavailable(
                f"{self._where} tensor_parallel_size x pipeline_parallel_size = {args.world_size} needs the vLLM "
                f"engine (a GPU machine with vllm installed); Nereid's own engine runs one device"
            )
        from nereid.backends.llm.engine import ContinuousBatchingEngine, EngineLimits
        from nereid.backends.llm.llama_model import LlamaModel

        try:
            self.tokenizer = load_tokenizer(str(args.tokenizer_path))
        except Exception as exc:
            raise NereidError.unavailable(f"{self._where} could not load the tokenizer from '{args.tokenizer_path}': {exc}") from None
        device = "cpu"
        model = LlamaModel(args.model_path, args.dtype, device)
        max_len = min(args.max_model_len or model.max_positions, model.max_positions)
        self.max_model_len = max_len
        # Room for a prompt chunk beside a full batch of decoding sequences (one token each).
        budget = args.max_num_batched_tokens or args.max_num_seqs + 256
        limits = EngineLimits(
            args.max_num_seqs, budget, max_len, args.max_prefill_tokens_while_decoding,
            block_size=args.block_size,
            num_blocks=self._pool_blocks(args, model.kv_bytes_per_token(), max_len),
            enable_prefix_caching=args.enable_prefix_caching,
            max_num_queued_reqs=args.max_num_queued_reqs,
            max_num_queued_tokens=args.max_num_queued_tokens,
        )
        self.metrics = LlmMetrics(limits.pool_blocks() * args.block_size)
        eos = self._eos_ids(args)
        from nereid.backends.llm.structured_output import GrammarCompiler

        self.grammars = GrammarCompiler(self.tokenizer, model.vocab, eos)
        self._weights = model
        self.engine = ContinuousBatchingEngine(
            model, self.tokenizer.backend_tokenizer, limits, self._deliver, self.metrics, eos, self.name, args.cpu_threads,
            where=self._where,
        )
        log.info(
            "%s Nereid engine ready: max_num_seqs=%d max_num_batched_tokens=%d max_model_len=%d dtype=%s "
            "kv_blocks=%d block_size=%d (%d tokens) prefix_caching=%s",
            self._where, limits.max_num_seqs, limits.max_num_batched_tokens, max_len, model.dtype,
            limits.pool_blocks(), limits.block_size, limits.pool_blocks() * limits.block_size, limits.enable_prefix_caching,
        )

    @staticmethod
    def _pool_blocks(args: EngineArgs, bytes_per_token: int, max_len: int) -> int:
        """The KV pool's block count: num_gpu_blocks_override, else kv_cache_memory_bytes, else a share of the
        machine's memory, else room for max_num_seqs full-length sequences (at most a tenth of the memory). The
        memory is touched only as blocks are first used; the prefix cache keeps blocks filled until evicted."""
        if args.num_gpu_blocks_override:
            return args.num_gpu_blocks_override
        import psutil

        memory = psutil.virtual_memory().total
        if args.kv_cache_memory_bytes:
            size = args.kv_cache_memory_bytes
        elif args.kv_cache_memory_fraction:
            size = int(memory * args.kv_cache_memory_fraction)
        else:
            size = min(args.max_num_seqs * max_len * bytes_per_token, memory // 10)
        return max(1, size // (bytes_per_token * args.block_size))

    def _eos_ids(self, args: EngineArgs) -> list[int]:
        from nereid.backends.llm.llama_model import load_config

        ids: set[int] = set()
        config = load_config(args.model_path)
        for source in (config.get("eos_token_id"), self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, list):
                ids.update(int(i) for i in source)
        generation = args.model_path / "generation_config.json"
        if generation.is_file():
            value = orjson.loads(generation.read_bytes()).get("eos_token_id")
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(int(i) for i in value)
        return sorted(ids)

    # -- requests ------------------------------------------------------------------------------------
    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        for request in requests:
            if request.parameters.get(EMBED_PARAMETER):
                task = self._loop.create_task(self._embed(request))
                self._embedding_tasks.add(task)  # held until done: the loop keeps only weak references
                task.add_done_callback(self._embedding_tasks.discard)
                continue
            try:
                # submit refuses at once when the waiting queue is full (an overloaded error: 429 / UNAVAILABLE)
                self.engine.submit(self._job(request))
            except NereidError as exc:
                request.respond(InferenceResponse(request.model_name, request.model_version, request.id, error=exc))
        return [], ExecutionTimes()

    async def _embed(self, request: InferenceRequest) -> None:
        """One embedding, computed on a worker thread beside the engine's decode steps."""
        try:
            if self._weights is None:
                raise NereidError.unsupported(f"{self._where} embeddings need Nereid's engine (model.json \"engine\": \"nereid\")")
            ids = self._embedding_ids(request)
            from nereid.backends.llm.embedding import last_token_embedding

            vector = await asyncio.to_thread(last_token_embedding, self._weights, ids)
            output = OutputTensor("embedding", "FP32", (vector.shape[0],), vector)
            response = InferenceResponse(request.model_name, request.model_version, request.id, [output], final=True)
            response.parameters = {"prompt_tokens": len(ids)}
        except NereidError as exc:
            response = InferenceResponse(request.model_name, request.model_version, request.id, error=exc)
        except Exception as exc:  # never leave the request without an answer
            log.exception("%s embedding failed", self._where)
            response = InferenceResponse(request.model_name, request.model_version, request.id, error=NereidError.internal(f"{self._where} embedding failed: {exc}"))
        request.respond(response)

    def _embedding_ids(self, request: InferenceRequest) -> list[int]:
        raw_ids = request.parameters.get(TOKEN_IDS_PARAMETER)
        if raw_ids is not None:
            ids = orjson.loads(raw_ids) if isinstance(raw_ids, (str, bytes)) else raw_ids
            vocab = self._weights.vocab
            if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
                raise NereidError.invalid(f"{self._where} input token ids must be integers in [0, {vocab})")
        else:
            text = request.input("text_input")
            if text is None or text.data.size == 0:
                raise NereidError.invalid(f"{self._where} input 'text_input': expected one string to embed, got none")
            raw = text.data.reshape(-1)[0]
            ids = list(self.tokenizer(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw))["input_ids"])
        if not ids:
            raise NereidError.invalid(f"{self._where} the input to embed is empty")
        if len(ids) > self.max_model_len:
            raise NereidError.invalid(
                f"{self._where} the input to embed is {len(ids)} tokens long, but the model's context (max_model_len) is {self.max_model_len} tokens"
            )
        return ids

    def _flag(self, request: InferenceRequest, name: str) -> bool | None:
        tensor = request.input(name)
        if tensor is None:
            return None
        return bool(tensor.data.reshape(-1)[0]) if tensor.data.size else None

    def _job(self, request: InferenceRequest) -> Any:
        from nereid.backends.llm.engine import GenerationJob

        text = request.input("text_input")
        if text is None or text.data.size == 0:
            raise NereidError.invalid(f"{self._where} input 'text_input': expected one prompt string, got none")
        raw = text.data.reshape(-1)[0]
        prompt = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        stream = bool(self._flag(request, "stream"))
        exclude = self._flag(request, "exclude_input_in_output")
        if exclude is False and stream:
            raise NereidError.invalid(f"{self._where} when streaming, `exclude_input_in_output` = False is not allowed")
        prepend = (not exclude) if exclude is not None else not stream
        params = self._sampling(request)
        chat = request.parameters.get(CHAT_PARAMETER)
        tools = self._tools(request)
        if tools is hermes and "<tool_call>" in (getattr(self.tokenizer, "all_special_tokens", None) or ()):
            params.skip_special_tokens = False  # as vLLM: the parser must see tags the tokenizer calls special
        if chat is not None:
            prompt, ids = self._render_chat(chat, request.parameters.get(TOOLS_PARAMETER))
            prepend = False
        else:
            ids = list(self.tokenizer(prompt)["input_ids"])
        if not ids:
            raise NereidError.invalid(f"{self._where} input 'text_input': the prompt is empty")
        limit = self.max_model_len
        if len(ids) >= limit:
            raise NereidError.invalid(
                f"{self._where} input 'text_input': the prompt is {len(ids)} tokens long, but the model's context "
                f"(max_model_len) is {limit} tokens; shorten the prompt"
            )
        if request.parameters.get(STRICT_CONTEXT_PARAMETER) and params.max_tokens is not None and len(ids) + params.max_tokens > limit:
            raise NereidError.invalid(
                f"{self._where} this model's maximum context length is {limit} tokens, but {len(ids) + params.max_tokens} "
                f"were requested ({len(ids)} in the prompt, {params.max_tokens} for the completion); reduce the prompt or max_tokens"
            )
        returns = frozenset(name for name in _RETURNS if self._flag(request, name))
        wanted = None if request.outputs is None else frozenset(o.name for o in request.outputs)
        state = _RequestState(request, prompt, prepend, returns, wanted, len(ids), tools=ToolCallStream(tools) if tools else None)
        if "return_logprobs" in returns and params.logprobs is None:
            params.logprobs = 0
        user = request.parameters.get("user")
        job = GenerationJob(
            prompt_ids=ids,
            params=params,
            stream=stream,
            cancelled=lambda: request.cancelled,
            arrival_ns=request.arrival_ns,
            context=state,
            priority=self._priority(request),
            user=user if isinstance(user, str) else "",
        )
        if params.logit_bias and self._weights is not None and max(params.logit_bias) >= self._weights.vocab:
            raise NereidError.invalid(
                f"{self._where} sampling parameter 'logit_bias': token id {max(params.logit_bias)} is outside the vocabulary "
                f"(0 to {self._weights.vocab - 1})"
            )
        schema = request.parameters.get(JSON_SCHEMA_PARAMETER) or params.json_schema
        if schema:
            if self.grammars is None:
                raise NereidError.unsupported(f"{self._where} structured output (a JSON schema) needs Nereid's engine (model.json \"engine\": \"nereid\")")
            job.constraint = self.grammars.json_schema(schema)
        return job

    def _tools(self, request: InferenceRequest) -> ToolExtractor | None:
        """How this request's output is read as tool calls: the model's parser for `auto`, the forced shapes for
        `required` and a named function; None when there are no tools or the choice is `none`."""
        choice = request.parameters.get(TOOL_CHOICE_PARAMETER)
        if not choice or choice == "none":
            return None
        if choice == "required":
            return call_array
        if isinstance(choice, str) and choice.startswith("function:"):
            return named_call(choice[len("function:") :])
        if choice == "auto":
            if not self._args.tool_call_parser:
                raise NereidError.invalid(
                    f"{self._where} tool_choice 'auto' needs the model's tool-call parser: set \"tool_call_parser\" in "
                    f"model.json (hermes, llama3_json), or use tool_choice 'required' or a named function"
                )
            return parser_for(self._args.tool_call_parser)
        raise NereidError.invalid(f"{self._where} request parameter '{TOOL_CHOICE_PARAMETER}': unknown value {choice!r}")

    def _priority(self, request: InferenceRequest) -> int:
        """vLLM's request `priority` (lower is earlier, default 0), from the request parameters or beside the
        sampling parameters (where the OpenAI frontend puts it)."""
        value = request.parameters.get("priority")
        if value is None:
            tensor = request.input("sampling_parameters")
            raw = tensor.data.reshape(-1)[0] if tensor is not None and tensor.data.size else None
            if raw and b'"priority"' in (raw if isinstance(raw, bytes) else str(raw).encode()):
                try:
                    values = orjson.loads(raw if isinstance(raw, (bytes, str)) else str(raw))
                except orjson.JSONDecodeError:
                    values = None  # _sampling has already refused bad JSON
                value = values.get("priority") if isinstance(values, dict) else None
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise NereidError.invalid(f"{self._where} 'priority' must be an integer, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            number = 0.5
        if not number.is_integer():
            raise NereidError.invalid(f"{self._where} 'priority' must be an integer, got {value!r}")
        return int(number)

    def _sampling(self, request: InferenceRequest) -> SamplingParams:
        tensor = request.input("sampling_parameters")
        if tensor is not None and tensor.data.size:
            raw = tensor.data.reshape(-1)[0]
            try:
                values = orjson.loads(raw if isinstance(raw, (bytes, str)) else str(raw)) if raw else {}
            except orjson.JSONDecodeError as exc:
                raise NereidError.invalid(f"{self._where} input 'sampling_parameters': expected a JSON object ({exc})") from None
            if not isinstance(values, dict):
                raise NereidError.invalid(f"{self._where} input 'sampling_parameters': expected a JSON object")
        else:
            # As Triton's vLLM backend: without the tensor, the request parameters are the sampling parameters.
            values = {k: v for k, v in request.parameters.items() if not k.startswith("nereid_")}
        return parse_sampling_params(values, self._where)

    def _render_chat(self, chat: Any, tools: Any = None) -> tuple[str, list[int]]:
        try:
            messages = orjson.loads(chat) if isinstance(chat, (str, bytes)) else chat
            tools = orjson.loads(tools) if isinstance(tools, (str, bytes)) else tools
        except orjson.JSONDecodeError as exc:
            raise NereidError.invalid(f"{self._where} chat messages or tools are not valid JSON: {exc}") from None
        if not getattr(self.tokenizer, "chat_template", None):
            raise NereidError.invalid(f"{self._where} the model's tokenizer has no chat template; use completions instead")
        try:
            # The template decides how the tools reach the prompt; one without tool support ignores them.
            prompt = self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # template errors come from user content (jinja raises its own types)
            raise NereidError.invalid(f"{self._where} could not apply the chat template: {exc}") from None
        return prompt, list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    # -- responses (engine thread) -------------------------------------------------------------------
    def _deliver(self, events: list[Any]) -> None:
        """Turn a step's events into responses here, then hand them to the event loop in one call."""
        out: list[tuple[InferenceRequest, InferenceResponse]] = []
        for event in events:
            state: _RequestState = event.job.context
            response = self._response(state, event)
            if response is not None:
                out.append((state.request, response))
            if event.finished and self.metrics is not None:
                self.metrics.count_finish(event.finish_reason or "error")
        if out:
            try:
                self._loop.call_soon_threadsafe(_dispatch, out)
            except RuntimeError:  # the event loop is gone (the server is exiting): nobody is listening
                pass

    def _response(self, state: _RequestState, event: Any) -> InferenceResponse | None:
        request = state.request
        if event.finish_reason == "cancelled":
            error = NereidError(Status.CANCELLED, "Request was cancelled")
            return InferenceResponse(request.model_name, request.model_version, request.id, error=error)
        if event.finish_reason == "error":
            return InferenceResponse(
                request.model_name, request.model_version, request.id, error=NereidError.unavailable(f"{self._where} {event.error}")
            )
        job = event.job
        text = event.text
        if not job.stream:
            text = (state.prompt + job.text) if state.prepend else job.text
        tool_deltas: list[dict[str, Any]] = []
        if state.tools is not None:
            # The text generated so far (all of it when the job ends) read as content and tool calls.
            state.generated = state.generated + event.text if job.stream else job.text
            text, tool_deltas = state.tools.feed(state.generated, event.finished)
        new_tokens = len(job.output_ids) - state.sent_tokens
        state.sent_tokens = len(job.output_ids)
        outputs = [OutputTensor("text_output", "BYTES", (1,), _bytes_array(text.encode("utf-8")))]
        returns = state.returns
        if "return_finish_reason" in returns:
            outputs.append(OutputTensor("finish_reason", "BYTES", (1,), _bytes_array(str(event.finish_reason).encode())))
        if "return_cumulative_logprob" in returns:
            outputs.append(OutputTensor("cumulative_logprob", "FP32", (1,), np.array([job.cumulative_logprob], dtype=np.float32)))
        if "return_logprobs" in returns:
            outputs.append(OutputTensor("logprobs", "BYTES", (1,), _bytes_array(self._logprobs_json(event))))
        if "return_num_input_tokens" in returns:
            outputs.append(OutputTensor("num_input_tokens", "UINT32", (1,), np.array([state.n_input], dtype=np.uint32)))
        if "return_num_output_tokens" in returns:
            count = new_tokens if job.stream else len(job.output_ids)
            outputs.append(OutputTensor("num_output_tokens", "UINT32", (1,), np.array([count], dtype=np.uint32)))
        if state.wanted is not None:
            outputs = [o for o in outputs if o.name in state.wanted]
        response = InferenceResponse(request.model_name, request.model_version, request.id, outputs, final=event.finished)
        if event.finished:
            reason = event.finish_reason
            if reason == "stop" and state.tools is not None and state.tools.calls:
                reason = "tool_calls"
            # Usage in OpenAI's words (names that no output tensor has, so generate's JSON keeps both).
            response.parameters = {
                "finish_reason": reason,
                "prompt_tokens": state.n_input,
                "completion_tokens": len(job.output_ids),
            }
        if tool_deltas:
            response.parameters = {**(response.parameters or {}), "tool_calls": orjson.dumps(tool_deltas).decode()}
        return response

    def _logprobs_json(self, event: Any) -> bytes:
        if event.logprobs is None:
            return b"null"
        # A token's text follows the request's skip_special_tokens, as the completion's text does, so the
        # sampled tokens' texts joined give that text (a special token the text skips reads as "").
        skip = event.job.params.skip_special_tokens
        items = []
        for token, logprob, top in event.logprobs:
            entry = {str(token): {"logprob": logprob, "rank": None, "decoded_token": self._piece(token, skip)}}
            for rank, (alt, alt_lp) in enumerate(top, start=1):
                entry.setdefault(str(alt), {"logprob": alt_lp, "rank": rank, "decoded_token": self._piece(alt, skip)})
                if alt == token:
                    entry[str(token)]["rank"] = rank
            items.append(entry)
        return orjson.dumps(items)

    def _piece(self, token: int, skip_special_tokens: bool) -> str:
        return str(self.tokenizer.decode([token], skip_special_tokens=skip_special_tokens))

    # -- metrics and lifecycle -----------------------------------------------------------------------
    def metric_samples(self) -> Iterator[MetricSample]:
        if self.metrics is not None:
            yield from self.metrics.samples(self._labels)

    async def close(self) -> None:
        engine = self.engine
        if engine is not None:
            await asyncio.to_thread(engine.close)
            self.engine = None


def _dispatch(pairs: list[tuple[InferenceRequest, InferenceResponse]]) -> None:
    for request, response in pairs:
        request.respond(response)


def _vllm_usable() -> bool:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _add_tensor(entries: Any, name: str, data_type: int, dims: list[int], optional: bool | None) -> None:
    if any(e.name == name for e in entries):
        return
    entry = entries.add()
    entry.name = name
    entry.data_type = data_type
    entry.dims.extend(dims)
    if optional:
        entry.optional = True


class LlmBackend:
    name = "vllm"

    def auto_complete(self, context: ModelContext) -> None:
        """As Triton's vLLM backend: its inputs and outputs, decoupled, and batching left to the engine."""
        config = context.config
        for name, data_type, dims, optional in _INPUTS:
            _add_tensor(config.input, name, data_type, dims, optional)
        for name, data_type, dims in _OUTPUTS:
            _add_tensor(config.output, name, data_type, dims, None)
        config.model_transaction_policy.decoupled = True
        config.max_batch_size = 0

    async def create_instance(self, context: ModelContext, spec: InstanceSpec) -> LlmInstance:
        if not context.config.model_transaction_policy.decoupled:
            raise NereidError.invalid(
                f"model '{context.name}': the vLLM backend must be configured with the decoupled model transaction policy"
            )
        args = read_engine_args(context.name, context.model_path, context.version_path, spec.kind)
        instance = LlmInstance(context, spec, args)
        try:
            await asyncio.to_thread(instance.load)
        except NereidError:
            await instance.close()
            raise
        except Exception as exc:
            await instance.close()
            raise NereidError.unavailable(f"model '{context.name}': the LLM engine failed to start: {type(exc).__name__}: {exc}") from None
        return instance


BACKEND = LlmBackend()
