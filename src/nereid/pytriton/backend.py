"""The `python_function` backend: instances that run a function bound with `Triton.bind` on a thread of their own,
in the server's process, so a bound function is an ordinary model (scheduling, statistics, ensembles, BLS).

Bound functions are found in this module's registry by model name and version; the repository only sees the
config.pbtxt that `Triton` writes. Results are checked and shaped here, with PyTriton's rules and messages.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
import traceback
from collections.abc import Callable
from typing import Any

from nereid.backends.base import ExecutionTimes, InstanceSpec, ModelContext
from nereid.core.errors import NereidError
from nereid.core.request_parameters import HIDDEN_PARAMETERS
from nereid.core.types import InferenceRequest, InferenceResponse, OutputTensor
from nereid.pytriton._calls import CallPlacement, CallThread, iterate_results
from nereid.pytriton._model_spec import FUNCTION_BACKEND, TritonModelConfig
from nereid.pytriton._results import ResultRules, cast_output, check_results
from nereid.pytriton.exceptions import PyTritonUnrecoverableError
from nereid.pytriton.proxy.types import Request

__all__ = ["BACKEND", "Binding", "FunctionBackend", "FunctionInstance", "ProcessInstance", "register", "unregister"]

log = logging.getLogger("nereid.pytriton")

@dataclasses.dataclass
class Binding:
    """A bound model: its callables (one per instance), the config decorators see, and what to do when a callable
    raises PyTritonUnrecoverableError (the Triton object stops the server)."""

    name: str
    version: int
    callables: list[Callable[..., Any]]
    spec: TritonModelConfig
    strict: bool = False
    on_unrecoverable: Callable[[str], None] | None = None
    execution: str = "thread"  # "thread": in this process; "process": Python-backend worker processes


_BINDINGS: dict[tuple[str, int], Binding] = {}


def register(binding: Binding) -> None:
    _BINDINGS[(binding.name, binding.version)] = binding


def unregister(name: str, version: int) -> None:
    _BINDINGS.pop((name, version), None)


def _execute_error(label: str, exc: BaseException) -> NereidError:
    """Triton's words for an exception out of a Python model's execute(), with the callable's traceback."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return NereidError.internal(
        f"Failed to process the request(s) for model '{label}', message: TritonModelException: Model execute error: {text}"
    )


class FunctionInstance:
    """One instance of a bound model: its callable on its own thread. The whole batch (building the Request
    objects, the call, checking and splitting the results) runs on that thread, so the event loop only hands
    the batch over and takes the responses back; a batch measured to take less than that hand-off costs runs on
    the event loop instead (see CallPlacement)."""

    pipelined_batches = 1

    def __init__(self, context: ModelContext, spec: InstanceSpec, binding: Binding, function: Callable[..., Any]) -> None:
        config = context.config
        self.name = spec.name
        self.label = spec.name
        self.binding = binding
        self.function = function
        self.decoupled = bool(config.model_transaction_policy.decoupled)
        self.batching = config.max_batch_size > 0
        self.input_names = [t.name for t in config.input]
        self.output_names = [t.name for t in config.output]
        self.rules = ResultRules.of(config, binding.strict)
        self.model_name = context.name
        self.thread = CallThread(f"{context.name}-{spec.name}")
        self.placement = CallPlacement()

    # -- the server's side -------------------------------------------------------------------------------
    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        loop = asyncio.get_running_loop()
        t0 = time.monotonic_ns()
        if self.decoupled:
            times = await self.thread.run(loop, self._stream, requests, loop)
            responses: list[InferenceResponse] = []
        elif self.placement.on_loop(len(requests)):
            responses, times = await self._batch_on_loop(requests, loop)
        else:
            responses, times = await self.thread.run(loop, self._batch, requests)
            self.placement.observe(times[3] - times[0], len(requests), on_loop=False)
        t1, t2 = times[1], times[2]
        # Input: Request objects built; infer: the call; output: results checked and split, and back on the loop.
        return responses, ExecutionTimes(t1 - t0, t2 - t1, time.monotonic_ns() - t2)

    async def _batch_on_loop(
        self, requests: list[InferenceRequest], loop: asyncio.AbstractEventLoop
    ) -> tuple[list[InferenceResponse], _Times]:
        result, error, t0, t1 = self._call(requests)
        if inspect.iscoroutine(result) or inspect.isasyncgen(result):
            # Async callables run on the instance thread's own loop, never on the server's.
            self.placement.leave_loop()
            return await self.thread.run(loop, self._finish, requests, result, None, t0, t1)  # type: ignore[no-any-return]
        responses, times = self._finish(requests, result, error, t0, t1)
        self.placement.observe(times[3] - t0, len(requests), on_loop=True)
        return responses, times

    async def close(self) -> None:
        self.thread.close()
        await asyncio.to_thread(self.thread.join, 5.0)

    # -- on the instance thread ----------------------------------------------------------------------------
    def _requests(self, requests: list[InferenceRequest]) -> list[Request]:
        proxies = []
        all_outputs = self.output_names
        for request in requests:
            parameters = request.parameters
            if parameters and not HIDDEN_PARAMETERS.isdisjoint(parameters):
                parameters = {k: v for k, v in parameters.items() if k not in HIDDEN_PARAMETERS}
            outputs = request.outputs
            proxies.append(
                Request(
                    data={t.name: t.data for t in request.inputs},
                    parameters=dict(parameters) if parameters else {},
                    requested_output_names=list(all_outputs) if outputs is None else [o.name for o in outputs],
                )
            )
        return proxies

    def _batch(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], _Times]:
        return self._finish(requests, *self._call(requests))

    def _call(self, requests: list[InferenceRequest]) -> tuple[Any, BaseException | None, int, int]:
        """The callable called on the batch's Request objects: its result or its exception, and when it started."""
        t0 = time.monotonic_ns()
        proxies = self._requests(requests)
        t1 = time.monotonic_ns()
        try:
            return self.function(proxies), None, t0, t1
        except BaseException as exc:
            return None, exc, t0, t1

    def _finish(
        self, requests: list[InferenceRequest], result: Any, error: BaseException | None, t0: int, t1: int
    ) -> tuple[list[InferenceResponse], _Times]:
        """The call's result driven to its end (a generator's or coroutine's), checked and split per request."""
        if error is None:
            try:
                produced = list(iterate_results(result, self.thread))
                if len(produced) != 1:
                    raise ValueError(
                        f"`{self.model_name}` inference callable produced {len(produced)} results for a model that is "
                        f"not decoupled; yield more than once only from decoupled models (ModelConfig(decoupled=True))"
                    )
                t2 = time.monotonic_ns()
                return self._responses(requests, produced[0]), (t0, t1, t2, time.monotonic_ns())
            except BaseException as exc:
                error = exc
        failure = self._failure(error)
        t2 = time.monotonic_ns()
        return [_error_response(r, failure) for r in requests], (t0, t1, t2, time.monotonic_ns())

    def _stream(self, requests: list[InferenceRequest], loop: asyncio.AbstractEventLoop) -> _Times:
        t0 = time.monotonic_ns()
        proxies = self._requests(requests)
        t1 = time.monotonic_ns()
        try:
            results = iterate_results(self.function(proxies), self.thread)
            for result in results:
                responses = self._responses(requests, result, final=False)
                loop.call_soon_threadsafe(_deliver, requests, responses)
                if all(r.cancelled for r in requests):  # nobody listens any more: stop the generator
                    results.close()
                    break
            finals = [
                InferenceResponse(r.model_name, r.model_version, r.id, final=True, complete_only=True) for r in requests
            ]
        except BaseException as exc:
            error = self._failure(exc)
            finals = [_error_response(r, error) for r in requests]
        t2 = time.monotonic_ns()
        loop.call_soon_threadsafe(_deliver, requests, finals)
        return t0, t1, t2, time.monotonic_ns()

    def _failure(self, exc: BaseException) -> NereidError:
        if isinstance(exc, NereidError):
            return exc
        error = _execute_error(self.label, exc)
        if isinstance(exc, PyTritonUnrecoverableError):
            log.error("Unrecoverable error thrown by model '%s'; shutting down the server. %s", self.model_name, error.message)
            callback = self.binding.on_unrecoverable
            if callback is not None:
                callback(error.message)
        else:
            log.warning("Exception while performing inference on model '%s': %s", self.model_name, error.message)
        return error

    def _responses(self, requests: list[InferenceRequest], outputs: Any, final: bool = True) -> list[InferenceResponse]:
        """Check the callable's result as PyTriton does, then give each request the outputs it asked for, cast to
        the model's output types."""
        rules = self.rules
        check_results(rules, outputs, len(requests))
        responses = []
        for request, result in zip(requests, outputs, strict=True):
            wanted = self.output_names if request.outputs is None else [o.name for o in request.outputs]
            tensors = []
            for output in wanted:
                value = result.get(output)
                if value is None:
                    continue
                datatype = rules.output_types[output]
                value = cast_output(value, datatype)
                tensors.append(OutputTensor(output, datatype, value.shape, value))
            responses.append(InferenceResponse(request.model_name, request.model_version, request.id, tensors, final=final))
        return responses


_Times = tuple[int, int, int, int]  # monotonic ns: batch started, Request objects built, call returned, results split


def _error_response(request: InferenceRequest, error: NereidError) -> InferenceResponse:
    return InferenceResponse(request.model_name, request.model_version, request.id, error=error)


def _deliver(requests: list[InferenceRequest], responses: list[InferenceResponse]) -> None:
    for request, response in zip(requests, responses, strict=True):
        request.respond(response)


class ProcessInstance:
    """An instance whose callable runs in a Python-backend worker process (shared-memory tensors, one message per
    batch): the worker's own instance, watched for PyTritonUnrecoverableError in its errors."""

    def __init__(self, worker: Any, binding: Binding) -> None:
        self.worker = worker
        self.binding = binding
        self.name = worker.name
        self.pipelined_batches = worker.pipelined_batches

    async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
        try:
            responses, times = await self.worker.execute(requests)
        except NereidError as exc:
            self._watch(exc)
            raise
        for response in responses:
            if response.error is not None:
                self._watch(response.error)
                break
        return responses, times

    def _watch(self, error: NereidError) -> None:
        if "PyTritonUnrecoverableError" in error.message and self.binding.on_unrecoverable is not None:
            log.error("Unrecoverable error thrown by model '%s'; shutting down the server. %s", self.binding.name, error.message)
            self.binding.on_unrecoverable(error.message)

    async def ready(self) -> bool:
        return bool(await self.worker.ready())

    async def close(self) -> None:
        await self.worker.close()


class FunctionBackend:
    name = FUNCTION_BACKEND

    def auto_complete(self, context: ModelContext) -> None:
        """The config comes from `Triton.bind` complete: nothing to infer from a model file."""

    async def create_instance(self, context: ModelContext, spec: InstanceSpec) -> FunctionInstance:
        binding = _BINDINGS.get((context.name, context.version))
        if binding is None:
            raise NereidError.unavailable(
                f"[model '{context.name}' version {context.version}] no Python function is bound to this model in "
                f"this process (bind one with nereid.pytriton's Triton.bind)"
            )
        if binding.execution == "process":
            from nereid.backends.python.backend import PythonBackend
            from nereid.backends.python.instance import PythonInstance

            # On the workers of the Server's own Python backend (a context made outside a Server: a backend of its own).
            python = context.backends.get("python") if context.backends is not None else None
            if not isinstance(python, PythonBackend):
                python = PythonBackend()
            worker = PythonInstance(context, spec, python.state)
            await worker.start()
            return ProcessInstance(worker, binding)  # type: ignore[return-value]
        function = binding.callables[spec.index % len(binding.callables)]
        return FunctionInstance(context, spec, binding, function)


BACKEND = FunctionBackend()
