"""Measuring one loaded variant: `nereid perf` (`run_perf`) at each concurrency of the sweep while the resource
monitor watches the server, one `LevelMeasurement` per level. Stops the sweep early when the latency limit
is passed, throughput has saturated, or the time budget is spent."""

from __future__ import annotations

import time
from collections.abc import Callable

from nereid.tools.analyze.budget import TimeBudget
from nereid.tools.analyze.deployment import TargetServer
from nereid.tools.analyze.objectives import Constraints
from nereid.tools.analyze.resources import ResourceMonitor
from nereid.tools.analyze.results import LevelMeasurement, VariantOutcome
from nereid.tools.analyze.settings import AnalyzeSettings
from nereid.tools.perf import PerfConfig, run_perf

__all__ = ["measure_variant"]

Progress = Callable[[str], None]

# Throughput that grows less than this over two more levels has saturated: higher concurrency only adds latency.
_SATURATION_GAIN = 0.05


def _perf_config(settings: AnalyzeSettings, server: TargetServer, concurrency: int, trials: int, budget: TimeBudget) -> PerfConfig:
    return PerfConfig(
        settings.model,
        url=server.grpc_url if settings.protocol == "grpc" else server.http_url,
        protocol=settings.protocol,
        concurrency_range=(concurrency, concurrency, 1),
        batch_size=settings.batch_size,
        measurement_interval_ms=settings.measurement_interval_ms,
        max_trials=trials,
        stability_percentage=settings.stability_percentage,
        warmup_s=settings.warmup_s,
        shapes=dict(settings.shapes),
        request_timeout_s=max(5.0, min(30.0, budget.remaining())),
    )


def _saturated(measurements: list[LevelMeasurement]) -> bool:
    if len(measurements) < 3:
        return False
    before = max(m.throughput for m in measurements[:-2])
    return all(m.throughput < before * (1 + _SATURATION_GAIN) for m in measurements[-2:])


def measure_variant(
    settings: AnalyzeSettings,
    server: TargetServer,
    monitor: ResourceMonitor,
    outcome: VariantOutcome,
    constraints: Constraints,
    budget: TimeBudget,
    say: Progress,
) -> None:
    """Append a measurement per concurrency to `outcome`; `PerfError` (failing requests) propagates."""
    perf_progress = (lambda line: say("    " + line.strip())) if settings.verbose else None
    for concurrency in settings.concurrency:
        if not budget.fits_level():
            outcome.complete = False
            say(f"    time budget: concurrency {concurrency} and above not measured")
            return
        started = time.monotonic()
        config = _perf_config(settings, server, concurrency, budget.trials_that_fit(settings.max_trials), budget)
        monitor.begin()
        try:
            (result,) = run_perf(config, perf_progress)
        finally:
            sample = monitor.end()
        budget.observe_level(time.monotonic() - started)
        stats = result.server
        m = LevelMeasurement(
            variant=outcome.label,
            concurrency=concurrency,
            throughput=result.throughput,
            p50_ms=result.latency.p50_us / 1000,
            p90_ms=result.latency.p90_us / 1000,
            p95_ms=result.latency.p95_us / 1000,
            p99_ms=result.latency.p99_us / 1000,
            avg_ms=result.latency.avg_us / 1000,
            server_queue_us=stats.queue_us if stats is not None else None,
            server_compute_us=stats.compute_infer_us if stats is not None else None,
            client_cpu_percent=result.client_cpu_percent,
            server_cpu_percent=sample.cpu_percent,
            server_memory_mb=sample.memory_mb,
            gpu_utilization_percent=sample.gpu_utilization_percent,
            gpu_memory_mb=sample.gpu_memory_mb,
            stable=result.stable,
        )
        constraints.mark(m)
        outcome.measurements.append(m)
        say(_level_line(m))
        if constraints.max_p99_latency_ms is not None and m.p99_ms > constraints.max_p99_latency_ms:
            if concurrency != settings.concurrency[-1]:
                say(f"    p99 is over {constraints.max_p99_latency_ms:g} ms: higher concurrency is not measured")
            return
        if _saturated(outcome.measurements) and concurrency != settings.concurrency[-1]:
            say("    throughput has stopped growing: higher concurrency is not measured")
            return


def _level_line(m: LevelMeasurement) -> str:
    parts = [f"    concurrency {m.concurrency}: {m.throughput:,.1f} infer/s, p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms"]
    if m.server_cpu_percent is not None:
        parts.append(f"server CPU {m.server_cpu_percent:.0f}%")
    if m.server_memory_mb is not None:
        parts.append(f"memory {m.server_memory_mb:,.0f} MB")
    if m.gpu_utilization_percent is not None:
        parts.append(f"GPU {m.gpu_utilization_percent:.0f}%")
    if not m.stable:
        parts.append("unstable")
    if not m.meets_constraints:
        parts.append("misses: " + "; ".join(m.violations))
    return ", ".join(parts)
