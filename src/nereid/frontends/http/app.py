"""The HTTP/REST frontend as a bare ASGI application (no framework on the hot path), served by frontends/http/server.py."""

from __future__ import annotations

import asyncio
import functools
import gzip
import logging
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from nereid.config.model_config import config_to_json_dict
from nereid.core.errors import NereidError, Status
from nereid.core.request_memory import body_reservation
from nereid.core.server_handle import ServedModel
from nereid.core.tracing import FrontendTrace
from nereid.core.types import InferenceRequest, InferenceResponse
from nereid.frontends.dashboard.app import DashboardApp, is_dashboard_path
from nereid.frontends.http.access import AccessGuard, HeaderForwarder
from nereid.frontends.http.body import inflate, read_body
from nereid.frontends.http.codec import decode_request, encode_response, json_object
from nereid.frontends.http.disconnect import DisconnectWatch, client_disconnected
from nereid.frontends.http.generate import generate_body, generate_request, sse_events
from nereid.frontends.http.raw_binary import decode_raw_request
from nereid.frontends.http.reply import (
    JSON,
    NOT_ALLOWED_JSON,
    NOT_ALLOWED_TEXT,
    TEXT,
    Reply,
    error_reply,
    json_reply,
)
from nereid.frontends.http.request import HttpRequest
from nereid.frontends.http.rollouts import rollout_routes
from nereid.frontends.http.routes import RouteTable
from nereid.frontends.http.server import DISCONNECT_KEY, RECEIVED_KEY, REQUEST_MEMORY_KEY
from nereid.frontends.openai.app import OpenAIApp, is_openai_path, send_openai_error
from nereid.logs import log_settings, update_log_settings
from nereid.server import Server

__all__ = ["HttpApp", "send_stream"]

log = logging.getLogger("nereid.http")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]
# A route's handler: it gets the request (its route's parameters set) and answers.
Handler = Callable[[HttpRequest], Awaitable[Reply]]
# How start_infer answers: status, headers (no content-length) and body.
Answer = Callable[[int, Headers, bytes], None]

_EMPTY_OK = Reply(200, b"", [JSON])
_EMPTY_TEXT_OK = Reply(200, b"", [TEXT])
_NOT_READY = Reply(400, b'{"error":"Model version not ready"}', [TEXT])
_EVENT_STREAM = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


def _model_and_version(parameters: tuple[str, ...]) -> tuple[str, str]:
    """The model of a /v2/models/{model}[/versions/{version}] route, and its version ("" for the default)."""
    return parameters[0], parameters[1] if len(parameters) > 1 else ""


def _first(parameters: tuple[str, ...]) -> str:
    """The route's first parameter (a model or region name), "" when the route has none."""
    return parameters[0] if parameters else ""


class _HeaderLengthOutOfRange(NereidError):
    """An Inference-Header-Content-Length beyond the body; Triton sends this error as text/plain."""


def _inference_header_length(headers: Headers, body_size: int) -> int | None:
    """The JSON part's size that Inference-Header-Content-Length gives (binary tensor data follows it), or None
    without the header; raises in Triton's words when it is not an integer between 0 and the body's size."""
    for key, value in headers:
        if key == b"inference-header-content-length":
            try:
                length = int(value)
            except ValueError:
                raise NereidError.invalid("Inference-Header-Content-Length must be an integer") from None
            if length < 0 or length > body_size:
                raise _HeaderLengthOutOfRange(
                    Status.INVALID_ARG, f"inference header size should be in range (0, {body_size}), got: {length}"
                )
            return length
    return None


class HttpApp:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.max_input_size = server.settings.http_max_input_size
        self.openai = OpenAIApp(server)  # the OpenAI-compatible API under /v1
        self.dashboard = DashboardApp(server) if server.settings.allow_dashboard else None  # the page at /dashboard
        # None unless the flags are given: requests then skip both checks at the cost of one test each.
        self.guard = AccessGuard.build(server.settings.http_restricted_apis)
        self.forwarder = HeaderForwarder.build(server.settings.http_header_forward_pattern)
        self.keeps_header_case = self.forwarder is not None  # asks HttpServer for header names as sent
        self.tracing = server.tracer  # its `enabled` switches on HttpServer's receive times and the send stamps
        self.routes = self._route_table()

    def _route_table(self) -> RouteTable[Handler]:
        """Triton's v2 routes: the handler of each method, and the 405 the others get (text/plain for the
        health, model-ready and infer routes, JSON for the rest, as Triton sends them)."""
        table: RouteTable[Handler] = RouteTable()
        add = table.add
        add("/v2", {"GET": self._server_metadata}, NOT_ALLOWED_JSON)
        add("/v2/health/live", {"GET": self._live}, NOT_ALLOWED_TEXT)
        add("/v2/health/ready", {"GET": self._ready}, NOT_ALLOWED_TEXT)
        add("/v2/models/stats", {"GET": self._model_statistics}, NOT_ALLOWED_JSON)
        add("/v2/repository/index", {"POST": self._repository_index}, NOT_ALLOWED_JSON)
        add("/v2/repository/models/{model}/load", {"POST": self._load}, NOT_ALLOWED_JSON)
        add("/v2/repository/models/{model}/unload", {"POST": self._unload}, NOT_ALLOWED_JSON)
        add("/v2/logging", {"GET": self._log_settings, "POST": self._update_log_settings}, NOT_ALLOWED_JSON)
        trace: dict[str, Handler] = {"GET": self._trace_settings, "POST": self._update_trace_settings}
        add("/v2/trace/setting", trace, NOT_ALLOWED_JSON)
        add("/v2/models/{model}/trace/setting", trace, NOT_ALLOWED_JSON)  # no version: Triton has none
        for kind in ("system", "cuda"):
            for region in ("", "/region/{region}"):
                base = f"/v2/{kind}sharedmemory{region}"
                add(f"{base}/status", {"GET": functools.partial(self._shared_memory_status, kind)}, NOT_ALLOWED_JSON)
                add(f"{base}/register", {"POST": functools.partial(self._register, kind)}, NOT_ALLOWED_JSON)
                add(f"{base}/unregister", {"POST": functools.partial(self._unregister, kind)}, NOT_ALLOWED_JSON)
        for version in ("", "/versions/{version:int}"):
            base = "/v2/models/{model}" + version
            add(base, {"GET": self._model_metadata}, NOT_ALLOWED_JSON)
            add(f"{base}/ready", {"GET": self._model_ready}, NOT_ALLOWED_TEXT)
            add(f"{base}/config", {"GET": self._model_config}, NOT_ALLOWED_JSON)
            add(f"{base}/stats", {"GET": self._model_statistics}, NOT_ALLOWED_JSON)
            add(f"{base}/infer", {"POST": self._infer}, NOT_ALLOWED_TEXT)
            add(f"{base}/generate", {"POST": functools.partial(self._generate_route, False)}, NOT_ALLOWED_JSON)
            add(f"{base}/generate_stream", {"POST": functools.partial(self._generate_route, True)}, NOT_ALLOWED_JSON)
        for pattern, handlers in rollout_routes(self.server):  # Nereid's own: /v2/nereid/rollouts
            add(pattern, handlers, NOT_ALLOWED_JSON)
        return table

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # served without lifespan events: only HTTP scopes arrive
        headers = scope["headers"]
        path = scope["path"]
        if self.guard is not None:
            denial = self.guard.denial(path, headers)
            if denial is not None:
                await _send_forbidden(send, denial)
                return
        if is_openai_path(path):
            try:
                body = await self._body(scope, receive)
            except NereidError as exc:
                await send_openai_error(send, exc)
                return
            await self.openai.handle(scope["method"], path, body, receive, send)
            return
        held = None
        if self.tracing.enabled:
            received = scope.get(RECEIVED_KEY)
            held = FrontendTrace((("HTTP_RECV_START", received[0]), ("HTTP_RECV_END", received[1])) if received else ())
        if self.dashboard is not None and is_dashboard_path(path):
            await self.dashboard.handle(scope["method"], path, scope.get("query_string", b""), send)
            return
        request = HttpRequest(b"", headers, receive, scope.get(DISCONNECT_KEY), held)
        try:
            request.body = await self._body(scope, receive)
            reply = await self._dispatch(scope["method"], path, request)
        except NereidError as exc:
            reply = error_reply(exc)
        except Exception as exc:  # never let a bug take the connection down without an answer
            log.exception("unhandled error for %s %s", scope["method"], path)
            reply = error_reply(NereidError.internal(f"{type(exc).__name__}: {exc}"))
        if reply.stream is not None:
            await send_stream(reply, send, receive)
            return
        out_headers, body_out = _encoded(reply, headers)
        trace = held.trace if held is not None else None
        if trace is not None:
            trace.stamp("HTTP_SEND_START")
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": out_headers + [(b"content-length", str(len(body_out)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body_out})
        if trace is not None:
            trace.stamp("HTTP_SEND_END")
            self.tracing.release(trace)

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        """The body every route gets, read within --http-max-input-size and inflated when Content-Encoding says."""
        body = await read_body(receive, self.max_input_size)
        for key, value in scope["headers"]:
            if key == b"content-encoding":
                inflated = inflate(body, value, self.max_input_size)
                if inflated is not body:
                    self._reserve_inflated(scope, len(inflated))
                return inflated
        return body

    @staticmethod
    def _reserve_inflated(scope: Scope, size: int) -> None:
        """A small compressed body can inflate to --http-max-input-size: what it inflates into is counted under
        --request-memory-limit beside the compressed bytes the transport reserved, and refused (503) when it does not
        fit."""
        held = scope.get(REQUEST_MEMORY_KEY)
        if held is None:
            return
        json_header = -1
        for key, value in scope["headers"]:
            if key == b"inference-header-content-length" and value.isdigit():
                json_header = int(value)
        error = held.reserve_decoded(body_reservation(size, json_header))
        if error is not None:
            raise error

    async def _dispatch(self, method: str, path: str, request: HttpRequest) -> Reply:
        found = self.routes.resolve(method, path)
        if isinstance(found, Reply):
            return found  # Triton's 404 or 405
        handler, request.parameters = found
        return await handler(request)

    async def reply(self, method: str, path: str, request: HttpRequest) -> Reply:
        """The HTTP port's answer to `request` sent to `method` `path`, errors included (Vertex AI's redirect header
        reuses it)."""
        try:
            return await self._dispatch(method, path, request)
        except NereidError as exc:
            return error_reply(exc)

    # -- server and model routes --------------------------------------------------------------------------
    async def _server_metadata(self, request: HttpRequest) -> Reply:
        return json_reply(self.server.metadata())

    async def _live(self, request: HttpRequest) -> Reply:
        return Reply(200 if self.server.live else 400, b"", [TEXT])

    async def _ready(self, request: HttpRequest) -> Reply:
        return Reply(200 if self.server.ready() else 400, b"", [TEXT])

    async def _model_metadata(self, request: HttpRequest) -> Reply:
        return json_reply(self.server.model_metadata(*_model_and_version(request.parameters)))

    async def _model_ready(self, request: HttpRequest) -> Reply:
        return _EMPTY_TEXT_OK if await self.server.model_is_ready(*_model_and_version(request.parameters)) else _NOT_READY

    async def _model_config(self, request: HttpRequest) -> Reply:
        return json_reply(config_to_json_dict(self.server.model_config(*_model_and_version(request.parameters))))

    async def _model_statistics(self, request: HttpRequest) -> Reply:
        """/v2/models/stats (every model) and a model's or version's statistics."""
        model, version = _model_and_version(request.parameters) if request.parameters else ("", "")
        return json_reply({"model_stats": self.server.statistics(model, version)})

    async def _log_settings(self, request: HttpRequest) -> Reply:
        return json_reply(log_settings())

    async def _update_log_settings(self, request: HttpRequest) -> Reply:
        return json_reply(update_log_settings(json_object(request.body)))

    async def _trace_settings(self, request: HttpRequest) -> Reply:
        return json_reply(self.server.trace_setting(_first(request.parameters)))

    async def _update_trace_settings(self, request: HttpRequest) -> Reply:
        return json_reply(self.server.trace_setting(_first(request.parameters), lambda: json_object(request.body)))

    # -- inference ----------------------------------------------------------------------------------------
    async def _infer(self, request: HttpRequest) -> Reply:
        model, version = _model_and_version(request.parameters)
        # The model comes first, so that an unknown model is the error reported whatever the body holds; Triton
        # sends this error and the decoupled refusal as text/plain (its other /infer errors as JSON).
        try:
            mv = await self.server.model_for_infer(model, version, _HTTP_ENDPOINT)
        except NereidError as exc:
            return error_reply(exc, TEXT)
        try:
            header_length = _inference_header_length(request.headers, len(request.body))
        except _HeaderLengthOutOfRange as exc:
            return error_reply(exc, TEXT)  # text/plain, as Triton
        inference = self._decode(mv, model, version, request.body, header_length, request.headers)
        if self.tracing.enabled:
            inference.trace = request.frontend_trace
            if self.tracing.otel is not None:
                inference.trace_context = request.header(b"traceparent")
        return _response_reply(await self.execute(request, inference), inference)

    def start_infer(self, path: str, headers: Headers, body: bytes, answer: Answer) -> InferenceRequest | None:
        """/infer without a task or an await, as the gRPC port's start_ModelInfer: the body is decoded and the request
        submitted here, and `answer(status, headers, body)` is called once, from the scheduler's callback (or from
        here, for an error before execution). Returns the request (the server sets its `cancelled` when the client
        goes away), or None, with nothing answered: the ASGI call takes this request. Everything but the plain
        case goes there, so the errors and extensions stay written once: the restricted-API guard, tracing, an
        unknown, decoupled or not yet loaded model, a compressed body and a malformed header length."""
        if self.guard is not None or self.tracing.enabled:
            return None
        found = self.routes.resolve("POST", path)
        if isinstance(found, Reply) or found[0] != self._infer:
            return None
        model, version = _model_and_version(found[1])
        try:
            mv = self.server.model(model, version)
        except NereidError:
            return None
        if mv.decoupled:
            return None
        for key, _ in headers:
            if key == b"content-encoding":
                return None
        try:
            header_length = _inference_header_length(headers, len(body))
        except NereidError:
            return None  # answered in _infer's words

        def finish(response: InferenceResponse) -> None:
            try:
                reply = _response_reply(response, request)
            except NereidError as exc:
                reply = error_reply(exc)
            except Exception as exc:  # the scheduler's callback must not raise: other requests of the batch follow
                log.exception("unhandled error encoding the response of model '%s'", model)
                reply = error_reply(NereidError.internal(f"{type(exc).__name__}: {exc}"))
            answer(reply.status, *_encoded(reply, headers))

        try:
            request = self._decode(mv, model, version, body, header_length, headers)
            if not self.server.submit(request, finish):
                asyncio.get_running_loop().create_task(self._infer_later(request, finish))
        except NereidError as exc:
            reply = error_reply(exc)
            answer(reply.status, *_encoded(reply, headers))
            return None
        return request

    async def _infer_later(self, request: InferenceRequest, finish: Callable[[InferenceResponse], None]) -> None:
        """start_infer's request when the server wants the coroutine path for it (the response cache)."""
        try:
            response = await self.server.infer(request, raise_error=False)
        except NereidError as exc:
            response = InferenceResponse(request.model_name, request.model_version, request.id, error=exc)
        except Exception as exc:  # never leave the client without an answer
            log.exception("unhandled error for model '%s'", request.model_name)
            error = NereidError.internal(f"{type(exc).__name__}: {exc}")
            response = InferenceResponse(request.model_name, request.model_version, request.id, error=error)
        finish(response)

    async def decode_infer(
        self, request: HttpRequest, model: str, version: str, header_length: int | None
    ) -> InferenceRequest:
        """The inference request of a v2 body (JSON, or JSON header of `header_length` bytes then binary data);
        an unknown model is the error reported whatever the body holds, as Triton does."""
        mv = await self.server.model_for_infer(model, version, _HTTP_ENDPOINT)
        return self._decode(mv, model, version, request.body, header_length, request.headers)

    def _decode(
        self, mv: ServedModel, model: str, version: str, body: bytes, header_length: int | None, headers: Headers
    ) -> InferenceRequest:
        if header_length == 0:  # the body is only the data of the model's one input
            request = decode_raw_request(body, model, version, mv.config)
        else:
            request = decode_request(body, header_length, model, version, self.server.shared_memory)
        if self.forwarder is not None:
            self.forwarder.forward(getattr(headers, "raw", headers), request.parameters)
        return request

    async def execute(self, request: HttpRequest, inference: InferenceRequest, raise_error: bool = True) -> InferenceResponse:
        """Run `inference`, decoded from `request`, cancelled if the client goes away; with `raise_error=False` an
        error of the execution comes back in the response (the cloud endpoints answer those differently)."""
        with request.disconnect_watch():
            return await self.server.infer(inference, raise_error=raise_error)
        raise client_disconnected()

    async def _generate_route(self, stream: bool, request: HttpRequest) -> Reply:
        return await self.generate(request, *_model_and_version(request.parameters), stream)

    async def generate(self, request: HttpRequest, model: str, version: str, stream: bool) -> Reply:
        """The generate extension's answer to `request` (Server-Sent Events in `reply.stream` when streaming)."""
        mv = await self.server.wait_model(model, version)
        inference = generate_request(request.body, model, version, mv.config)
        if not stream:
            if mv.decoupled:
                try:
                    answer = await _one_decoupled_response(self.server, inference, request.receive)
                    return Reply(200, generate_body(answer), [JSON])
                except _SeveralResponses as exc:
                    return Reply(200, orjson.dumps({"error": str(exc)}), [JSON])  # Triton 2.51 answers 200 too
            return Reply(200, generate_body(await self.execute(request, inference)), [JSON])
        responses = self.server.infer_stream(inference)
        first = await anext(responses)  # errors before the first response are plain HTTP errors
        # An error as the first response is the stream's only event, under 400: Triton 2.51 answers so whatever the
        # error (asked, with L0_http's mock_llm failing at once), and a client reads the event with its SSE parser.
        reply = Reply(400 if first.error is not None else 200, b"", _EVENT_STREAM)
        reply.stream = sse_events(_prepend(first, responses))
        return reply

    # -- repository and shared memory ---------------------------------------------------------------------
    async def _repository_index(self, request: HttpRequest) -> Reply:
        options = json_object(request.body) if request.body else {}
        ready = options.get("ready", False)
        if not isinstance(ready, bool):
            raise NereidError.invalid("Invalid value for 'ready': expected a boolean")  # tritonserver's words
        return json_reply(self.server.repository_index(ready))

    async def _load(self, request: HttpRequest) -> Reply:
        given = (json_object(request.body) if request.body else {}).get("parameters")
        if given is not None and not isinstance(given, dict):
            raise NereidError.internal("attempt to get members for non-object")  # Triton's words and status
        await self.server.load_model(request.parameters[0], given or {})
        return _EMPTY_OK

    async def _unload(self, request: HttpRequest) -> Reply:
        given = (json_object(request.body) if request.body else {}).get("parameters")
        # Triton's unload reads the members of an object only: other values are no parameters, not an error.
        await self.server.unload_model(request.parameters[0], given if isinstance(given, dict) else {})
        return _EMPTY_OK

    async def _shared_memory_status(self, kind: str, request: HttpRequest) -> Reply:
        return json_reply(self.server.shared_memory_status(kind, _first(request.parameters)))

    async def _register(self, kind: str, request: HttpRequest) -> Reply:
        if not request.parameters:  # Triton reads the path before anything else
            raise NereidError.invalid(f"'region name' is necessary to register {kind} shared memory region")

        def span() -> tuple[str, int, int]:
            options = json_object(request.body)
            try:
                return str(options["key"]), int(options.get("offset", 0)), int(options["byte_size"])
            except KeyError as exc:
                raise NereidError.invalid(f"Shared memory register request has no {exc} field") from None
            except (TypeError, ValueError):
                raise NereidError.invalid(
                    "Shared memory register request: 'key' must be a string, 'offset' and 'byte_size' integers"
                ) from None

        self.server.register_shared_memory(kind, request.parameters[0], span)
        return _EMPTY_OK

    async def _unregister(self, kind: str, request: HttpRequest) -> Reply:
        self.server.unregister_shared_memory(kind, _first(request.parameters))
        return _EMPTY_OK


# The endpoint HTTP's decoupled refusal names (gRPC's ModelInfer names itself).
_HTTP_ENDPOINT = "HTTP end point"


async def _send_forbidden(send: Send, body: bytes) -> None:
    """Triton's answer to a request of a restricted API without the header: 403, JSON text as text/plain."""
    await send({"type": "http.response.start", "status": 403, "headers": [TEXT, (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


async def _prepend(first: InferenceResponse, rest: AsyncIterator[InferenceResponse]) -> AsyncIterator[InferenceResponse]:
    try:
        yield first
        if not first.final:
            async for response in rest:
                yield response
    finally:
        await rest.aclose()  # type: ignore[attr-defined]  # a stream closed early cancels its request


async def send_stream(reply: Reply, send: Send, receive: Receive) -> None:
    """Server-Sent Events: headers first, then one body chunk per event as it is produced; a client that goes away
    (an http.disconnect from `receive`) ends the stream, which cancels its request."""
    assert reply.stream is not None
    await send({"type": "http.response.start", "status": reply.status, "headers": reply.headers})
    try:
        with DisconnectWatch(receive) as watch:
            async for chunk in reply.stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    finally:
        await reply.stream.aclose()  # type: ignore[attr-defined]
    if not watch.disconnected:
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _SeveralResponses(Exception):
    pass


async def _one_decoupled_response(server: Server, request: InferenceRequest, receive: Receive) -> InferenceResponse:
    """generate (not _stream) on a decoupled model: the model must answer with one response."""
    answer: InferenceResponse | None = None
    responses = server.infer_stream(request)
    try:
        with DisconnectWatch(receive) as watch:
            async for response in responses:
                if response.error is not None:
                    raise response.error
                if response.complete_only:
                    continue
                if answer is not None:
                    raise _SeveralResponses(
                        "generate expects model to produce exactly 1 response, use generate stream for model that "
                        "generates various number of responses"
                    )
                answer = response
    finally:
        await responses.aclose()  # type: ignore[attr-defined]
    if watch.disconnected:
        raise client_disconnected()
    if answer is None:  # Triton's words (and status) for none as for several
        raise NereidError.internal(
            f"generate expects model to produce exactly 1 response, use generate stream for model that generates "
            f"various number of responses (model '{request.model_name}' sent none)"
        )
    return answer


def _response_reply(response: InferenceResponse, request: InferenceRequest) -> Reply:
    """/infer's answer: the error of the execution, or the outputs as JSON (binary ones after the JSON header)."""
    if response.error is not None:
        return error_reply(response.error)
    payload, json_length = encode_response(response, request)
    if json_length is None:
        return Reply(200, payload, [JSON], compressible=True)
    return Reply(
        200,
        payload,
        [(b"content-type", b"application/octet-stream"), (b"inference-header-content-length", str(json_length).encode())],
        compressible=True,
    )


def _encoded(reply: Reply, headers: Headers) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and body to send: compressed with gzip or deflate when the reply may be and the client accepts."""
    if reply.compressible and reply.body:
        encoding = _accepted_encoding(headers)
        if encoding is not None:
            body = gzip.compress(reply.body, 1) if encoding == b"gzip" else zlib.compress(reply.body, 1)
            return reply.headers + [(b"content-encoding", encoding)], body
    return reply.headers, reply.body


def _accepted_encoding(headers: Headers) -> bytes | None:
    """gzip or deflate when the client accepts one (q > 0), preferring the higher q, then gzip."""
    for key, value in headers:
        if key == b"accept-encoding":
            best: bytes | None = None
            best_q = 0.0
            for item in value.lower().split(b","):
                coding, _, params = item.partition(b";")
                coding = coding.strip()
                if coding not in (b"gzip", b"deflate"):
                    continue
                q = 1.0
                params = params.strip()
                if params.startswith(b"q="):
                    try:
                        q = float(params[2:])
                    except ValueError:
                        q = 0.0
                if q > best_q or (q == best_q and q > 0 and coding == b"gzip"):
                    best, best_q = coding, q
            return best
    return None
