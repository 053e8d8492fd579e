"""The server side of a model's business-logic scripting: runs each BlsRequest of a worker through the in-process
Server and answers with one BlsResponse per response, its tensors written into the worker's input arena. A request
made with `trace=request.trace()` is traced as a child of its caller's trace; no other is traced.

Every outcome, errors included, goes back as a response (in Triton's words), never as a failed call. The common
call (an ordinary model, no timeout) costs no task: the scheduler's response callback writes the answer. This module
answers models; it must not decide anything about the models they call (the Server does).
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from nereid.backends.python.error_codes import CODE_OF_STATUS
from nereid.backends.python.protocol import INTERNAL_CODE, BlsRequest
from nereid.backends.python.worker_process import PythonWorkerProcess
from nereid.core.errors import NereidError, Status
from nereid.core.server_handle import ServerHandle
from nereid.core.tracing import NOT_TRACED, RequestTrace, TraceParent
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor, RequestedOutput

__all__ = ["BlsBridge"]

log = logging.getLogger("nereid.python")

# Triton's words for a BLS request to a decoupled model without exec(decoupled=True) (its stray quote included).
_DECOUPLED_BLS = (
    "Model {model} is using the decoupled. The current BLS request call doesn't support models using the decoupled "
    "transaction policy. Please use 'decoupled=True' argument to the 'exec' or 'async_exec' calls for decoupled "
    "models.'"
)


class BlsBridge:
    """Answers the BLS requests of an instance's workers (the server and the label are the instance's)."""

    __slots__ = ("server", "label")

    def __init__(self, server: ServerHandle | None, label: str) -> None:
        self.server = server
        self.label = label

    def on_request(self, worker: PythonWorkerProcess, message: BlsRequest) -> None:
        """A model's InferenceRequest.exec(): copy its inputs out of the output arena, then run it."""
        call_id = message.call_id
        try:
            inputs = [
                InputTensor(name, datatype, tuple(shape), array)
                for name, datatype, shape, array in worker.copy_out(message.out_arena_size, message.inputs)
            ]
        except (ValueError, KeyError, TypeError) as exc:
            self.reply(worker, call_id, None, True, f"the inputs of the BLS request could not be read: {exc}")
            return
        finally:
            worker.consumed(message.oseq)
        requested = message.requested_outputs
        request = InferenceRequest(
            message.model_name,
            message.model_version,
            inputs,
            id=message.request_id,
            outputs=[RequestedOutput(name) for name in requested] if requested else None,
            parameters=dict(message.parameters) if message.parameters else {},
            timeout_us=message.timeout_us if message.timeout_us > 0 else 0,
            correlation_id=message.correlation_id,
            flags=message.flags,
        )
        server = self.server
        if server is not None and (message.trace_of is not None or server.tracer.enabled):
            request.trace = self._trace_parent(worker, message.trace_of)
        if request.timeout_us or not self._submit(worker, call_id, request):
            worker.start_task(self._run(worker, call_id, request, message.decoupled))

    @staticmethod
    def _trace_parent(worker: PythonWorkerProcess, caller: tuple[int, int] | None) -> TraceParent:
        """Where a BLS request goes in the traces: under the trace of the request that made it (`caller`, its batch
        and place in it) when that one is traced, else nowhere: Triton never samples a BLS request on its own."""
        if caller is None:
            return NOT_TRACED
        request = worker.request_of(*caller)
        trace = request.trace if request is not None else None
        return TraceParent(trace) if type(trace) is RequestTrace else NOT_TRACED

    def _submit(self, worker: PythonWorkerProcess, call_id: int, request: InferenceRequest) -> bool:
        """The common call without a task. False: it needs the task (_run)."""
        server = self.server
        if server is None:
            return False
        model = request.model_name
        try:
            if server.model(model, request.model_version).decoupled:
                return False
        except NereidError:
            return False  # _run answers with Triton's words for a model that is not ready
        try:
            return bool(server.submit(request, partial(self.reply, worker, call_id, final=True)))
        except NereidError as exc:
            error = f"Model {model} - Error when running inference: {exc.message}"
        except Exception as exc:  # a server bug must answer the model, never leave it waiting
            log.exception("%s: BLS request to model '%s' failed", self.label, model)
            error = f"Model {model} - Error when running inference: {type(exc).__name__}: {exc}"
        self.reply(worker, call_id, None, True, error)
        return True

    async def _run(self, worker: PythonWorkerProcess, call_id: int, request: InferenceRequest, decoupled: bool) -> None:
        """Run one BLS request through the server as a task (a decoupled model, a timeout, a model not ready)."""
        model = request.model_name
        state = {"final": False}
        timeout = request.timeout_us / 1e6 if request.timeout_us else None
        error: str | None = None
        if decoupled:
            worker.bls_calls[call_id] = request  # ResponseIterator.cancel() finds it here
        try:
            if timeout is None:
                await self._responses(worker, call_id, request, decoupled, state)
            else:
                async with asyncio.timeout(timeout):
                    await self._responses(worker, call_id, request, decoupled, state)
        except TimeoutError:
            request.cancelled = True
            error = f"Request timeout expired: model '{model}' did not answer within {request.timeout_us} us"
        except NereidError as exc:
            error = f"Model {model} - Error when running inference: {exc.message}"
        except asyncio.CancelledError:
            request.cancelled = True
            raise
        except Exception as exc:  # a server bug must answer the model, never leave it waiting
            log.exception("%s: BLS request to model '%s' failed", self.label, model)
            error = f"Model {model} - Error when running inference: {type(exc).__name__}: {exc}"
        finally:
            worker.bls_calls.pop(call_id, None)
        if error is not None and not state["final"]:
            self.reply(worker, call_id, None, True, error)

    async def _responses(
        self,
        worker: PythonWorkerProcess,
        call_id: int,
        request: InferenceRequest,
        decoupled: bool,
        state: dict[str, bool],
    ) -> None:
        server = self.server
        model = request.model_name
        if server is None:
            raise NereidError.unavailable("BLS requests need the in-process server, which this instance was not given")
        try:
            decoupled_model = (await server.wait_model(model, request.model_version)).decoupled
        except NereidError:
            raise NereidError.unavailable(
                f"Failed for execute the inference request. Model '{model}' is not ready."
            ) from None
        if decoupled_model:
            if not decoupled:
                raise NereidError.unsupported(_DECOUPLED_BLS.format(model=model))
            async for response in server.infer_stream(request):
                final = bool(response.final)
                self.reply(worker, call_id, response, final)
                if final:
                    state["final"] = True
                    return
            return
        response = await server.infer(request, raise_error=False)
        self.reply(worker, call_id, response, True)
        state["final"] = True

    @staticmethod
    def reply(
        worker: PythonWorkerProcess,
        call_id: int,
        response: InferenceResponse | None,
        final: bool = True,
        error: str | None = None,
    ) -> None:
        """One response of a BLS call, as the worker's pb_utils reads it."""
        parameters = None
        outputs = None
        code = INTERNAL_CODE
        if response is not None:
            if response.error is not None:
                error = response.error.message
                if response.error.status is Status.CANCELLED:
                    # A cancelled call says so (ResponseIterator.cancel(): the caller looks for CANCELLED, as the
                    # python_backend releases that have cancel() report it).
                    code = CODE_OF_STATUS[Status.CANCELLED]
            else:
                outputs = response.outputs
                if response.parameters:
                    # What the called model put in its response reaches the caller's response.parameters(); only
                    # the values a response parameter may hold, so the marshal-encoded message never meets anything
                    # else.
                    parameters = {
                        k: v for k, v in response.parameters.items() if isinstance(v, (bool, int, float, str))
                    }
        # Triton 2.51's BLS responses carry their errors as INTERNAL, whatever the code of the model that failed.
        worker.send_bls_response(call_id, None if error is None else (code, error), parameters, outputs, final)
