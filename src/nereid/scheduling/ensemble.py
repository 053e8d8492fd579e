"""The ensemble scheduler: runs an ensemble request's steps as a data-flow graph over the composing models'
own schedulers. A step is submitted the moment its last input tensor arrives, so independent branches run
at the same time; tensors pass between steps as the same numpy arrays. It holds no model instances."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from nereid.backends.base import BackendInstance, ModelContext
from nereid.core.errors import NereidError
from nereid.core.sequence_flags import SEQUENCE_END, SEQUENCE_START
from nereid.core.server_handle import ServedModel, ServerHandle
from nereid.core.statistics import ModelStatistics
from nereid.core.tracing import RequestTrace
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor, OutputTensor, RequestedOutput
from nereid.scheduling.ensemble_graph import EnsembleGraph, EnsembleStep
from nereid.scheduling.rate_limiter import InstanceLimits

__all__ = ["EnsembleScheduler"]

log = logging.getLogger("nereid.scheduler")

_NOTHING: dict[int, list[Any]] = {}


@dataclass(slots=True, frozen=True)
class _Plan:
    """What one request needs, given the outputs it asked for: steps that lead nowhere it wants are pruned."""

    outputs: tuple[str, ...]
    output_set: frozenset[str]
    consumers: dict[str, tuple[int, ...]]
    # How many uses each tensor has in this plan (consuming steps, plus one when it is a requested output).
    uses: dict[str, int]


@dataclass(slots=True, frozen=True)
class _StepModel:
    """The composing model version a step ran on last, with what shape adaptation needs of its config."""

    version: ServedModel  # scheduling reaches models through the server's handle, never the repository
    input_dims: dict[str, tuple[int, ...]]
    batching: bool


def _matches(dims: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return len(dims) == len(shape) and all(d == -1 or d == s for d, s in zip(dims, shape))


def _adapt(dims: tuple[int, ...] | None, batching: bool, tensor_batch: int, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape a tensor takes when it crosses between a batching and a non-batching side, as Triton does:
    add a batch of 1 when the receiver batches and the tensor has exactly its dims, or drop a batch of 1
    when the receiver does not batch and the tensor does not fit its dims as it is. None: unchanged."""
    if dims is None or batching == (tensor_batch != 0):
        return None
    if batching:
        return (1, *shape) if _matches(dims, shape) else None
    if tensor_batch == 1 and not _matches(dims, shape):
        return shape[1:]
    return None


class EnsembleScheduler:
    def __init__(self, context: ModelContext, stats: ModelStatistics) -> None:
        config = context.config
        self.name = config.name
        self.version = str(context.version)
        if context.server is None:
            raise NereidError.internal(f"ensemble '{config.name}' needs the in-process server to run its steps")
        self.server: ServerHandle = context.server
        self.stats = stats
        self.graph = EnsembleGraph.from_config(config)
        self.decoupled = bool(config.model_transaction_policy.decoupled)
        self.batching = config.max_batch_size > 0
        self._all_outputs = tuple(t.name for t in config.output)
        self.output_dims = {
            t.name: tuple(t.reshape.shape) if t.HasField("reshape") else tuple(t.dims) for t in config.output
        }
        self.optional_inputs = tuple(t.name for t in config.input if t.optional)
        # Each step asks its model for exactly the outputs the ensemble maps (shared, never mutated).
        self.step_outputs = [[RequestedOutput(name) for name in step.outputs] for step in self.graph.steps]
        self._step_models: list[_StepModel | None] = [None] * len(self.graph.steps)
        self._plans: dict[frozenset[str] | None, _Plan] = {}
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self._step_loads: set[asyncio.Task[None]] = set()

    # -- the server's side ------------------------------------------------------------------------
    def submit(self, request: InferenceRequest) -> None:
        if self._closed:
            raise NereidError.unavailable(f"model '{request.model_name}' is unloading")
        plan = self._plan(request)
        self._active += 1
        self._idle.clear()
        _Run(self, request, plan).start()

    async def drain(self) -> None:
        await self._idle.wait()

    async def close(self) -> None:
        self._closed = True
        await self.drain()

    def add_instance(self, instance: BackendInstance, limits: InstanceLimits) -> None:
        raise NereidError.invalid(f"ensemble '{self.name}' has no instances of its own")

    def remove_instance(self, instance: BackendInstance) -> asyncio.Future[None]:
        raise NereidError.invalid(f"ensemble '{self.name}' has no instances of its own")

    # -- helpers for runs -------------------------------------------------------------------------
    def _plan(self, request: InferenceRequest) -> _Plan:
        key = None if request.outputs is None else frozenset(o.name for o in request.outputs)
        plan = self._plans.get(key)
        if plan is None:
            outputs = self._all_outputs if key is None else tuple(n for n in self._all_outputs if n in key)
            needed = self.graph.needed_steps(frozenset(outputs))
            consumers = {
                tensor: tuple(i for i in indices if i in needed) for tensor, indices in self.graph.consumers.items()
            }
            uses = {tensor: len(indices) for tensor, indices in consumers.items() if indices}
            for name in outputs:
                uses[name] = uses.get(name, 0) + 1
            plan = self._plans[key] = _Plan(outputs, frozenset(outputs), consumers, uses)
        return plan

    def step_model(self, step: EnsembleStep) -> _StepModel:
        """The ready version a step runs on now (-1: the latest), resolved per request so reloads of the
        composing model take effect at once."""
        version = "" if step.model_version < 0 else str(step.model_version)
        mv = self.server.model(step.model_name, version)
        cached = self._step_models[step.index]
        if cached is None or cached.version is not mv:
            config = mv.config
            cached = _StepModel(mv, {t.name: tuple(t.dims) for t in config.input}, config.max_batch_size > 0)
            self._step_models[step.index] = cached
        return cached

    def step_labels(self, step: EnsembleStep) -> dict[str, list[str]]:
        """The classification labels of the version the step ran on last (none before it ran)."""
        cached = self._step_models[step.index]
        return cached.version.labels if cached is not None else {}

    def start_step_load(self, run: _Run, step: EnsembleStep, it: int) -> None:
        task = asyncio.get_running_loop().create_task(run.load_then_launch(step, it))
        self._step_loads.add(task)  # held, or the loop may collect the task mid-way
        task.add_done_callback(self._step_loads.discard)

    def finished(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._idle.set()


class _TracedStep:
    """A step of a traced ensemble request, traced as its child: the step's compute times go to the child's trace
    and to the ensemble's statistics."""

    __slots__ = ("run", "trace", "version")

    def __init__(self, run: _Run, trace: RequestTrace, sub: InferenceRequest) -> None:
        self.run = run
        self.trace = trace
        self.version = sub.model_version
        trace.stamp("REQUEST_START", sub.arrival_ns)
        sub.trace = trace  # the step's own steps, when it is an ensemble too, are its children

    def queued(self, sub: InferenceRequest) -> None:
        trace = self.trace
        trace.stamp("QUEUE_START")
        if trace.tensors:
            for tensor in sub.inputs:
                trace.tensor("TENSOR_QUEUE_INPUT", tensor.name, tensor.datatype, tensor.shape, tensor.data)

    def trace_outputs(self, response: InferenceResponse) -> None:
        for output in response.outputs:
            self.trace.tensor("TENSOR_BACKEND_OUTPUT", output.name, output.datatype, output.shape, output.data)

    def report_compute(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        self.trace.report_compute(input_ns, infer_ns, output_ns)
        self.run._add_compute(input_ns, infer_ns, output_ns)

    def finish(self) -> None:
        self.run.sched.server.tracer.finish(self.trace, self.version)


class _Run:
    """One ensemble request in flight. Every method runs on the event loop, mostly inside the response
    callbacks of the composing models' schedulers."""

    __slots__ = ("sched", "request", "plan", "values", "next_iteration", "inflight", "done", "start_ns", "compute")

    def __init__(self, sched: EnsembleScheduler, request: InferenceRequest, plan: _Plan) -> None:
        self.sched = sched
        self.request = request
        self.plan = plan
        # tensor -> iteration -> [InputTensor | None, batch size (0: not batched), uses left]. A decoupled
        # step produces one iteration per response; a step runs once per iteration of its inputs.
        self.values: dict[str, dict[int, list[Any]]] = {}
        self.next_iteration: dict[str, int] = {}
        self.inflight = 0
        self.done = False
        self.start_ns = time.monotonic_ns()
        # The composing models' compute times, summed: the ensemble's own compute statistics.
        self.compute = [0, 0, 0]

    def start(self) -> None:
        request = self.request
        batch = request.batch_size if self.sched.batching else 0
        updated: list[tuple[str, int]] = []
        for tensor in request.inputs:
            it = self._store(tensor.name, tensor, batch)
            if it is not None:
                updated.append((tensor.name, it))
        for name in self.sched.optional_inputs:
            if name not in self.next_iteration and request.input(name) is None:
                # An optional input left out: the steps reading it run without it.
                it = self._store(name, None, batch)
                if it is not None:
                    updated.append((name, it))
        self._advance(updated)

    def _store(self, name: str, tensor: InputTensor | None, batch: int, labels: list[str] | None = None) -> int | None:
        uses = self.plan.uses.get(name, 0)
        if uses == 0:
            return None
        it = self.next_iteration.get(name, 0)
        self.next_iteration[name] = it + 1
        by_iteration = self.values.get(name)
        if by_iteration is None:
            by_iteration = self.values[name] = {}
        by_iteration[it] = [tensor, batch, uses, labels]
        return it

    def _use(self, name: str, it: int) -> list[Any]:
        by_iteration = self.values[name]
        entry = by_iteration[it]
        entry[2] -= 1
        if entry[2] == 0:
            del by_iteration[it]
        return entry

    def _advance(self, updated: list[tuple[str, int]]) -> None:
        """Start every step whose inputs are now all there, send a response when every requested output
        of one iteration is there, and finish when nothing is left in flight."""
        plan = self.plan
        values = self.values
        steps = self.sched.graph.steps
        started: set[tuple[int, int]] = set()
        for tensor, it in updated:
            for index in plan.consumers.get(tensor, ()):
                if (index, it) in started or self.done:
                    continue
                step = steps[index]
                if all(it in values.get(t, _NOTHING) for t in step.input_tensors):
                    started.add((index, it))
                    self._launch(step, it)
        if self.done:
            return
        answered: set[int] = set()
        for tensor, it in updated:
            if tensor in plan.output_set and it not in answered:
                if all(it in values.get(name, _NOTHING) for name in plan.outputs):
                    answered.add(it)
                    self._respond(it)
                    if self.done:
                        return
        if self.inflight == 0 and not self.done:
            if self.sched.decoupled:
                # A decoupled ensemble may answer with no response at all, like a decoupled model.
                self._send(InferenceResponse(self.request.model_name, self.sched.version, self.request.id, complete_only=True))
                self._succeeded()
            else:
                self._fail(
                    None,
                    NereidError.invalid(
                        "unexpected deadlock, at least one output is not set while no more ensemble steps can be made"
                    ),
                )

    def _launch(self, step: EnsembleStep, it: int) -> None:
        sched = self.sched
        request = self.request
        try:
            model = sched.step_model(step)
        except NereidError as exc:
            if sched.server.loads_on_demand:
                # The composing model is not loaded (evicted, say): the step waits for its load on demand.
                self.inflight += 1
                sched.start_step_load(self, step, it)
                return
            for tensor in step.input_tensors:
                self._use(tensor, it)
            self._fail(step, exc)
            return
        inputs: list[InputTensor] = []
        input_dims = model.input_dims
        for model_input, tensor in step.inputs:
            value, batch = self.values[tensor][it][:2]
            if value is None:
                continue
            shape = value.shape
            data = value.data
            adapted = _adapt(input_dims.get(model_input), model.batching, batch, shape)
            if adapted is not None:
                shape = adapted
                data = data.reshape(adapted)
            inputs.append(InputTensor(model_input, value.datatype, shape, data))
        for tensor in step.input_tensors:
            self._use(tensor, it)
        sub = InferenceRequest(
            step.model_name,
            model.version.version_str,
            inputs,
            id=request.id,
            outputs=sched.step_outputs[step.index],
            parameters=request.parameters,
            priority=request.priority,
            timeout_us=request.timeout_us,
            correlation_id=request.correlation_id,
            flags=request.flags,
        )
        # A cancelled ensemble request cancels the steps it has not started yet (the model drops them).
        sub.cancelled = request.cancelled
        sub.report_compute = self._add_compute
        traced = None
        if request.trace is not None:
            traced = _TracedStep(self, sched.server.tracer.start_child(request.trace, step.model_name), sub)
            sub.report_compute = traced.report_compute
        try:
            model.version.validator.validate(sub)
            # The callback holds the batch size, not `sub`: a request referring to itself through its own callback
            # would be a reference cycle, left (with its tensors and this run) for the garbage collector, whose
            # passes over thousands of such cycles would make the tail latency of a busy ensemble.
            sub.respond = partial(self._on_response, step, sub.batch_size if model.batching else 0, traced)
            if traced is not None:
                traced.queued(sub)
            self.inflight += 1
            try:
                model.version.scheduler.submit(sub)
            except BaseException:
                self.inflight -= 1
                raise
        except NereidError as exc:
            self._fail(step, exc)

    async def load_then_launch(self, step: EnsembleStep, it: int) -> None:
        error: NereidError | None = None
        try:
            await self.sched.server.wait_model(step.model_name, "" if step.model_version < 0 else str(step.model_version))
        except NereidError as exc:
            error = exc
        self.inflight -= 1
        if self.done or error is not None:
            for tensor in step.input_tensors:
                self._use(tensor, it)
            if error is not None and not self.done:
                self._fail(step, error)
            return
        self._launch(step, it)

    def _add_compute(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        compute = self.compute
        compute[0] += input_ns
        compute[1] += infer_ns
        compute[2] += output_ns

    def _on_response(self, step: EnsembleStep, batch: int, traced: _TracedStep | None, response: InferenceResponse) -> None:
        if traced is not None and traced.trace.tensors and response.error is None:
            traced.trace_outputs(response)
        if response.final:
            self.inflight -= 1
            if traced is not None:
                traced.finish()
        if self.done:
            return
        try:
            if response.error is not None:
                self._fail(step, response.error)
                return
            updated: list[tuple[str, int]] = []
            if not response.complete_only:
                produced = step.outputs
                missing = set(produced)
                step_labels = self.sched.step_labels(step)
                for output in response.outputs:
                    tensor = produced.get(output.name)
                    if tensor is None:
                        continue
                    missing.discard(output.name)
                    # Triton's label provider: the producing model's labels travel with its tensor, nested ensembles too.
                    labels = step_labels.get(output.name) or output.labels
                    it = self._store(tensor, InputTensor(tensor, output.datatype, output.shape, output.data), batch, labels)
                    if it is not None:
                        updated.append((tensor, it))
                for name in missing:
                    # An output the model did not send: a placeholder, for steps where it is optional.
                    it = self._store(produced[name], None, batch)
                    if it is not None:
                        updated.append((produced[name], it))
            self._advance(updated)
        except Exception as exc:  # a bug here must fail this request, never the composing model's worker
            log.exception("ensemble '%s' failed to handle a response of '%s'", self.sched.name, step.model_name)
            self._fail(step, NereidError.internal(f"{type(exc).__name__}: {exc}"))

    def _respond(self, it: int) -> None:
        sched = self.sched
        request = self.request
        outputs: list[OutputTensor] = []
        for name in self.plan.outputs:
            value, batch, _, labels = self._use(name, it)
            if value is None:
                log.debug("Composing models did not output tensor %s", name)  # Triton's verbose line, word for word
                continue
            shape = value.shape
            data = value.data
            adapted = _adapt(sched.output_dims.get(name), sched.batching, batch, shape)
            if adapted is not None:
                shape = adapted
                data = data.reshape(adapted)
            outputs.append(OutputTensor(name, value.datatype, shape, data, labels=labels))
        final = not sched.decoupled or self.inflight == 0
        response = InferenceResponse(request.model_name, sched.version, request.id, outputs, final=final)
        # Triton's ensemble answers with the request's sequence (0 and false when it has none), on every protocol
        # (Triton 2.51, asked); L0_simple_ensemble reads them from a gRPC stream.
        response.parameters = {
            "sequence_id": request.correlation_id or 0,
            "sequence_start": bool(request.flags & SEQUENCE_START),
            "sequence_end": bool(request.flags & SEQUENCE_END),
        }
        self._send(response)
        if final:
            self._succeeded()

    def _send(self, response: InferenceResponse) -> None:
        if response.final:
            self.done = True
            self.sched.finished()
        self.request.respond(response)

    def _succeeded(self) -> None:
        stats = self.sched.stats
        request = self.request
        end = time.monotonic_ns()
        compute = self.compute
        stats.record_execution(max(request.batch_size, 1), 1, compute[0], compute[1], compute[2])
        stats.record_success(end - request.arrival_ns, self.start_ns - request.arrival_ns, (compute[0], compute[1], compute[2]))

    def _fail(self, step: EnsembleStep | None, error: NereidError) -> None:
        """Fail the whole request, naming the ensemble and the step's model (Triton's 'in ensemble' prefix;
        the model is added when the step's own message does not name it)."""
        if self.done:
            return
        message = error.message
        if step is not None and f"'{step.model_name}" not in message:
            message = f"model '{step.model_name}': {message}"
        request = self.request
        self.sched.stats.record_failure(time.monotonic_ns() - request.arrival_ns, "OTHER")
        failure = NereidError(error.status, f"in ensemble '{self.sched.name}', {message}")
        self._send(InferenceResponse(request.model_name, self.sched.version, request.id, error=failure))
