"""The control plane of a perf run: model metadata and config, the statistics endpoint and system shared-memory
registration, over HTTP (stdlib `http.client`) or gRPC (the v2 stubs). Not on the measured path."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from nereid.tools.common import AddressError, split_host_port
from nereid.tools.perf.config import PerfConfig, PerfError

__all__ = ["ControlClient", "ModelInfo", "TensorSpec", "connect", "fetch_model_info", "split_url"]


@dataclass(slots=True)
class TensorSpec:
    name: str
    datatype: str
    dims: list[int]  # without the batch dimension


@dataclass(slots=True)
class ModelInfo:
    name: str
    version: str  # the version asked for ("" = the server's choice)
    platform: str
    max_batch_size: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    decoupled: bool
    sequence: bool  # the config has sequence_batching


class ControlClient(Protocol):
    url: str

    def server_live(self) -> None: ...
    def model_metadata(self, model: str, version: str) -> dict[str, Any]: ...
    def model_config(self, model: str, version: str) -> dict[str, Any]: ...
    def statistics(self, model: str, version: str) -> dict[str, Any]: ...
    def register_system_shm(self, name: str, key: str, byte_size: int) -> None: ...
    def unregister_system_shm(self, name: str) -> None: ...
    def close(self) -> None: ...


def split_url(url: str, default_port: int) -> tuple[str, int]:
    """`-u host[:port]` into its parts, refused as a PerfError (see tools.common.split_host_port)."""
    try:
        return split_host_port(url, default_port, "-u")
    except AddressError as exc:
        raise PerfError(str(exc)) from None


def _model_path(model: str, version: str) -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    if version:
        path += f"/versions/{quote(version, safe='')}"
    return path


class HttpControlClient:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url
        self.host, self.port = split_url(url, 8000)
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self._conn.request(method, path, body=payload, headers=headers)
                reply = self._conn.getresponse()
                raw = reply.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self.close()
                if attempt:
                    raise PerfError(f"the server at {self.url} closed the connection ({exc})") from None
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise PerfError(f"cannot reach the server at {self.url} over HTTP: {_reason(exc)}") from None
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = {"error": raw[:200].decode("utf-8", "replace")}
        return reply.status, doc

    def _get_ok(self, path: str, what: str) -> dict[str, Any]:
        status, doc = self._request("GET", path)
        if status != 200:
            raise PerfError(f"{what}: {_error_text(doc, status)}")
        return doc if isinstance(doc, dict) else {}

    def server_live(self) -> None:
        status, doc = self._request("GET", "/v2/health/live")
        if status != 200:
            raise PerfError(f"the server at {self.url} is not live: {_error_text(doc, status)}")

    def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        return self._get_ok(_model_path(model, version), f"model '{model}' is not available on {self.url}")

    def model_config(self, model: str, version: str) -> dict[str, Any]:
        return self._get_ok(_model_path(model, version) + "/config", f"cannot read the config of model '{model}'")

    def statistics(self, model: str, version: str) -> dict[str, Any]:
        return self._get_ok(_model_path(model, version) + "/stats", f"cannot read the statistics of model '{model}'")

    def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        path = f"/v2/systemsharedmemory/region/{quote(name, safe='')}/register"
        status, doc = self._request("POST", path, {"key": key, "offset": 0, "byte_size": byte_size})
        if status != 200:
            raise PerfError(f"cannot register shared-memory region '{name}': {_error_text(doc, status)}")

    def unregister_system_shm(self, name: str) -> None:
        self._request("POST", f"/v2/systemsharedmemory/region/{quote(name, safe='')}/unregister")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class GrpcControlClient:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self.url = url
        host, port = split_url(url, 8001)
        self._grpc = grpc
        self._pb = service_pb2
        self.timeout = timeout
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)])
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    def _call(self, method: str, request: Any, what: str) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except self._grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            if code in (self._grpc.StatusCode.UNAVAILABLE, self._grpc.StatusCode.DEADLINE_EXCEEDED) and method == "ServerLive":
                raise PerfError(f"cannot reach the server at {self.url} over gRPC: {details}") from None
            raise PerfError(f"{what}: {details}") from None

    def server_live(self) -> None:
        reply = self._call("ServerLive", self._pb.ServerLiveRequest(), f"the server at {self.url} is not live")
        if not reply.live:
            raise PerfError(f"the server at {self.url} is not live")

    def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        reply = self._call(
            "ModelMetadata",
            self._pb.ModelMetadataRequest(name=model, version=version),
            f"model '{model}' is not available on {self.url}",
        )

        def tensors(items: Any) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": [int(d) for d in t.shape]} for t in items]

        return {
            "name": reply.name,
            "versions": list(reply.versions),
            "platform": reply.platform,
            "inputs": tensors(reply.inputs),
            "outputs": tensors(reply.outputs),
        }

    def model_config(self, model: str, version: str) -> dict[str, Any]:
        from google.protobuf import json_format

        reply = self._call(
            "ModelConfig", self._pb.ModelConfigRequest(name=model, version=version), f"cannot read the config of model '{model}'"
        )
        return json_format.MessageToDict(reply.config, preserving_proto_field_name=True)

    def statistics(self, model: str, version: str) -> dict[str, Any]:
        reply = self._call(
            "ModelStatistics",
            self._pb.ModelStatisticsRequest(name=model, version=version),
            f"cannot read the statistics of model '{model}'",
        )
        stats = []
        for item in reply.model_stats:
            inference = {
                key: {"count": int(getattr(item.inference_stats, key).count), "ns": int(getattr(item.inference_stats, key).ns)}
                for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
            }
            stats.append(
                {
                    "name": item.name,
                    "version": item.version,
                    "inference_count": int(item.inference_count),
                    "execution_count": int(item.execution_count),
                    "inference_stats": inference,
                }
            )
        return {"model_stats": stats}

    def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        self._call(
            "SystemSharedMemoryRegister",
            self._pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=0, byte_size=byte_size),
            f"cannot register shared-memory region '{name}'",
        )

    def unregister_system_shm(self, name: str) -> None:
        try:
            self._stub.SystemSharedMemoryUnregister(self._pb.SystemSharedMemoryUnregisterRequest(name=name), timeout=self.timeout)
        except self._grpc.RpcError:
            pass

    def close(self) -> None:
        self._channel.close()


def connect(config: PerfConfig) -> ControlClient:
    """A control client for the protocol under test; raises `PerfError` when the server cannot be reached."""
    client: ControlClient
    if config.protocol == "grpc":
        client = GrpcControlClient(config.server_url)
    else:
        client = HttpControlClient(config.server_url)
    try:
        client.server_live()
    except PerfError:
        client.close()
        raise
    return client


def fetch_model_info(client: ControlClient, model: str, version: str) -> ModelInfo:
    metadata = client.model_metadata(model, version)
    config = client.model_config(model, version)
    max_batch = int(config.get("max_batch_size", 0) or 0)

    def specs(items: list[dict[str, Any]]) -> list[TensorSpec]:
        out = []
        for item in items:
            shape = [int(d) for d in item.get("shape", [])]
            if max_batch > 0 and shape:
                shape = shape[1:]
            out.append(TensorSpec(item["name"], item["datatype"], shape))
        return out

    policy = config.get("model_transaction_policy") or {}
    return ModelInfo(
        name=model,
        version=version,
        platform=str(metadata.get("platform", "")),
        max_batch_size=max_batch,
        inputs=specs(metadata.get("inputs", [])),
        outputs=specs(metadata.get("outputs", [])),
        decoupled=bool(policy.get("decoupled", False)),
        sequence="sequence_batching" in config,
    )


def _error_text(doc: Any, status: int) -> str:
    if isinstance(doc, dict) and doc.get("error"):
        return str(doc["error"])
    return f"HTTP {status}"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
