"""Two servers asked one question: real Triton and Nereid started over the same repository, and their answers over
HTTP, gRPC and gRPC health side by side as (triton, nereid)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import requests
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tests.servers import RunningServer, start_nereid, start_real_triton


@dataclass
class Answer:
    status: int
    content_type: str
    body: str

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> str:
        return str(self.json()["error"])


@dataclass
class RpcAnswer:
    code: str
    details: str
    response: Any = None


class Pair:
    """The same question to real Triton and to Nereid; answers come back as (triton, nereid)."""

    def __init__(self, triton: RunningServer, nereid: RunningServer) -> None:
        self.triton = triton
        self.nereid = nereid
        self._channels = {name: grpc.insecure_channel(s.grpc_url) for name, s in self.servers()}

    def servers(self) -> list[tuple[str, RunningServer]]:
        return [("triton", self.triton), ("nereid", self.nereid)]

    def http(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[Answer, Answer]:
        payload = data if data is not None else (json.dumps(body).encode() if body is not None else None)
        answers = []
        for _, server in self.servers():
            r = requests.request(method, server.base + path, data=payload, headers=headers, timeout=60)
            answers.append(Answer(r.status_code, r.headers.get("content-type", ""), r.text))
        return answers[0], answers[1]

    def rpc(self, method: str, request: Any) -> tuple[RpcAnswer, RpcAnswer]:
        answers = []
        for name, _ in self.servers():
            stub = pb_grpc.GRPCInferenceServiceStub(self._channels[name])
            try:
                answers.append(RpcAnswer("OK", "", getattr(stub, method)(request, timeout=60)))
            except grpc.RpcError as exc:
                answers.append(RpcAnswer(exc.code().name, exc.details() or ""))
        return answers[0], answers[1]

    def health(self, service: str) -> tuple[str, str]:
        answers = []
        for name, _ in self.servers():
            stub = health_pb2_grpc.HealthStub(self._channels[name])
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=30).status
                answers.append(health_pb2.HealthCheckResponse.ServingStatus.Name(status))
            except grpc.RpcError as exc:
                answers.append(exc.code().name)
        return answers[0], answers[1]

    def index_entries(self, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        triton, nereid = self.http("POST", "/v2/repository/index")
        assert triton.status == nereid.status == 200
        return [e for e in triton.json() if e["name"] == name], [e for e in nereid.json() if e["name"] == name]

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        for _, server in self.servers():
            server.stop()


def start_pair(repo: Path, *flags: str) -> Pair:
    """Real Triton and Nereid over one repository with the same flags (Nereid also allows client shared memory, as
    Triton 2.51 does by default)."""
    triton = start_real_triton(repo, *flags)
    try:
        nereid = start_nereid(repo, *flags, "--allow-client-shm=true", log_dir=repo.parent)  # Triton 2.51 allows it
    except BaseException:
        triton.stop()
        raise
    return Pair(triton, nereid)
