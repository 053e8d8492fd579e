"""The ingress deployment: one replica per node running Nereid's own HTTP, gRPC and metrics frontends on that
node's address, in front of the model replicas (over deployment handles, through `RemoteServer`). It also
answers requests that come through Serve's own HTTP proxy, so the two doors can be compared on the same
deployment. It holds no model."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, cast

import ray
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from nereid.core.settings import ServerSettings
from nereid.frontends.grpc.transport import GrpcServer, start_grpc_server
from nereid.frontends.http.app import HttpApp
from nereid.frontends.http.server import HttpServer
from nereid.metrics import render, rollout_metrics
from nereid.ray.remote_server import RemoteServer
from nereid.ray.replica import PackedFamily

__all__ = ["NereidIngress", "NodeMetricsApp", "merge_families"]

log = logging.getLogger("nereid.ray")


def merge_families(answers: list[list[PackedFamily]]) -> list[Metric]:
    """The replicas' metric families as one exposition: each family once (Prometheus refuses repeats), with every
    replica's samples in it, told apart by their `replica` label."""
    families: dict[str, Metric] = {}
    for answer in answers:
        for name, documentation, kind, samples in answer:
            family = families.get(name)
            if family is None:
                family = families[name] = Metric(name, documentation, kind)
                family.name = name  # Metric strips a counter's `_total`; Triton's names keep theirs as they are
            for sample_name, labels, value in samples:
                family.add_sample(sample_name, labels, value)
    return list(families.values())


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Any:
        return iter(self.families)


# The replicas' Servers run no rollout: these families are the node's ingress's own.
_ROLLOUT_FAMILIES = "nereid_rollout_"


class NodeMetricsApp:
    """GET /metrics: Triton's metric families of every replica on this node, each sample labelled by replica, and
    the rollouts of this node's ingress (docs/rollouts.md)."""

    def __init__(self, server: RemoteServer, node_ip: str) -> None:
        self.server = server
        self.node_ip = node_ip

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].rstrip("/") != "/metrics":
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"Not Found"})
            return
        answers = await self.server.each_replica("metrics", node_ip=self.node_ip)
        registry = CollectorRegistry()
        replicas = [
            [family for family in value if not family[0].startswith(_ROLLOUT_FAMILIES)]
            for status, value in answers.values()
            if status == "ok"
        ]
        rollouts = list(rollout_metrics(cast(Any, self.server)))  # RemoteServer duck-types Server's rollouts
        registry.register(_Families(merge_families(replicas) + rollouts))
        body = render(registry)
        headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class NereidIngress:
    """The deployment's class; `nereid.ray.app` wraps it with serve.deployment (one replica per node)."""

    async def __init__(self, settings: ServerSettings, replicas: Any, directory: Any) -> None:  # type: ignore[misc]  # Serve awaits it
        self.node_ip: str = ray.util.get_node_ip_address()
        settings = dataclasses.replace(
            settings, http_address=self.node_ip, grpc_address=self.node_ip, metrics_address=self.node_ip
        )
        self.settings = settings
        self.server = RemoteServer(settings, replicas, directory)
        await self.server.start()
        self.app = HttpApp(self.server)  # type: ignore[arg-type]  # RemoteServer duck-types Server
        self.frontends: list[HttpServer] = []
        self.grpc: GrpcServer | None = None
        self.tasks: list[asyncio.Task[None]] = []
        loop = asyncio.get_running_loop()
        if settings.allow_http:
            self.frontends.append(HttpServer(
                self.app, self.node_ip, settings.http_port, limits=settings.limits,
                max_input_size=settings.http_max_input_size, inflight=self.server.inflight,
                request_memory=self.server.request_memory,
            ))  # fmt: skip
        if settings.allow_metrics:
            self.frontends.append(HttpServer(
                NodeMetricsApp(self.server, self.node_ip), self.node_ip, settings.metrics_port, limits=settings.limits,
                max_input_size=settings.http_max_input_size, request_memory=self.server.request_memory,
            ))  # fmt: skip
        for frontend in self.frontends:
            await frontend.start()
            self.tasks.append(loop.create_task(frontend.serve()))
        if settings.allow_grpc:
            self.grpc = await start_grpc_server(self.server, self.node_ip, settings.grpc_port, settings.grpc_tls)  # type: ignore[arg-type]
        log.info("ingress on %s: HTTP %d, gRPC %d, metrics %d", self.node_ip, settings.http_port, settings.grpc_port,
                 settings.metrics_port)  # fmt: skip

    def where(self) -> dict[str, Any]:
        """This ingress's node and ports (for `nereid ray serve`'s start-up lines and the tests)."""
        s = self.settings
        return {
            "node_ip": self.node_ip,
            "http_port": s.http_port,
            "grpc_port": s.grpc_port,
            "metrics_port": s.metrics_port,
        }

    async def __call__(self, request: Any) -> Any:
        """A request through Serve's own HTTP proxy (a Starlette request): the same HTTP app answers it, buffered."""
        from starlette.responses import Response

        started: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                started.update(message)
            else:
                chunks.append(message.get("body", b""))

        await self.app(request.scope, request.receive, send)
        headers = {k.decode(): v.decode() for k, v in started.get("headers", []) if k.lower() != b"content-length"}
        return Response(b"".join(chunks), status_code=started.get("status", 500), headers=headers)

    async def __del__(self) -> None:
        for frontend in self.frontends:
            frontend.should_exit = True
        if self.grpc is not None:
            await self.grpc.stop(grace=1.0)
        await self.server.stop()
