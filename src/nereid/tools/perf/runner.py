"""`run_perf`: the whole measurement. Resolve the model, build the requests, start the worker processes, then for
each load level take windows until three agree, and merge them into a `PerfResult` with the server's
breakdown. The Python API behind `nereid perf`, and what `nereid analyze` calls."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from nereid.tools.perf.config import PerfConfig, PerfError
from nereid.tools.perf.control_client import ControlClient, ModelInfo, connect, fetch_model_info, split_url
from nereid.tools.perf.input_data import InputSet, build_inputs
from nereid.tools.perf.load_modes import SequencePlan, split_level
from nereid.tools.perf.measurement import (
    STABLE_WINDOWS,
    Window,
    WindowCollector,
    is_stable,
    latency_summary,
    stabilizing_latency_us,
)
from nereid.tools.perf.payloads import encode_grpc, encode_http, http_target
from nereid.tools.perf.results import PerfResult
from nereid.tools.perf.server_stats import StatsSnapshot, breakdown, parse_statistics
from nereid.tools.perf.shared_memory import SystemSharedMemory
from nereid.tools.perf.worker import Records, WorkerPlan
from nereid.tools.perf.worker_pool import WorkerPool

__all__ = ["Progress", "run_perf"]

Progress = Callable[[str], None]

# What one worker process drives on one core before it becomes the bottleneck: the HTTP client costs ~10-30 us
# of CPU per request, grpc.aio ~150 us (measured against real Triton on this project's machines).
_CONCURRENCY_PER_WORKER = {"http": 32, "grpc": 8}
_RATE_PER_WORKER = {"http": 5000.0, "grpc": 1500.0}
_SATURATED_PERCENT = 85.0  # per worker process


def run_perf(config: PerfConfig, progress: Progress | None = None) -> list[PerfResult]:
    """Measure every load level of `config` against a running server; one `PerfResult` per level, in order.

    Raises `PerfError` (one clear line) for bad settings, an unreachable server, an unknown model, or failing
    requests. `progress` receives human-readable lines as windows complete.
    """
    config.validate()
    say: Progress = progress or (lambda line: None)
    client = connect(config)
    shm: SystemSharedMemory | None = None
    pool: WorkerPool | None = None
    try:
        model = fetch_model_info(client, config.model_name, config.model_version)
        _check_model(model, config)
        inputs = build_inputs(model, config)
        if config.shared_memory == "system":
            shm = SystemSharedMemory.create(client, model, inputs, config)
        levels = config.levels()
        plans = _worker_plans(model, inputs, config, shm, levels)
        say(
            f"nereid perf: model '{model.name}' at {config.server_url} over {config.protocol.upper()}"
            f"{' streaming' if config.streaming else ''}, batch {config.batch_size}, {len(plans)} load worker process(es), "
            f"{config.measurement_interval_ms} ms windows, stable within {config.stability_percentage:g}%"
        )
        pool = WorkerPool(plans)
        results: list[PerfResult] = []
        for level in levels:
            result = _measure_level(config, model, client, pool, level, say)
            results.append(result)
            if config.latency_threshold_ms > 0:
                latency_ms = (result.latency.percentile(config.percentile) if config.percentile else result.latency.avg_us) / 1000
                if latency_ms > config.latency_threshold_ms:
                    say(f"  latency {latency_ms:.2f} ms exceeds --latency-threshold {config.latency_threshold_ms:g} ms: stopping")
                    break
        return results
    finally:
        if pool is not None:
            pool.close()
        if shm is not None:
            shm.close()
        client.close()


def _check_model(model: ModelInfo, config: PerfConfig) -> None:
    if model.decoupled and not config.streaming:
        raise PerfError(f"model '{model.name}' is decoupled (it answers over a stream): use -i grpc --streaming")
    if not model.inputs:
        raise PerfError(f"model '{model.name}' has no inputs to send")


def _worker_count(config: PerfConfig, levels: list[float]) -> int:
    """`--workers`, or enough processes for the highest level, leaving most cores to the server under test."""
    if config.workers:
        return config.workers if config.mode == "request_rate" else min(config.workers, int(max(levels)))
    cores = max(1, (os.cpu_count() or 1) // 4)
    open_range = (config.request_rate_range or config.concurrency_range or (1, 1, 1))[1] == 0
    top = levels[0] * 4 if open_range else max(levels)
    if config.mode == "concurrency":
        return max(1, min(cores, math.ceil(top / _CONCURRENCY_PER_WORKER[config.protocol]), int(top)))
    return max(1, min(cores, math.ceil(top / _RATE_PER_WORKER[config.protocol])))


def _sequence_plan(model: ModelInfo, inputs: InputSet, config: PerfConfig, levels: list[float]) -> SequencePlan | None:
    if not model.sequence:
        return None
    start, end = config.sequence_id_range
    live = config.num_of_sequences if config.mode == "request_rate" else int(max(levels))
    if end is not None and end - start < live:
        raise PerfError(
            f"--sequence-id-range {start}:{end} holds {end - start} ids, fewer than the {live} sequences in flight"
        )
    return SequencePlan(
        id_start=start,
        id_end=end,
        length=config.sequence_length,
        variation=config.sequence_length_variation,
        use_data_lengths=inputs.from_user_data and not config.sequence_length_given,
        streams=len(inputs.streams),
        stream_lengths=[len(stream) for stream in inputs.streams],
    )


def _worker_plans(
    model: ModelInfo, inputs: InputSet, config: PerfConfig, shm: SystemSharedMemory | None, levels: list[float]
) -> list[WorkerPlan]:
    count = _worker_count(config, levels)
    sequence = _sequence_plan(model, inputs, config, levels)
    parameters: dict[str, Any] = {}
    if model.decoupled:
        parameters["triton_enable_empty_final_response"] = True
    templates: list[list[Any]]
    target = None
    grpc_target = ""
    if config.protocol == "http":
        target = http_target(model, config)
        templates = encode_http(model, inputs, config, shm)  # type: ignore[assignment]
    else:
        host, port = split_url(config.server_url, 8001)
        grpc_target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        templates = encode_grpc(model, inputs, config, shm, parameters)  # type: ignore[assignment]
    top = max(levels) if config.mode == "concurrency" else 0
    per_worker = math.ceil(top / count) if top else 4
    return [
        WorkerPlan(
            index=i,
            count=count,
            protocol=config.protocol,
            streaming=config.streaming,
            decoupled=model.decoupled,
            http=target,
            grpc_target=grpc_target,
            templates=templates,
            sequence=sequence,
            num_of_sequences=max(1, config.num_of_sequences // count + (1 if i < config.num_of_sequences % count else 0)),
            request_timeout_s=config.request_timeout_s,
            grpc_channels=max(1, min(4, math.ceil(per_worker / 8))),
            seed=config.seed * 1000 + i,
        )
        for i in range(count)
    ]


def _snapshot(client: ControlClient, model: ModelInfo) -> StatsSnapshot | None:
    try:
        return parse_statistics(client.statistics(model.name, model.version), model.name, model.version)
    except PerfError:
        return None


def _label(config: PerfConfig, level: float) -> str:
    return f"concurrency {int(level)}" if config.mode == "concurrency" else f"request rate {level:g}/s"


def _measure_level(
    config: PerfConfig, model: ModelInfo, client: ControlClient, pool: WorkerPool, level: float, say: Progress
) -> PerfResult:
    label = _label(config, level)
    interval_ns = config.measurement_interval_ms * 1_000_000
    collector = WindowCollector()
    pool.start(split_level(config.mode, level, len(pool), config.request_distribution, config.seed))
    if config.warmup_s > 0:
        time.sleep(config.warmup_s)
    collector.add(pool.drain())  # the CPU baseline; what completed so far is warm-up
    window_start = time.monotonic_ns()
    snapshots = [_snapshot(client, model)]
    windows: list[Window] = []
    last_completion = window_start
    stable = False
    while len(windows) < config.max_trials:
        wait_ns = window_start + interval_ns - time.monotonic_ns()
        if wait_ns > 0:
            time.sleep(wait_ns / 1e9)
        window_end = time.monotonic_ns()
        snapshot = _snapshot(client, model)
        cpu = collector.add(pool.drain())
        window = collector.cut(window_start, window_end, cpu)
        before = snapshots[-1]
        window.server = breakdown(before, snapshot) if before is not None and snapshot is not None else None
        snapshots.append(snapshot)
        windows.append(window)
        if window.errors:
            raise PerfError(f"{window.errors} request(s) failed at {label}: {window.first_error}")
        if window.count:
            last_completion = window_end
        elif window_end - last_completion > config.request_timeout_s * 1e9:
            raise PerfError(f"no response from the server for {config.request_timeout_s:g} s at {label}")
        stable = is_stable(windows, config.stability_percentage, config.percentile)
        say(_window_line(config, label, len(windows), window, stable))
        if stable:
            break
        window_start = window_end
    final = pool.stop(config.request_timeout_s)
    errors = sum(r.errors for r in final)
    if errors:
        first = next(r.first_error for r in final if r.first_error)
        raise PerfError(f"{errors} request(s) failed at {label}: {first}")
    if not stable:
        say(f"  {label}: not stable within {config.stability_percentage:g}% after {len(windows)} windows; reporting the last {STABLE_WINDOWS}")
    result = _merge(config, model, level, windows, snapshots, final, stable, len(pool))
    say(_result_line(label, result))
    if result.client_cpu_percent > _SATURATED_PERCENT * result.workers:
        say(
            f"  warning: the load generator used {result.client_cpu_percent:.0f}% CPU over {result.workers} worker(s); "
            "it may be the bottleneck: try --workers"
        )
    return result


def _merge(
    config: PerfConfig,
    model: ModelInfo,
    level: float,
    windows: list[Window],
    snapshots: list[StatsSnapshot | None],
    final: list[Records],
    stable: bool,
    workers: int,
) -> PerfResult:
    last = windows[-STABLE_WINDOWS:]
    duration = sum(w.duration_s for w in last)
    latencies = np.concatenate([w.latencies_ns for w in last])
    count = int(latencies.size)
    before, after = snapshots[-len(last) - 1], snapshots[-1]
    server = breakdown(before, after) if before is not None and after is not None else None
    timed = sum(w.timed for w in last)
    first_response = None
    responses_per_request = None
    if any(w.first_ns is not None for w in last):
        first = np.concatenate([w.first_ns for w in last if w.first_ns is not None])
        responses = np.concatenate([w.responses for w in last if w.responses is not None])
        first_response = latency_summary(first, config.percentile)
        responses_per_request = float(responses.mean()) if responses.size else 0.0
    return PerfResult(
        mode=config.mode,
        concurrency=int(level) if config.mode == "concurrency" else 0,
        request_rate=level if config.mode == "request_rate" else 0.0,
        batch_size=config.batch_size,
        protocol=config.protocol + ("+streaming" if config.streaming else ""),
        model=model.name,
        throughput=count * config.batch_size / duration,
        requests_per_s=count / duration,
        request_count=count,
        error_count=sum(w.errors for w in last),
        window_s=duration,
        latency=latency_summary(latencies, config.percentile),
        client_send_us=sum(w.send_ns for w in last) / timed / 1000 if timed else 0.0,
        client_recv_us=sum(w.recv_ns for w in last) / timed / 1000 if timed else 0.0,
        server=server,
        stable=stable,
        windows=len(windows),
        client_cpu_percent=100.0 * sum(w.cpu_s for w in last) / duration,
        workers=workers,
        sent_total=sum(r.sent_total for r in final),
        completed_total=sum(r.completed_total for r in final),
        delayed_requests=sum(w.delayed for w in last),
        first_response=first_response,
        responses_per_request=responses_per_request,
    )


def _window_line(config: PerfConfig, label: str, index: int, window: Window, stable: bool) -> str:
    metric = f"p{config.percentile}" if config.percentile else "avg"
    latency = stabilizing_latency_us(window, config.percentile)
    throughput = window.requests_per_s * config.batch_size
    cpu = 100.0 * window.cpu_s / window.duration_s
    return (
        f"  {label}: window {index}/{config.max_trials}: {throughput:,.1f} infer/s, {metric} latency {latency:,.0f} us, "
        f"client CPU {cpu:.0f}%{' (stable)' if stable else ''}"
    )


def _result_line(label: str, result: PerfResult) -> str:
    line = (
        f"  {label}: {result.throughput:,.1f} infer/s, p50 {result.latency.p50_us:,.0f} us, p99 {result.latency.p99_us:,.0f} us"
    )
    if result.server is not None:
        line += f", server queue {result.server.queue_us:,.0f} us + compute {result.server.compute_infer_us:,.0f} us"
    return line
