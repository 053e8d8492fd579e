"""Run a Server with its frontends (HTTP, gRPC, metrics) until SIGTERM/SIGINT, then drain and exit."""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable

from nereid.core.admission import InflightLimit
from nereid.core.errors import NereidError
from nereid.core.settings import ServerSettings
from nereid.frontends.cloud.sagemaker import sagemaker_server
from nereid.frontends.cloud.vertex_ai import default_vertex_model, vertex_ai_server
from nereid.frontends.grpc.transport import start_grpc_server
from nereid.frontends.http.app import HttpApp
from nereid.frontends.http.server import HttpServer
from nereid.frontends.openai.app import OpenAIApp
from nereid.metrics import MetricsApp
from nereid.server import Server

__all__ = ["run_server", "serve_until"]

log = logging.getLogger("nereid.serve")


async def serve_until(
    settings: ServerSettings,
    stop: asyncio.Event | None = None,
    on_started: Callable[[Server], None] | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT or, when given, until `stop` is set (an embedding program's own stop, which
    installs no signal handlers); `on_started` runs once every frontend listens. Returns the exit status."""
    for flag in settings.ignored_flags:
        log.warning("%s is accepted for compatibility with tritonserver and has no effect in Nereid", flag)
    server = Server(settings)
    loop = asyncio.get_running_loop()
    embedded = stop is not None
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except NereidError as exc:
        log.error("%s", exc.message)
        await server.stop()
        return 1
    # Everything loaded so far lives as long as the server: keep it out of the collector's scans, and collect
    # the young generation less often, so garbage collection does not show up as tail latency.
    if not embedded:  # an embedding program's own objects and collector settings are its business
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
    # Backend threads (ONNX Runtime, PyTorch, tree models) hand results back under the GIL; with the
    # default 5 ms switch interval they wait that long behind a busy event loop.
    sys.setswitchinterval(0.0002)
    http = (
        _http_port(HttpApp(server), settings.http_address, settings.http_port, settings, server,
                   reuse_port=settings.reuse_http_port, inflight=server.inflight)  # fmt: skip
        if settings.allow_http
        else None
    )
    cloud: list[tuple[str, HttpServer]] = []  # (what the start-up line calls it, its server)
    if settings.sagemaker is not None:
        address = f"{settings.sagemaker.address}:{settings.sagemaker.port}"
        cloud.append((f"Sagemaker HTTPService at {address}", sagemaker_server(server, settings.sagemaker)))
    if settings.vertex_ai is not None:
        ready = [entry["name"] for entry in server.repository_index(ready_only=True)]
        try:
            default_model = default_vertex_model(settings.vertex_ai, ready)
        except ValueError as exc:
            log.error("failed to start Vertex AI service: Invalid argument - %s", exc)
            await server.stop()
            return 1
        address = f"{settings.vertex_ai.address}:{settings.vertex_ai.port}"
        cloud.append((f"Vertex AI HTTPService at {address}", vertex_ai_server(server, settings.vertex_ai, default_model)))
    # The metrics and OpenAI ports run on the same transport as the HTTP port, so they hold the same limits.
    metrics = (
        _http_port(MetricsApp(server), settings.metrics_address, settings.metrics_port, settings, server)
        if settings.allow_metrics
        else None
    )
    openai = (
        _http_port(OpenAIApp(server), settings.openai_address, settings.openai_port, settings, server, inflight=server.inflight)
        if settings.openai_port
        else None
    )
    tasks: list[asyncio.Task[None]] = []
    grpc_server = None
    try:
        # gRPC first, as Triton: a client that saw the HTTP port ready finds the gRPC port listening.
        if settings.allow_grpc:
            grpc_server = await start_grpc_server(server, settings.grpc_address, settings.grpc_port, settings.grpc_tls)
        for frontend in (http, metrics, openai):
            if frontend is not None:
                await frontend.start()  # bound before "Started ..."; a taken port fails start-up here
        for _, endpoint in cloud:
            await endpoint.start()
        tasks = [loop.create_task(s.serve()) for s in (http, metrics, openai) if s is not None]
        tasks += [loop.create_task(endpoint.serve()) for _, endpoint in cloud]
        if grpc_server is not None:
            log.info("Started GRPCInferenceService at %s:%d", settings.grpc_address, settings.grpc_port)
        if http is not None:
            log.info("Started HTTPService at %s:%d", settings.http_address, settings.http_port)
        for started, _ in cloud:
            log.info("Started %s", started)
        if metrics is not None:
            log.info("Started Metrics Service at %s:%d", settings.metrics_address, settings.metrics_port)
        if openai is not None:
            log.info("Started OpenAI-compatible API at %s:%d", settings.openai_address, settings.openai_port)
        if on_started is not None:
            on_started(server)
        stop_wait = loop.create_task(stop.wait())
        done, _ = await asyncio.wait([stop_wait, *tasks], return_when=asyncio.FIRST_COMPLETED)
        if stop_wait not in done:
            for task in done:
                if task.exception() is not None:
                    log.error("a frontend failed to start: %s", task.exception())
            stop_wait.cancel()
            await server.stop()
            return 1
    except OSError as exc:
        log.error("%s", exc)
        if grpc_server is not None:
            await grpc_server.stop(grace=0)
        await server.stop()
        return 1
    log.info("Signal received, waiting for in-flight requests (up to %ss)", settings.exit_timeout_secs)
    # One deadline for the whole drain, as --exit-timeout-secs promises; past it, exit at once with 1
    # (Triton's answer) instead of waiting for a model that is still computing.
    try:
        await asyncio.wait_for(server.stop(), settings.exit_timeout_secs + 0.5)
    except TimeoutError:
        log.error("failed to stop server: Exit timeout expired. Exiting immediately.")
        if embedded:  # never end an embedding program's process; its threads are its own
            return 1
        _exit_now(1)
    for frontend in (http, metrics, openai, *(started for _, started in cloud)):
        if frontend is not None:
            frontend.should_exit = True
    if grpc_server is not None:
        await grpc_server.stop(grace=1.0)
    await asyncio.gather(*tasks, return_exceptions=True)
    log.info("Nereid stopped")
    return 0


def _http_port(
    app: object,
    address: str,
    port: int,
    settings: ServerSettings,
    server: Server,
    reuse_port: bool = False,
    inflight: InflightLimit | None = None,
) -> HttpServer:
    """A port on the HTTP transport, with the transport limits and the request-size cap every such port holds, and
    the server's one --request-memory-limit that all ports share."""
    return HttpServer(
        app, address, port, reuse_port=reuse_port, limits=settings.limits, max_input_size=settings.http_max_input_size,
        inflight=inflight, request_memory=server.request_memory,
    )  # fmt: skip


def _exit_now(code: int) -> None:
    """Leave without joining executor threads that are still inside a framework call."""
    for handler in logging.getLogger("nereid").handlers:
        handler.flush()
    os._exit(code)


def run_server(settings: ServerSettings) -> int:
    # A crash in an extension module (SIGSEGV, SIGABRT, ...) writes every thread's Python stack to stderr, the
    # server's log, before the process dies: otherwise the kernel log's one line is all that is left.
    faulthandler.enable()
    try:
        import uvloop

        return uvloop.run(serve_until(settings))
    except ImportError:
        return asyncio.run(serve_until(settings))
