"""Triton's SageMaker endpoint (--allow-sagemaker): GET /ping, POST /invocations on the default model, and the
multi-model endpoint's /models routes (list, describe, load from a folder, invoke, unload). Routes and
answers only: inference goes through the HTTP frontend's codec and the Server, never around them."""

from __future__ import annotations

import asyncio
import base64
import logging
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from google.protobuf import json_format

from nereid.config.model_config import read_config_file
from nereid.core.errors import NereidError, Status
from nereid.core.settings import SagemakerSettings
from nereid.frontends.cloud.common import (
    JSON,
    TEXT,
    CloudEndpointApp,
    error_reply,
    header_length,
    text_reply,
)
from nereid.frontends.http.app import HttpApp
from nereid.frontends.http.codec import encode_response, json_object
from nereid.frontends.http.reply import NOT_ALLOWED_TEXT, Reply
from nereid.frontends.http.request import HttpRequest
from nereid.frontends.http.server import HttpServer
from nereid.server import Server

__all__ = ["SAGEMAKER_BINARY_MIME", "SagemakerApp", "sagemaker_server"]

log = logging.getLogger("nereid.sagemaker")

SAGEMAKER_BINARY_MIME = b"application/vnd.sagemaker-triton.binary+json;json-header-size="
_MODELS_ROUTE = re.compile(r"/models(?:/)?([^/]+)?(/invoke)?")
_TARGET_HEADER = b"x-amzn-sagemaker-target-model"
# SageMaker's model archives unpack to /opt/ml/models/<hash>/model[/<folder>]; the repository is <hash>.
_ARCHIVE_PATH = re.compile(r"(/opt/ml/models/[0-9A-Za-z._]+)/(model)/?([0-9A-Za-z._]+)?")
_ENSEMBLE = re.compile(r'platform:(\s)*"ensemble"')
# Error texts that mean the model ran out of memory: SageMaker expects 507 for them, to place the model elsewhere.
_OUT_OF_MEMORY = (
    "CUDA out of memory", "CUDA_OUT_OF_MEMORY", "Out of memory", "Out Of Memory", "out of memory", "MemoryError",
    "OutOfMemory", "OOM", "Dst tensor is not initialized", "Src tensor is not initialized", "CNMEM_STATUS_OUT_OF_MEMORY",
    "CUDNN_STATUS_NOT_INITIALIZED", "CUBLAS_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_NOT_INITIALIZED",
    "Failed to allocate memory", "failed to allocate memory", "No space left on device",
)  # fmt: skip


@dataclass(slots=True)
class _LoadedModel:
    url: str  # the folder it was loaded from, as GET /models reports it
    target: str  # the name it is served under
    composing: list[str]  # an ensemble's own models, loaded from the same folder


def _out_of_memory(error: NereidError) -> bool:
    return any(text in error.message for text in _OUT_OF_MEMORY)


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


class SagemakerApp(CloudEndpointApp):
    """The ASGI app of the SageMaker port."""

    endpoint_name = "SageMaker"

    def __init__(self, server: Server, settings: SagemakerSettings, http: HttpApp | None = None) -> None:
        self.server = server
        self.settings = settings
        self.http = http if http is not None else HttpApp(server)
        self.max_input_size = server.settings.http_max_input_size
        self.models: dict[str, _LoadedModel] = {}  # the multi-model endpoint's models, by SageMaker's model name
        self._lock = asyncio.Lock()

    async def _route(self, method: str, path: str, request: HttpRequest) -> Reply:
        headers = request.headers
        if path == "/ping":
            if method != "GET":
                return NOT_ALLOWED_TEXT
            healthy = self.server.live if self.settings.ping_mode == "live" else self.server.ready()
            return text_reply(200 if healthy else 400)
        if path == "/invocations":
            if method != "POST":
                return NOT_ALLOWED_TEXT
            if self.settings.inference_type != "infer":
                stream = self.settings.inference_type == "generate_stream"
                return await self.http.generate(request, self.settings.default_model, "", stream)
            return await self._invoke(self.settings.default_model, request, multi_model=False)
        match = _MODELS_ROUTE.fullmatch(path)
        if match is None:
            return text_reply(400)
        name, invoke = match[1] or "", match[2] is not None
        if method == "POST" and invoke:
            if name not in self.models:
                return text_reply(404)
            target = _header(headers, _TARGET_HEADER) or name
            log.info("Invoking SageMaker TargetModel: %s", target)
            return await self._invoke(target, request, multi_model=True)
        if method in ("GET", "POST", "DELETE") and self.http.guard is not None:
            # Listing, loading and unloading are the model-repository API (the category of the v2 index route),
            # restricted by --http-restricted-api as current Triton restricts them.
            denial = self.http.guard.denial("/v2/repository/index", headers)
            if denial is not None:
                return Reply(403, denial, [TEXT])
        if method == "GET":
            return self._list() if not name else self._describe(name)
        if method == "POST":
            return await self._load(request.body, headers)
        if method == "DELETE":
            return await self._unload(name, headers)
        return text_reply(400)

    # -- inference ------------------------------------------------------------------------------------------
    async def _invoke(self, model: str, request: HttpRequest, multi_model: bool) -> Reply:
        try:
            self.server.model(model)
            length = header_length(request.headers, SAGEMAKER_BINARY_MIME, len(request.body))
        except NereidError as exc:
            # Found before the request is built: /invocations answers these with their own status.
            return error_reply(exc, status=self._failure_status(exc) if multi_model else None, content_type=JSON if multi_model else TEXT)
        # The multi-model invoke answers every error 400 (507: out of memory), as Triton keeps SageMaker's contract.
        status = None
        try:
            inference = await self.http.decode_infer(request, model, "", length)
            response = await self.http.execute(request, inference, raise_error=False)
        except NereidError as exc:
            return error_reply(exc, status=self._failure_status(exc) if multi_model else None, content_type=JSON)
        if response.error is not None:  # the model's own failure: Triton sends it as text/plain
            if multi_model:
                status = self._failure_status(response.error)
            return error_reply(response.error, status=status)
        payload, json_length = encode_response(response, inference)
        if json_length is None:
            return Reply(200, payload, [JSON])
        return Reply(200, payload, [(b"content-type", SAGEMAKER_BINARY_MIME + str(json_length).encode())])

    @staticmethod
    def _failure_status(error: NereidError) -> int:
        return 507 if _out_of_memory(error) else 400

    # -- the multi-model endpoint ---------------------------------------------------------------------------
    def _list(self) -> Reply:
        entries = []
        for name, loaded in self.models.items():
            # Triton lists a model that is not ready (still loading, failed) as an empty object.
            ready = self.server.model_ready(loaded.target)
            entries.append({"modelName": name, "modelUrl": loaded.url} if ready else {})
        return text_reply(200, orjson.dumps({"models": entries}))

    def _describe(self, name: str) -> Reply:
        loaded = self.models.get(name)
        if loaded is None:
            return text_reply(404)
        return text_reply(200, orjson.dumps({"modelName": name, "modelUrl": loaded.url}))

    async def _load(self, body: bytes, headers: list[tuple[bytes, bytes]]) -> Reply:
        try:
            request = json_object(body)
        except NereidError as exc:
            return error_reply(exc)
        name, url = request.get("model_name", ""), request.get("url", "")
        if not isinstance(name, str) or not isinstance(url, str):
            return error_reply(NereidError.invalid("'model_name' and 'url' must be strings"))
        target = _header(headers, _TARGET_HEADER) or name
        log.info("Loading SageMaker TargetModel: %s", target)
        path = posixpath.normpath(posixpath.join(str(Path.cwd()), url)) if url else ""
        if path.startswith(("/dev/", "/proc/", "/sys/")):
            log.error("Invalid URL: %s. \"url\" property value cannot start with /dev/, /proc/, or /sys/.", url)
            return text_reply(400)
        folder = Path(path) if path else None
        if folder is None or not folder.is_dir():
            return error_reply(NereidError.invalid(f"failed to register '{path}', repository not found"))
        model_dir, shown_url, others = _model_folder(folder)
        async with self._lock:
            if any(loaded.url == shown_url for loaded in self.models.values()):
                return error_reply(NereidError(Status.ALREADY_EXISTS, f"model repository '{shown_url}' has already been registered"), 409)
            try:
                for other in others:  # an ensemble's composing models keep their own names
                    await self.server.load_model(other.name, _load_parameters(other, other.name))
                await self.server.load_model(target, _load_parameters(model_dir, target))
            except NereidError as exc:
                return error_reply(exc, self._failure_status(exc))
            self.models[name] = _LoadedModel(shown_url, target, [other.name for other in others])
        return text_reply(200)

    async def _unload(self, name: str, headers: list[tuple[bytes, bytes]]) -> Reply:
        async with self._lock:
            loaded = self.models.get(name)
            if loaded is None:
                log.debug("Model %s is not loaded.", name)
                return text_reply(404)
            target = _header(headers, _TARGET_HEADER) or name
            log.info("Unloading SageMaker TargetModel: %s", target)
            try:
                # Dependents go too: an ensemble's composing models were loaded with it.
                await self.server.unload_model(target, {"unload_dependents": True})
                for other in loaded.composing:
                    if self.server.model_ready(other):
                        await self.server.unload_model(other)
            except NereidError as exc:
                return error_reply(exc, 400)
            del self.models[name]
        return text_reply(200)


def _model_folder(folder: Path) -> tuple[Path, str, list[Path]]:
    """The model folder a SageMaker model archive holds, the URL GET /models shows for it, and the other model
    folders an ensemble among them needs. The archive is the model folder itself (config.pbtxt at its top) or
    holds model folders: the ensemble among them, else the single one, is the model."""
    if (folder / "config.pbtxt").is_file():
        match = _ARCHIVE_PATH.fullmatch(str(folder))
        return folder, match[1] if match else str(folder.parent), []
    candidates = sorted(p for p in folder.iterdir() if p.is_dir() and (p / "config.pbtxt").is_file())
    if not candidates:
        return folder, str(folder), []
    ensembles = [p for p in candidates if _ENSEMBLE.search((p / "config.pbtxt").read_text(errors="replace"))]
    if len(candidates) > 5:
        log.warning("Several model directories found. If using ensemble, smaller ensembles are recommended for better memory management.")
    chosen = ensembles[-1] if ensembles else candidates[-1]
    return chosen, str(folder), [p for p in candidates if p != chosen] if ensembles else []


def _load_parameters(model_dir: Path, name: str) -> dict[str, Any]:
    """A load request that serves the folder's model under `name`: its config (renamed) and its files."""
    if not (model_dir / "config.pbtxt").is_file():
        raise NereidError.internal(f"failed to load '{name}', failed to poll from model repository")
    config = read_config_file(model_dir / "config.pbtxt")
    config.name = name
    parameters: dict[str, Any] = {"config": json_format.MessageToJson(config)}
    for file in sorted(model_dir.rglob("*")):
        relative = file.relative_to(model_dir).as_posix()
        if file.is_file() and file != model_dir / "config.pbtxt":
            parameters[f"file:{relative}"] = base64.b64encode(file.read_bytes()).decode("ascii")
        elif file.is_dir() and not any(file.iterdir()):
            # Overrides carry files, not folders: an empty version folder (an ensemble's) needs one to exist.
            parameters[f"file:{relative}/.sagemaker-version"] = ""
    return parameters


def sagemaker_server(server: Server, settings: SagemakerSettings, http: HttpApp | None = None) -> HttpServer:
    """The SageMaker port on Nereid's own HTTP/1.1 transport."""
    return HttpServer(
        SagemakerApp(server, settings, http), settings.address, settings.port,
        request_memory=server.request_memory,
    )
