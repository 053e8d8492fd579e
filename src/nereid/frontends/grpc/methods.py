"""The gRPC port's method table: the service method that serves each path (KServe's GRPCInferenceService and
grpc.health.v1.Health), the context a method is called with, and the flags that apply to some methods
(--grpc-restricted-protocol, --grpc-header-forward-pattern, response compression, the trace context).

No transport here: transport.py carries the calls over HTTP/2."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from nereid.core.request_parameters import header_pattern
from nereid.core.settings import ServerSettings

__all__ = [
    "RESTRICTED_HEADER_PREFIX",
    "Abort",
    "CallContext",
    "ConfiguredMethod",
    "HealthService",
    "Method",
    "configure_methods",
    "forwarded_parameters",
    "method_table",
    "response_encoding",
    "with_arguments",
    "with_parameters",
]


class Abort(Exception):
    """Ends a call with a gRPC status; what `context.abort` raises."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class CallContext:
    """The part of grpc's ServicerContext that the services use: `abort`."""

    __slots__ = ()

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Abort(code.value[0], details)


@dataclass(frozen=True)
class Method:
    """A service method as the transport calls it: the coroutine, its request parser, and how it is run."""

    handler: Callable[..., Any]
    parse: Callable[[bytes], Any]
    streaming: bool  # bidirectional streaming; every other method is unary
    # A unary method's task-free path: start(request, done) -> a handle to cancel, or None for "use handler".
    start: Callable[..., Any] | None = None
    limited: bool = False  # counts against --max-inflight-requests (the inference methods)


class HealthService:
    """grpc.health.v1.Health: every service name is serving while the server runs, as Triton answers Check for any
    name. List and Watch (which Triton leaves unimplemented) say the same."""

    SERVICES = ("", "inference", "inference.GRPCInferenceService")
    _SERVING = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    async def Check(self, request: Any, context: CallContext) -> Any:
        return self._SERVING

    async def List(self, request: Any, context: CallContext) -> Any:
        response = health_pb2.HealthListResponse()
        for name in self.SERVICES:
            response.statuses[name].status = health_pb2.HealthCheckResponse.SERVING
        return response

    async def Watch(self, requests: AsyncIterator[Any], context: CallContext) -> AsyncIterator[Any]:
        async for _ in requests:
            yield self._SERVING
        await asyncio.Event().wait()  # the status never changes while we run: hold the watch open


# The API category of each method, as --grpc-restricted-protocol names them (measured on tritonserver 2.51).
_CATEGORIES = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}
_HEALTH_SERVICE = "/grpc.health.v1.Health/"  # all of it is "health", like ServerLive
_ROLLOUT_SERVICE = "/nereid.rollouts.v1.Rollouts/"  # "model-repository", as its HTTP routes are
_INFER_METHODS = ("/inference.GRPCInferenceService/ModelInfer", "/inference.GRPCInferenceService/ModelStreamInfer")
# tritonserver prefixes the key of a restricted protocol's header.
RESTRICTED_HEADER_PREFIX = "triton-grpc-protocol-"
# Request headers that gRPC core keeps from a server's metadata (besides pseudo-headers and grpc-*).
_TRANSPORT_HEADERS = frozenset({"te", "content-type"})


def _category(path: str) -> str:
    if path.startswith(_HEALTH_SERVICE):
        return "health"
    if path.startswith(_ROLLOUT_SERVICE):
        return "model-repository"
    return _CATEGORIES.get(path.rpartition("/")[2], "")


@dataclass(frozen=True)
class ConfiguredMethod:
    """A method that flags apply to: a required header (--grpc-restricted-protocol), metadata forwarded as
    request parameters (--grpc-header-forward-pattern) or compressed responses."""

    method: Method
    header: str = ""
    value: str = ""
    forward: re.Pattern[str] | None = None
    compression: str = "none"  # none | low | medium | high
    trace_context: bool = False  # hand the traceparent metadata to the call (the opentelemetry trace mode)

    @functools.cached_property
    def required(self) -> tuple[str, str]:
        """The metadata pair a restricted call must carry. Keys arrive in lower case; tritonserver compares them
        with the key as configured, so a key with capitals never matches there. Nereid matches it and, like
        Triton, names it as configured in the error."""
        return (self.header.lower(), self.value)


def configure_methods(methods: dict[str, Method], settings: ServerSettings) -> dict[str, ConfiguredMethod]:
    restricted = {
        api: (RESTRICTED_HEADER_PREFIX + item.header, item.value)
        for item in settings.grpc_restricted_protocols
        for api in item.apis
    }
    forward = header_pattern(settings.grpc_header_forward_pattern) if settings.grpc_header_forward_pattern else None
    compression = settings.grpc_options.infer_response_compression_level
    otel = settings.trace_config.get("trace_mode") == "opentelemetry"
    configured = {}
    for path, method in methods.items():
        header, value = restricted.get(_category(path), ("", ""))
        infer = path in _INFER_METHODS
        if header or (infer and (forward is not None or compression != "none" or otel)):
            configured[path] = ConfiguredMethod(
                method, header, value, forward if infer else None, compression if infer else "none", otel and infer
            )
    return configured


def forwarded_parameters(pattern: re.Pattern[str], headers: list[tuple[str, str]]) -> dict[str, str]:
    """Request metadata whose keys the pattern finds a match in (anywhere in the key, like RE2's PartialMatch
    in tritonserver), as string parameters; binary (-bin) values decoded, the last of repeated keys kept."""
    parameters = {}
    for name, value in headers:
        if name.startswith((":", "grpc-")) or name in _TRANSPORT_HEADERS or not pattern.search(name):
            continue
        if name.endswith("-bin"):
            value = base64.b64decode(value + "=" * (-len(value) % 4)).decode("utf-8", "replace")
        parameters[name] = value  # a name reserved for Triton is refused by the codec, which can answer with it
    return parameters


def with_parameters(method: Method, parameters: dict[str, str]) -> Method:
    """This call's method, with forwarded parameters handed to the service (a header beats a parameter of the
    same name in the message)."""
    if not parameters:
        return method
    start = functools.partial(method.start, forwarded=parameters) if method.start is not None else None
    return dataclasses.replace(method, handler=functools.partial(method.handler, forwarded=parameters), start=start)


def with_arguments(method: Method, **arguments: Any) -> Method:
    start = functools.partial(method.start, **arguments) if method.start is not None else None
    return dataclasses.replace(method, handler=functools.partial(method.handler, **arguments), start=start)


def response_encoding(level: str, headers: list[tuple[str, str]]) -> str:
    """gRPC core's choice for a compression level among what the client accepts: low prefers gzip, medium and
    high prefer deflate; none accepted, none used."""
    accepted: set[str] = set()
    for name, value in headers:
        if name == "grpc-accept-encoding":
            accepted.update(item.strip() for item in value.split(","))
    preference = ("gzip", "deflate") if level == "low" else ("deflate", "gzip")
    return next((name for name in preference if name in accepted), "")


def method_table(service: Any, descriptor: Any, messages: Any) -> dict[str, Method]:
    table = {}
    for method in descriptor.methods:
        parse = getattr(messages, method.input_type.name).FromString
        # Watch is server-streaming on the wire; one request message fits our streaming call path too.
        streaming = method.client_streaming or method.server_streaming
        start = getattr(service, f"start_{method.name}", None)
        path = f"/{descriptor.full_name}/{method.name}"
        # ModelStreamInfer counts each of its requests, not the stream (service.py).
        limited = path == _INFER_METHODS[0]
        table[path] = Method(getattr(service, method.name), parse, streaming, start, limited)
    return table
