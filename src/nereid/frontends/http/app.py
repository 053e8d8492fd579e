"""The HTTP/REST frontend as a bare ASGI application (no framework on the hot path), served by frontends/http/server.py."""

from __future__ import annotations

import asyncio
import contextvars
import gzip
import logging
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from nereid.config.model_config import config_to_json_dict
from nereid.core.errors import NereidError, Status, http_status
from nereid.core.server_handle import ServedModel
from nereid.core.tracing import FrontendTrace
from nereid.core.types import InferenceRequest, InferenceResponse
from nereid.frontends.dashboard.app import DashboardApp, is_dashboard_path
from nereid.frontends.http.access import AccessGuard, HeaderForwarder
from nereid.frontends.http.codec import decode_request, encode_response
from nereid.frontends.http.generate import generate_body, generate_request, sse_events
from nereid.frontends.http.raw_binary import decode_raw_request
from nereid.frontends.http.server import DISCONNECT_KEY, RECEIVED_KEY
from nereid.frontends.openai.app import OpenAIApp, is_openai_path, send_openai_error
from nereid.logs import log_settings, update_log_settings
from nereid.server import Server

__all__ = ["HttpApp", "Reply", "bind_request", "send_stream"]

log = logging.getLogger("nereid.http")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_JSON = (b"content-type", b"application/json")
_TEXT = (b"content-type", b"text/plain")


class _Reply:
    """What a handler returns: status, body, extra headers, and whether Accept-Encoding may compress it."""

    __slots__ = ("status", "body", "headers", "compressible", "stream")

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
        compressible: bool = False,
    ) -> None:
        self.status = status
        self.body = body
        self.stream: AsyncIterator[bytes] | None = None  # set for Server-Sent Events
        self.headers = headers if headers is not None else [_JSON]
        # Like Triton, only inference responses are compressed: tritonclient's aio client reads every other
        # answer without decoding it, whatever Accept-Encoding aiohttp sent.
        self.compressible = compressible


Reply = _Reply  # what the SageMaker and Vertex AI frontends build their answers with


def _json(value: Any, status: int = 200) -> _Reply:
    return _Reply(status, orjson.dumps(value))


def _error(error: NereidError) -> _Reply:
    return _Reply(http_status(error.status), orjson.dumps({"error": error.message}))


_EMPTY_OK = _Reply(200, b"", [_JSON])
_NOT_FOUND_BODY = b'{"error":"Not Found"}'
_NOT_ALLOWED_TEXT = _Reply(405, b'{"error":"Method Not Allowed"}', [_TEXT])
_NOT_ALLOWED_JSON = _Reply(405, b'{"error":"Method Not Allowed"}', [_JSON])


def _method_not_allowed(path: str) -> _Reply | None:
    """Triton's 405 when a path names a route but the method is not the route's; None when there is no route.
    The health, model-ready and infer routes answer it as text/plain, the others as JSON, as Triton does."""
    parts = path[1:].split("/")
    if parts[0] != "v2" or "" in parts:
        return None
    rest = parts[1:]
    if not rest or rest in (["models", "stats"], ["logging"], ["trace", "setting"], ["repository", "index"]):
        return _NOT_ALLOWED_JSON
    if rest in (["health", "live"], ["health", "ready"]):
        return _NOT_ALLOWED_TEXT
    if len(rest) == 4 and rest[:2] == ["repository", "models"] and rest[3] in ("load", "unload"):
        return _NOT_ALLOWED_JSON
    if rest[0] in ("systemsharedmemory", "cudasharedmemory"):
        tail = rest[3:] if len(rest) >= 3 and rest[1] == "region" else rest[1:]
        return _NOT_ALLOWED_JSON if tail in (["status"], ["register"], ["unregister"]) else None
    if rest[0] != "models" or len(rest) < 2:
        return None
    tail = rest[2:]
    if tail == ["trace", "setting"]:
        return _NOT_ALLOWED_JSON
    if tail[:1] == ["versions"]:
        if len(tail) < 2 or not tail[1].isdigit():
            return None
        tail = tail[2:]
    if tail in ([], ["config"], ["stats"]):
        return _NOT_ALLOWED_JSON
    if tail in (["ready"], ["infer"]):
        return _NOT_ALLOWED_TEXT
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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # served without lifespan events: only HTTP scopes arrive
        headers = scope["headers"]
        if self.guard is not None:
            denial = self.guard.denial(scope["path"], headers)
            if denial is not None:
                await _send_forbidden(send, denial)
                return
        if is_openai_path(scope["path"]):
            try:
                body = await self._read_body(receive, headers)
            except NereidError as exc:
                await send_openai_error(send, exc)
                return
            await self.openai.handle(scope["method"], scope["path"], body, receive, send)
            return
        held = None
        if self.tracing.enabled:
            received = scope.get(RECEIVED_KEY)
            held = FrontendTrace((("HTTP_RECV_START", received[0]), ("HTTP_RECV_END", received[1])) if received else ())
            _HELD.set(held)
        if self.dashboard is not None and is_dashboard_path(scope["path"]):
            await self.dashboard.handle(scope["method"], scope["path"], scope.get("query_string", b""), send)
            return
        try:
            body = await self._read_body(receive, headers)
            _RECEIVE.set(receive)
            _LOST.set(scope.get(DISCONNECT_KEY))
            reply = await self._dispatch(scope["method"], scope["path"], body, headers)
            if reply.status == 404 and reply.body == _NOT_FOUND_BODY:
                reply = _method_not_allowed(scope["path"]) or reply
        except NereidError as exc:
            reply = _error(exc)
        except Exception as exc:  # never let a bug take the connection down without an answer
            log.exception("unhandled error for %s %s", scope["method"], scope["path"])
            reply = _error(NereidError.internal(f"{type(exc).__name__}: {exc}"))
        if reply.stream is not None:
            await send_stream(reply, send)
            return
        body_out = reply.body
        out_headers = reply.headers
        if reply.compressible and body_out:
            encoding = _accepted_encoding(headers)
            if encoding is not None:
                body_out = gzip.compress(body_out, 1) if encoding == b"gzip" else zlib.compress(body_out, 1)
                out_headers = out_headers + [(b"content-encoding", encoding)]
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

    async def _read_body(self, receive: Receive, headers: list[tuple[bytes, bytes]]) -> bytes:
        message = await receive()
        body = message.get("body", b"")
        if message.get("more_body"):
            parts = [body]
            size = len(body)
            while message.get("more_body"):
                message = await receive()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_input_size:
                    raise self._too_large(size)
                parts.append(chunk)
            body = b"".join(parts)
        if len(body) > self.max_input_size:
            raise self._too_large(len(body))
        for key, value in headers:
            if key == b"content-encoding":
                body = _decompress(body, value, self.max_input_size)
                break
        return body

    def _too_large(self, size: int) -> NereidError:
        return NereidError.invalid(
            f"request body of {size} bytes exceeds the maximum allowed value of {self.max_input_size} bytes; "
            f"use --http-max-input-size to increase the limit"
        )

    async def _dispatch(self, method: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> _Reply:
        parts = path[1:].split("/")
        if parts[0] != "v2" or "" in parts:
            return _Reply(404, b'{"error":"Not Found"}', [_TEXT])
        if len(parts) >= 3 and parts[1] == "models" and parts[2] != "stats":
            return await self._model_route(method, parts[2], parts[3:], body, headers)
        rest = parts[1:]
        server = self.server
        if not rest:
            return _json(server.metadata()) if method == "GET" else _Reply(404, b'{"error":"Not Found"}', [_TEXT])
        head = rest[0]
        if head == "health" and len(rest) == 2 and method == "GET":
            if rest[1] == "live":
                return _Reply(200 if server.live else 400, b"", [_TEXT])
            if rest[1] == "ready":
                return _Reply(200 if server.ready() else 400, b"", [_TEXT])
        if rest == ["models", "stats"] and method == "GET":
            return _json({"model_stats": server.statistics()})
        if head == "repository" and method == "POST":
            return await self._repository(rest[1:], body)
        if rest == ["logging"]:
            if method == "GET":
                return _json(log_settings())
            if method == "POST":
                return _json(update_log_settings(_parse_object(body)))
        if rest == ["trace", "setting"] and method in ("GET", "POST"):
            return self._trace(method, body, "")
        if head in ("systemsharedmemory", "cudasharedmemory"):
            return self._shared_memory(method, head, rest[1:], body)
        return _Reply(404, b'{"error":"Not Found"}', [_TEXT])

    async def _model_route(
        self, method: str, model: str, rest: list[str], body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> _Reply:
        version = ""
        if len(rest) >= 2 and rest[0] == "versions":
            version = rest[1]
            rest = rest[2:]
            if not version.isdigit():
                return _Reply(404, b'{"error":"Not Found"}', [_TEXT])
        server = self.server
        action = rest[0] if rest else ""
        if len(rest) > 1 and rest != ["trace", "setting"]:
            # Triton's routes match the whole path: /v2/models/m/infer/extra names no route.
            return _Reply(404, b'{"error":"Not Found"}', [_TEXT])
        if action == "infer" and method == "POST":
            return await self._infer(model, version, body, headers)
        if action in ("generate", "generate_stream") and method == "POST":
            return await self._generate(model, version, body, stream=action == "generate_stream")
        if method == "GET":
            if action == "":
                return _json(server.model_metadata(model, version))
            if action == "ready":
                if await server.model_is_ready(model, version):
                    return _Reply(200, b"", [_TEXT])
                return _Reply(400, b'{"error":"Model version not ready"}', [_TEXT])
            if action == "config":
                return _json(config_to_json_dict(server.model_config(model, version)))
            if action == "stats":
                return _json({"model_stats": server.statistics(model, version)})
        if action == "trace" and rest[1:] == ["setting"] and not version and method in ("GET", "POST"):
            if not server.model_ready(model):
                raise NereidError.invalid(f"Request for unknown model : {model}")
            return self._trace(method, body, model)
        return _Reply(404, b'{"error":"Not Found"}', [_TEXT])

    async def _generate(self, model: str, version: str, body: bytes, stream: bool) -> _Reply:
        mv = await self.server.wait_model(model, version)
        request = generate_request(body, model, version, mv.config)
        if not stream:
            if mv.decoupled:
                try:
                    return _Reply(200, generate_body(await _one_decoupled_response(self.server, request)), [_JSON])
                except _SeveralResponses as exc:
                    return _Reply(200, orjson.dumps({"error": str(exc)}), [_JSON])  # Triton 2.51 answers 200 too
            response = await _infer_unless_disconnected(self.server, request, _RECEIVE.get())
            return _Reply(200, generate_body(response), [_JSON])
        responses = self.server.infer_stream(request)
        first = await anext(responses)  # errors before the first response are plain HTTP errors
        if first.error is not None and first.final:
            await responses.aclose()  # type: ignore[attr-defined]
            raise first.error  # a request refused before it produced anything (e.g. a prompt beyond the context)
        reply = _Reply(200, b"", [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")])
        reply.stream = sse_events(_prepend(first, responses))
        return reply

    async def _infer(self, model: str, version: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> _Reply:
        # The model comes first, so that an unknown model is the error reported whatever the body holds; Triton
        # sends this error and the decoupled refusal as text/plain (its other /infer errors as JSON).
        try:
            mv = await self._model_for_infer(model, version)
        except NereidError as exc:
            return _Reply(http_status(exc.status), orjson.dumps({"error": exc.message}), [_TEXT])
        if mv.decoupled:
            return _DECOUPLED_OVER_HTTP
        header_length = None
        for key, value in headers:
            if key == b"inference-header-content-length":
                try:
                    header_length = int(value)
                except ValueError:
                    raise NereidError.invalid("Inference-Header-Content-Length must be an integer") from None
                if header_length < 0 or header_length > len(body):
                    message = f"inference header size should be in range (0, {len(body)}), got: {header_length}"
                    return _Reply(400, orjson.dumps({"error": message}), [_TEXT])  # text/plain, as Triton
                break
        request = self._decode(mv, model, version, body, header_length, headers)
        if self.tracing.enabled:
            request.trace = _HELD.get()
            if self.tracing.otel is not None:
                request.trace_context = _header(headers, b"traceparent")
        response = await self.execute(request)
        payload, json_length = encode_response(response, request)
        if json_length is None:
            return _Reply(200, payload, [_JSON], compressible=True)
        return _Reply(
            200,
            payload,
            [(b"content-type", b"application/octet-stream"), (b"inference-header-content-length", str(json_length).encode())],
            compressible=True,
        )

    async def decode_infer(
        self, model: str, version: str, body: bytes, header_length: int | None, headers: list[tuple[bytes, bytes]]
    ) -> InferenceRequest:
        """The inference request of a v2 body (JSON, or JSON header of `header_length` bytes then binary data);
        an unknown model is the error reported whatever the body holds, as Triton does."""
        mv = await self._model_for_infer(model, version)
        if mv.decoupled:
            raise NereidError.unsupported(_DECOUPLED_MESSAGE)
        return self._decode(mv, model, version, body, header_length, headers)

    async def _model_for_infer(self, model: str, version: str) -> ServedModel:
        """The model version a request names; one in the repository but not loaded is loaded on demand."""
        try:
            return self.server.model(model, version)
        except NereidError:
            if not self.server.loads_on_demand:
                raise
        return await self.server.wait_model(model, version)

    def _decode(
        self, mv: ServedModel, model: str, version: str, body: bytes, header_length: int | None, headers: list[tuple[bytes, bytes]]
    ) -> InferenceRequest:
        if header_length == 0:  # the body is only the data of the model's one input
            request = decode_raw_request(body, model, version, mv.config)
        else:
            request = decode_request(body, header_length, model, version, self.server.shared_memory)
        if self.forwarder is not None:
            self.forwarder.forward(getattr(headers, "raw", headers), request.parameters)
        return request

    async def execute(self, request: InferenceRequest, raise_error: bool = True) -> InferenceResponse:
        """Run a decoded request, cancelled if the client goes away; with `raise_error=False` an error of the
        execution comes back in the response (the cloud endpoints answer those differently)."""
        return await _infer_unless_disconnected(self.server, request, _RECEIVE.get(), raise_error)

    async def generate(self, model: str, version: str, body: bytes, stream: bool) -> _Reply:
        """The generate extension's answer (Server-Sent Events in `reply.stream` when streaming)."""
        return await self._generate(model, version, body, stream)

    async def reply(self, method: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> _Reply:
        """The HTTP port's answer to one request, errors included (Vertex AI's redirect header reuses it)."""
        try:
            return await self._dispatch(method, path, body, headers)
        except NereidError as exc:
            return _error(exc)

    async def _repository(self, rest: list[str], body: bytes) -> _Reply:
        server = self.server
        if rest == ["index"]:
            options = _parse_object(body) if body else {}
            return _json(server.repository_index(bool(options.get("ready", False))))
        if len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"):
            options = _parse_object(body) if body else {}
            parameters = options.get("parameters") or {}
            if rest[2] == "load":
                await server.load_model(rest[1], parameters)
            else:
                await server.unload_model(rest[1], parameters)
            return _EMPTY_OK
        return _Reply(404, b'{"error":"Not Found"}', [_TEXT])

    def _trace(self, method: str, body: bytes, model: str) -> _Reply:
        settings = self.server.trace_settings
        if method == "POST":
            return _json(settings.update(_parse_object(body), model))
        return _json(settings.get(model))

    def _shared_memory(self, method: str, kind: str, rest: list[str], body: bytes) -> _Reply:
        registry = self.server.shared_memory
        region = ""
        if len(rest) >= 2 and rest[0] == "region":
            region = rest[1]
            rest = rest[2:]
        action = rest[0] if rest else ""
        if len(rest) > 1:
            return _Reply(404, b'{"error":"Not Found"}', [_TEXT])  # the action ends the path, as in Triton
        if action == "status" and method == "GET":
            if kind == "cudasharedmemory" and region:
                raise NereidError.not_found(f"Unable to find cuda shared memory region: '{region}'")
            return _json(registry.status(region) if kind == "systemsharedmemory" else [])
        if method != "POST":
            return _Reply(404, b'{"error":"Not Found"}', [_TEXT])
        if action == "unregister":
            registry.check_allowed()
            if kind == "systemsharedmemory":
                registry.unregister(region)
            return _EMPTY_OK
        if action == "register":
            registry.check_allowed()
            if not region:
                kind_name = "system" if kind == "systemsharedmemory" else "cuda"
                raise NereidError.invalid(f"'region name' is necessary to register {kind_name} shared memory region")
            if kind == "cudasharedmemory":
                raise NereidError.unsupported("CUDA shared memory is not supported: this server has no CUDA device")
            options = _parse_object(body)
            try:
                registry.register(region, str(options["key"]), int(options.get("offset", 0)), int(options["byte_size"]))
            except KeyError as exc:
                raise NereidError.invalid(f"Shared memory register request has no {exc} field") from None
            except (TypeError, ValueError):
                raise NereidError.invalid(
                    "Shared memory register request: 'key' must be a string, 'offset' and 'byte_size' integers"
                ) from None
            return _EMPTY_OK
        return _Reply(404, b'{"error":"Not Found"}', [_TEXT])


_DECOUPLED_MESSAGE = "HTTP end point doesn't support models with decoupled transaction policy"
_DECOUPLED_OVER_HTTP = _Reply(501, orjson.dumps({"error": _DECOUPLED_MESSAGE}), [_TEXT])


async def _send_forbidden(send: Send, body: bytes) -> None:
    """Triton's answer to a request of a restricted API without the header: 403, JSON text as text/plain."""
    await send({"type": "http.response.start", "status": 403, "headers": [_TEXT, (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


async def _prepend(first: InferenceResponse, rest: AsyncIterator[InferenceResponse]) -> AsyncIterator[InferenceResponse]:
    try:
        yield first
        if not first.final:
            async for response in rest:
                yield response
    finally:
        await rest.aclose()  # type: ignore[attr-defined]  # a stream closed early cancels its request


async def send_stream(reply: _Reply, send: Send) -> None:
    """Server-Sent Events: headers first, then one body chunk per event as it is produced."""
    assert reply.stream is not None
    await send({"type": "http.response.start", "status": reply.status, "headers": reply.headers})
    task = asyncio.current_task()
    assert task is not None
    disconnected: list[bool] = []
    watcher = asyncio.get_running_loop().create_task(_watch_disconnect(_RECEIVE.get(), task, disconnected))
    try:
        async for chunk in reply.stream:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except asyncio.CancelledError:
        if not disconnected:
            raise
        task.uncancel()  # the client went away: closing the stream below cancels its request
        return
    finally:
        watcher.cancel()
        await reply.stream.aclose()  # type: ignore[attr-defined]
    await send({"type": "http.response.body", "body": b"", "more_body": False})


# The ASGI `receive` of the request being handled (each request runs in its own task and context).
_RECEIVE: contextvars.ContextVar[Receive] = contextvars.ContextVar("receive")
# The connection-lost future, when the HTTP server provides one (see frontends/http/server.py).
_LOST: contextvars.ContextVar[asyncio.Future[None] | None] = contextvars.ContextVar("lost")
# While tracing is on: the request's frontend stamps, which /infer hands to the server with its request.
_HELD: contextvars.ContextVar[FrontendTrace | None] = contextvars.ContextVar("held", default=None)


def bind_request(receive: Receive, scope: Scope) -> None:
    """Make this task's request the one infer_payload/run_infer watch for a client disconnect."""
    _RECEIVE.set(receive)
    _LOST.set(scope.get(DISCONNECT_KEY))


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], flag: list[bool]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    flag.append(True)
    task.cancel()


async def _infer_unless_disconnected(
    server: Server, request: InferenceRequest, receive: Receive, raise_error: bool = True
) -> InferenceResponse:
    """A client that disconnects cancels its request, so a queued one never executes."""
    task = asyncio.current_task()
    assert task is not None
    disconnected: list[bool] = []
    lost = _LOST.get(None)
    if lost is not None:
        # Nereid's own HTTP server hands over the connection's fate: a callback, no watcher task.
        def on_lost(_: Any) -> None:
            disconnected.append(True)
            task.cancel()

        if lost.done():
            raise NereidError(Status.CANCELLED, "Request was cancelled: the client disconnected")
        lost.add_done_callback(on_lost)
        try:
            return await server.infer(request, raise_error=raise_error)
        except asyncio.CancelledError:
            if disconnected:
                task.uncancel()
                raise NereidError(Status.CANCELLED, "Request was cancelled: the client disconnected") from None
            raise
        finally:
            lost.remove_done_callback(on_lost)
    watcher = asyncio.get_running_loop().create_task(_watch_disconnect(receive, task, disconnected))
    try:
        return await server.infer(request, raise_error=raise_error)
    except asyncio.CancelledError:
        if disconnected:
            task.uncancel()
            raise NereidError(Status.CANCELLED, "Request was cancelled: the client disconnected") from None
        raise
    finally:
        watcher.cancel()


class _SeveralResponses(Exception):
    pass


async def _one_decoupled_response(server: Server, request: InferenceRequest) -> InferenceResponse:
    """generate (not _stream) on a decoupled model: the model must answer with one response."""
    task = asyncio.current_task()
    assert task is not None
    disconnected: list[bool] = []
    watcher = asyncio.get_running_loop().create_task(_watch_disconnect(_RECEIVE.get(), task, disconnected))
    answer: InferenceResponse | None = None
    responses = server.infer_stream(request)
    try:
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
    except asyncio.CancelledError:
        if disconnected:
            task.uncancel()
            raise NereidError(Status.CANCELLED, "Request was cancelled: the client disconnected") from None
        raise
    finally:
        watcher.cancel()
        await responses.aclose()  # type: ignore[attr-defined]
    if answer is None:
        raise NereidError.internal(f"model '{request.model_name}' sent no response")
    return answer


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def _parse_object(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError as exc:
        raise NereidError.invalid(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(value, dict):
        raise NereidError.invalid("failed to parse the request JSON buffer: expected a JSON object")
    return value


def _decompress(body: bytes, encoding: bytes, limit: int) -> bytes:
    encoding = encoding.strip().lower()
    try:
        if encoding == b"gzip":
            out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body, limit + 1)
        elif encoding == b"deflate":
            out = zlib.decompressobj().decompress(body, limit + 1)
        elif encoding in (b"identity", b""):
            return body
        else:
            raise NereidError.unsupported(f"unsupported Content-Encoding '{encoding.decode()}'")
    except zlib.error as exc:
        raise NereidError.invalid(f"failed to decompress the request body ({encoding.decode()}): {exc}") from None
    if len(out) > limit:
        raise NereidError.invalid(
            f"decompressed request body exceeds the maximum allowed value of {limit} bytes; use "
            f"--http-max-input-size to increase the limit"
        )
    return out


def _accepted_encoding(headers: list[tuple[bytes, bytes]]) -> bytes | None:
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
