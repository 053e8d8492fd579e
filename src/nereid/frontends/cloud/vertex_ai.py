"""Triton's Vertex AI endpoint (--allow-vertex-ai): AIP_HEALTH_ROUTE answers readiness, AIP_PREDICT_ROUTE runs a
v2 inference body on the default model, or, with the X-Vertex-Ai-Triton-Redirect header, the v2 API the header
names. Routing only: every answer comes from the HTTP frontend (its codec, its handlers) over the Server."""

from __future__ import annotations

import logging
import re

from nereid.core.errors import NereidError
from nereid.core.settings import VertexAiSettings
from nereid.frontends.cloud.common import (
    JSON,
    TEXT,
    CloudEndpointApp,
    error_reply,
    header_length,
    text_reply,
)
from nereid.frontends.http.app import HttpApp
from nereid.frontends.http.codec import encode_response
from nereid.frontends.http.reply import NOT_ALLOWED_TEXT, Reply
from nereid.frontends.http.request import HttpRequest
from nereid.frontends.http.server import HttpServer
from nereid.metrics import MetricsApp, render
from nereid.server import Server

__all__ = ["VERTEX_AI_BINARY_MIME", "VertexAiApp", "default_vertex_model", "vertex_ai_server"]

log = logging.getLogger("nereid.vertex_ai")

VERTEX_AI_BINARY_MIME = b"application/vnd.vertex-ai-triton.binary+json;json-header-size="
_REDIRECT_HEADER = b"x-vertex-ai-triton-redirect"

# The v2 routes a redirect may name, and the HTTP method each is served with (the request itself is a POST).
_MODEL = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?(?:/(infer|ready|config|stats))?")
_HEALTH = re.compile(r"/v2/health/(live|ready)")
_SHARED_MEMORY = re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/([^/]+))?/(status|register|unregister)")
_REPOSITORY = re.compile(r"/v2/repository(?:/([^/]+))?/(?:index|models/([^/]+)/(load|unload))")


def default_vertex_model(settings: VertexAiSettings, ready_models: list[str]) -> str:
    """The model the predict route serves, chosen as tritonserver chooses it when the endpoint starts; raises
    ValueError with Triton's message when there is none."""
    if not settings.default_model:
        if len(ready_models) != 1:
            raise ValueError("Expect the model repository contains only a single model if default model is not specified")
        return ready_models[0]
    if settings.default_model not in ready_models:
        raise ValueError(f"Expect the default model '{settings.default_model}' is loaded")
    return settings.default_model


class VertexAiApp(CloudEndpointApp):
    """The ASGI app of the Vertex AI port."""

    endpoint_name = "Vertex AI"

    def __init__(self, server: Server, settings: VertexAiSettings, default_model: str, http: HttpApp | None = None) -> None:
        self.server = server
        self.settings = settings
        self.default_model = default_model
        self.http = http if http is not None else HttpApp(server)
        self.metrics = MetricsApp(server)
        self.max_input_size = server.settings.http_max_input_size
        # Routes are regular expressions in tritonserver; a plain path matches itself.
        self.predict_route = re.compile(settings.predict_route)
        self.health_route = re.compile(settings.health_route)

    async def _route(self, method: str, path: str, request: HttpRequest) -> Reply:
        headers = request.headers
        if self.health_route.fullmatch(path):
            if method != "GET":
                return NOT_ALLOWED_TEXT
            return text_reply(200 if self.server.ready() else 400)
        if not self.predict_route.fullmatch(path):
            return text_reply(400)
        redirect = next((value.decode("latin-1") for key, value in headers if key == _REDIRECT_HEADER), None)
        if redirect is None:
            return await self._infer(method, self.default_model, "", request)
        if method != "POST":
            return text_reply(405)
        target = "/" + redirect  # the header names the route without its leading slash
        log.debug("Redirecting Vertex AI request: %s", target)
        denial = self.http.guard.denial(target, headers) if self.http.guard is not None else None
        if denial is not None:
            return Reply(403, denial, [TEXT])
        if target == "/metrics":
            return Reply(200, render(self.metrics.registry), [TEXT])
        if target == "/v2/models/stats" or target == "/v2" or _HEALTH.fullmatch(target):
            return await self.http.reply("GET", target, request)
        match = _MODEL.fullmatch(target)
        if match is not None:
            if match[3] == "infer":
                return await self._infer(method, match[1], match[2] or "", request)
            return await self.http.reply("GET", target, request)
        match = _SHARED_MEMORY.fullmatch(target)
        if match is not None:
            return await self.http.reply("GET" if match[2] == "status" else "POST", target, request)
        if _REPOSITORY.fullmatch(target):
            return await self.http.reply("POST", target, request)
        return text_reply(400)

    async def _infer(self, method: str, model: str, version: str, request: HttpRequest) -> Reply:
        if method != "POST":
            return NOT_ALLOWED_TEXT
        try:
            self.server.model(model, version)
            length = header_length(request.headers, VERTEX_AI_BINARY_MIME, len(request.body))
        except NereidError as exc:
            return error_reply(exc)
        try:
            inference = await self.http.decode_infer(request, model, version, length)
            response = await self.http.execute(request, inference, raise_error=False)
        except NereidError as exc:
            return error_reply(exc, content_type=JSON)
        if response.error is not None:  # the model's own failure: Triton sends it as text/plain
            return error_reply(response.error)
        payload, json_length = encode_response(response, inference)
        if json_length is None:
            return Reply(200, payload, [JSON])
        return Reply(200, payload, [(b"content-type", b"application/octet-stream"),
                                    (b"inference-header-content-length", str(json_length).encode())])  # fmt: skip


def vertex_ai_server(server: Server, settings: VertexAiSettings, default_model: str, http: HttpApp | None = None) -> HttpServer:
    """The Vertex AI port on Nereid's own HTTP/1.1 transport."""
    return HttpServer(
        VertexAiApp(server, settings, default_model, http), settings.address, settings.port,
        request_memory=server.request_memory,
    )
