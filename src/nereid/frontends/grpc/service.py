"""GRPCInferenceService: the KServe v2 gRPC methods with Triton's extensions, over the Server API.

The methods are grpc-style coroutines (request, context); `transport.py` carries them over HTTP/2."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from nereid.core.errors import NereidError, grpc_code_name
from nereid.core.tracing import FrontendTrace
from nereid.core.types import InferenceRequest, InferenceResponse
from nereid.frontends.grpc.codec import decode_infer_request, encode_infer_response, parameters_to_dict
from nereid.frontends.grpc.statistics_codec import encode_statistics
from nereid.frontends.grpc.stream_order import StreamOrder
from nereid.logs import log_settings, update_log_settings
from nereid.server import Server

__all__ = ["InferenceService", "abort", "status_code"]

log = logging.getLogger("nereid.grpc")


def status_code(error: NereidError) -> int:
    return int(_code(error).value[0])


def _code(error: NereidError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, grpc_code_name(error.status))


async def abort(context: Any, error: NereidError) -> None:
    """End the call with the error's gRPC status and message."""
    await context.abort(_code(error), error.message)


async def _answer(context: Any, response: Any, action: Callable[..., object], *args: Any) -> Any:
    """`response` once `action(*args)` (a server call whose result the RPC does not carry) succeeds; its error
    aborts the RPC with the error's status."""
    try:
        action(*args)
    except NereidError as exc:
        await abort(context, exc)
    return response


# The SettingValue field each log setting must use over gRPC, and the kind Triton's refusal names.
_LOG_SETTING_KINDS = {
    "log_info": ("bool_param", "boolean"),
    "log_warning": ("bool_param", "boolean"),
    "log_error": ("bool_param", "boolean"),
    "log_verbose_level": ("uint32_param", "int32"),
    "log_format": ("string_param", "string"),
}


class InferenceService:
    def __init__(self, server: Server) -> None:
        self.server = server

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=self.server.live)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.server.ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            return pb.ModelReadyResponse(ready=await self.server.model_is_ready(request.name, request.version))
        except NereidError as exc:
            await abort(context, exc)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        meta = self.server.metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=meta["extensions"])

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        try:
            meta = self.server.model_metadata(request.name, request.version)
        except NereidError as exc:
            await abort(context, exc)
        return json_format.ParseDict(meta, pb.ModelMetadataResponse())

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        try:
            config = self.server.model_config(request.name, request.version)
        except NereidError as exc:
            await abort(context, exc)
        return pb.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        try:
            stats = self.server.statistics(request.name, request.version)
        except NereidError as exc:
            await abort(context, exc)
        return encode_statistics(stats)

    def start_ModelInfer(
        self,
        request: Any,
        done: Callable[[Any], None],
        forwarded: dict[str, str] | None = None,
        trace_context: str = "",
        payload: bytes = b"",
    ) -> InferenceRequest | None:
        """ModelInfer without a task or an await: the server calls `done` with the response message, or the
        NereidError of the execution, from the scheduler's callback. None: this request needs the coroutine
        (the response cache), nothing started. Errors before execution raise. `forwarded`: request metadata
        that --grpc-header-forward-pattern turns into parameters; `trace_context`: the traceparent metadata in the
        opentelemetry trace mode; `payload`: the serialized request, which keys a decode plan."""
        core_request = decode_infer_request(request, self.server.shared_memory, forwarded, payload)
        core_request.trace_context = trace_context

        def finish(response: InferenceResponse) -> None:
            done(response.error if response.error is not None else encode_infer_response(response))

        return core_request if self.server.submit(core_request, finish) else None

    async def ModelInfer(
        self, request: Any, context: Any, forwarded: dict[str, str] | None = None, trace_context: str = ""
    ) -> Any:
        try:
            core_request = decode_infer_request(request, self.server.shared_memory, forwarded)
            core_request.trace = getattr(context, "trace", None)  # the transport's stamps, while tracing is on
            core_request.trace_context = trace_context
            response = await self.server.infer(core_request)
            return encode_infer_response(response)
        except NereidError as exc:
            await abort(context, exc)

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[Any],
        context: Any,
        forwarded: dict[str, str] | None = None,
        trace_context: str = "",
        grpc_error: bool = False,
    ) -> AsyncIterator[Any]:
        """Requests on one stream run concurrently; their responses are written as they complete, those of a model that
        is not decoupled in the order the requests came (StreamOrder). Each counts
        against --max-inflight-requests, and one with no response within the server's default deadline
        (--default-request-timeout-secs) is cancelled and answered with the timeout error; a request that is
        streaming responses is not cut short. An error goes out as a message naming its request, or, with
        `grpc_error` (the client's `triton_grpc_error: true` metadata), ends the stream with its gRPC status:
        nothing is sent after it, and the stream's other requests are cancelled."""
        out: asyncio.Queue[Any] = asyncio.Queue()
        order = StreamOrder(out.put_nowait)
        pending: set[asyncio.Task[None]] = set()
        done_reading = object()
        limit = self.server.inflight
        deadline = self.server.settings.limits.default_request_timeout_secs

        def release(_: Any) -> None:
            limit.release()

        def refuse(message: Any, error: NereidError) -> None:
            if grpc_error:
                out.put_nowait(error)
                return
            # Like Triton, the error carries the request's id so the client can tell which request failed.
            out.put_nowait(
                pb.ModelStreamInferResponse(error_message=error.message, infer_response=pb.ModelInferResponse(id=message.id))
            )

        async def run_one(message: Any, held: FrontendTrace | None, turn: int | None) -> None:
            # While tracing is on, responses go out as (message, held) so the sending is stamped on the trace,
            # and a last (None, held) releases it. A request with a turn (a model that is not decoupled) writes in it.
            def put(item: Any) -> None:
                item = item if held is None else (item, held)
                if turn is None:
                    out.put_nowait(item)
                else:
                    order.put(turn, item)

            try:
                core_request = decode_infer_request(message, self.server.shared_memory, forwarded)
                core_request.trace = held
                core_request.trace_context = trace_context
                # Triton's decoupled-stream extension: mark the last response, and send even an empty one.
                mark_final = bool(core_request.parameters.get("triton_enable_empty_final_response"))
                responses = self.server.infer_stream(core_request)
                if deadline:
                    responses = _first_within(responses, deadline)
                async for response in responses:
                    if turn is not None and response.decoupled:  # loaded on demand, it turned out decoupled
                        order.done(turn)
                        turn = None
                    if response.error is not None:
                        if grpc_error:
                            out.put_nowait(response.error)
                            return
                        put(
                            pb.ModelStreamInferResponse(
                                error_message=response.error.message, infer_response=pb.ModelInferResponse(id=message.id)
                            )
                        )
                        continue
                    if response.complete_only and not mark_final:
                        continue
                    encoded = encode_infer_response(response)
                    # Triton 2.51 marks every streamed response, a model's that is not decoupled too (asked).
                    encoded.parameters["triton_final_response"].bool_param = response.final
                    put(pb.ModelStreamInferResponse(infer_response=encoded))
            except NereidError as exc:
                if grpc_error:
                    out.put_nowait(exc)
                    return
                # Like Triton, the error carries the request's id so the client can tell which request failed.
                put(pb.ModelStreamInferResponse(error_message=exc.message, infer_response=pb.ModelInferResponse(id=message.id)))
            finally:
                if held is not None:
                    put(None)  # the (None, held) release, after the request's responses
                if turn is not None:
                    order.done(turn)

        def takes_turn(message: Any) -> bool:
            """Whether the request's responses keep its place: a model that is not decoupled (or one not known yet,
            whose error answer keeps it)."""
            try:
                return not self.server.model(message.model_name, message.model_version).decoupled
            except NereidError:
                return True

        async def read_all() -> None:
            try:
                async for message in request_iterator:
                    if not limit.try_acquire():
                        refuse(message, limit.error())  # UNAVAILABLE's words; the stream itself goes on
                        continue
                    waited = getattr(context, "waited", None)
                    held = None
                    if waited is not None:
                        held = FrontendTrace((("GRPC_WAITREAD_START", waited[0]), ("GRPC_WAITREAD_END", waited[1])))
                    turn = order.take() if takes_turn(message) else None
                    task = asyncio.get_running_loop().create_task(run_one(message, held, turn))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    # The place is given back when the task ends, even one cancelled before it started.
                    task.add_done_callback(release)
            finally:
                if pending:
                    await asyncio.gather(*pending, return_exceptions=True)
                out.put_nowait(done_reading)

        reader = asyncio.get_running_loop().create_task(read_all())
        try:
            while True:
                item = await out.get()
                if item is done_reading:
                    break
                if isinstance(item, NereidError):  # with grpc_error: the stream ends with it (finally cancels the rest)
                    raise item
                if type(item) is tuple:  # a traced request's response, or its release
                    message, held = item
                    trace = held.trace
                    if message is None:
                        if trace is not None:
                            self.server.tracer.release(trace)
                        continue
                    if trace is not None:
                        trace.stamp("GRPC_SEND_START")
                    yield message
                    if trace is not None:
                        trace.stamp("GRPC_SEND_END")
                    continue
                yield item
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        entries = self.server.repository_index(request.ready)
        # gRPC's ModelIndex has no footprint field (the HTTP index adds one where orchestration is on).
        return json_format.ParseDict({"models": entries}, pb.RepositoryIndexResponse(), ignore_unknown_fields=True)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        try:
            await self.server.load_model(request.model_name, parameters_to_dict(request.parameters))
        except NereidError as exc:
            await abort(context, exc)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        try:
            given = request.parameters
            if "unload_dependents" in given and given["unload_dependents"].WhichOneof("parameter_choice") != "bool_param":
                raise NereidError.invalid("invalid value type for 'unload_dependents' parameter, expected bool_param.")
            await self.server.unload_model(request.model_name, parameters_to_dict(given))
        except NereidError as exc:
            await abort(context, exc)
        return pb.RepositoryModelUnloadResponse()

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        try:
            regions = self.server.shared_memory_status("system", request.name)
        except NereidError as exc:
            await abort(context, exc)
        return json_format.ParseDict({"regions": {r["name"]: r for r in regions}}, pb.SystemSharedMemoryStatusResponse())

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        region = lambda: (request.key, request.offset, request.byte_size)  # noqa: E731  # read when it registers
        register = self.server.register_shared_memory
        return await _answer(context, pb.SystemSharedMemoryRegisterResponse(), register, "system", request.name, region)

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        unregister = self.server.unregister_shared_memory
        return await _answer(context, pb.SystemSharedMemoryUnregisterResponse(), unregister, "system", request.name)

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        # Only the name is checked: no CUDA region is ever registered.
        status = self.server.shared_memory_status
        return await _answer(context, pb.CudaSharedMemoryStatusResponse(), status, "cuda", request.name)

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        register = self.server.register_shared_memory
        return await _answer(context, pb.CudaSharedMemoryRegisterResponse(), register, "cuda", request.name)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        unregister = self.server.unregister_shared_memory
        return await _answer(context, pb.CudaSharedMemoryUnregisterResponse(), unregister, "cuda", request.name)

    async def TraceSetting(self, request: Any, context: Any) -> Any:
        """An empty value list clears a setting (back to the global value, or to the default)."""

        def changes() -> dict[str, Any] | None:
            read = {key: list(value.value) or None for key, value in request.settings.items()}
            for key, values in read.items():
                if key != "trace_level" and values is not None and len(values) > 1:
                    raise NereidError.invalid(f"expect only 1 value for '{key}'")
            return read or None  # no settings: a query

        try:
            settings = self.server.trace_setting(request.model_name, changes)
        except NereidError as exc:
            await abort(context, exc)
        response = pb.TraceSettingResponse()
        for key, value in settings.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [str(value)])
        return response

    async def LogSettings(self, request: Any, context: Any) -> Any:
        changes: dict[str, Any] = {}
        for key, value in request.settings.items():
            which = value.WhichOneof("parameter_choice")
            if which:
                expected = _LOG_SETTING_KINDS.get(key)
                if expected is not None and which != expected[0]:
                    await abort(context, NereidError.invalid(f"expect {expected[1]} for '{key}'"))
                changes[key] = getattr(value, which)
        try:
            current = update_log_settings(changes) if changes else log_settings()
        except NereidError as exc:
            await abort(context, exc)
        response = pb.LogSettingsResponse()
        for key, value in current.items():
            entry = response.settings[key]
            if isinstance(value, bool):
                entry.bool_param = value
            elif isinstance(value, int):
                entry.uint32_param = value
            else:
                entry.string_param = str(value)
        return response


async def _first_within(responses: AsyncIterator[InferenceResponse], seconds: float) -> AsyncIterator[InferenceResponse]:
    """`responses`, whose first must come within `seconds`: past it the request is cancelled (a queued one
    leaves its queue) and the timeout error raised."""
    iterator = aiter(responses)
    try:
        async with asyncio.timeout(seconds):
            first = await anext(iterator)
    except StopAsyncIteration:
        return
    except TimeoutError:
        raise NereidError.unavailable(f"Request timeout expired: over the server's default of {seconds:g} s") from None
    yield first
    async for response in iterator:
        yield response
