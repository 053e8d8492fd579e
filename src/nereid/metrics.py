"""Prometheus metrics with Triton's names, read from the same statistics objects the statistics endpoint uses."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import psutil
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nereid.core.capabilities import MetricSource
from nereid.core.statistics import SUMMARY_QUANTILES
from nereid.server import Server

log = logging.getLogger("nereid.metrics")

__all__ = ["TritonMetricsCollector", "MetricsApp", "parse_summary_quantiles", "rollout_metrics"]


class CounterMetricFamily(Metric):
    """A counter whose samples keep Triton's exact names (prometheus_client would append `_total`)."""

    def __init__(self, name: str, documentation: str, labels: list[str]) -> None:
        super().__init__(name, documentation, "counter")
        self.name = name  # Metric strips a `_total` suffix; Triton names have none anyway
        self._labels = labels

    def add_metric(self, values: list[str], value: float) -> None:
        self.add_sample(self.name, dict(zip(self._labels, values, strict=False)), value)


# The latency counter families that --metrics-config counter_latencies=false removes, as Triton does.
_LATENCY_COUNTERS = ("request_us", "queue_us", "input_us", "infer_us", "output_us")


def parse_summary_quantiles(value: str) -> tuple[float, ...]:
    """`--metrics-config summary_quantiles=<quantile>:<error>,...` as Triton parses it: a malformed pair is
    logged and skipped; nothing usable leaves Triton's defaults. The error bounds are not needed: Nereid's
    summaries are exact over their window."""
    quantiles: list[float] = []
    for pair in value.strip("\"'").split(","):
        quantile, colon, error = pair.partition(":")
        if not colon:
            log.error("Invalid option: [%s]. No ':' delimiter found. Expected format is <quantile>:<error>", pair)
            continue
        try:
            number = float(quantile)
            float(error)
        except ValueError as exc:
            log.error("Invalid option: [%s]. Error: %s", pair, exc)
            continue
        quantiles.append(number)
    return tuple(quantiles) or SUMMARY_QUANTILES


class TritonMetricsCollector(Collector):
    def __init__(self, server: Server) -> None:
        self.server = server
        config = server.settings.metrics_config
        self.counter_latencies = config.get("counter_latencies", "true").lower() != "false"
        self.quantiles = parse_summary_quantiles(config["summary_quantiles"]) if "summary_quantiles" in config else SUMMARY_QUANTILES
        self.pinned_pool_bytes = server.settings.pinned_memory_pool_byte_size
        # nv_energy_consumption counts from the server's start: the driver's counter read now is its zero.
        self.energy_start_mj = _energy_readings() if server.settings.allow_gpu_metrics else {}

    def collect(self) -> Iterator[Any]:
        labels = ["model", "version"]
        families: dict[str, Any] = {
            "success": CounterMetricFamily("nv_inference_request_success", "Number of successful inference requests, all batch sizes", labels=labels),
            "failure": CounterMetricFamily("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", labels=labels + ["reason"]),
            "count": CounterMetricFamily("nv_inference_count", "Number of inferences performed (does not include cached requests)", labels=labels),
            "exec": CounterMetricFamily("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)", labels=labels),
            "pending": GaugeMetricFamily("nv_inference_pending_request_count", "Instantaneous number of pending requests awaiting execution per-model.", labels=labels),
            "request_us": CounterMetricFamily("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (includes cached requests)", labels=labels),
            "queue_us": CounterMetricFamily("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds (includes cached requests)", labels=labels),
            "input_us": CounterMetricFamily("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds (does not include cached requests)", labels=labels),
            "infer_us": CounterMetricFamily("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds (does not include cached requests)", labels=labels),
            "output_us": CounterMetricFamily("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)", labels=labels),
            "load": GaugeMetricFamily("nv_model_load_duration_secs", "Model load time in seconds", labels=labels),
        }
        if not self.counter_latencies:
            for family_key in _LATENCY_COUNTERS:
                del families[family_key]
        cache = self.server.cache
        if cache is not None and self.counter_latencies:  # Triton's per-model cache counters are latency counters
            families |= {
                "cache_hits": CounterMetricFamily("nv_cache_num_hits_per_model", "Number of cache hits per model", labels=labels),
                "cache_misses": CounterMetricFamily("nv_cache_num_misses_per_model", "Number of cache misses per model", labels=labels),
                "cache_hit_us": CounterMetricFamily("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds", labels=labels),
                "cache_miss_us": CounterMetricFamily("nv_cache_miss_duration_per_model", "Total cache miss (insert + lookup) duration per model, in microseconds", labels=labels),
            }
        for mv in self.server.repository.ready_versions():
            s = mv.stats
            key = [mv.name, mv.version_str]
            families["success"].add_metric(key, s.success.count)
            for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
                families["failure"].add_metric(key + [reason], s.failures_by_reason.get(reason, 0))
            families["count"].add_metric(key, s.inference_count)
            families["exec"].add_metric(key, s.execution_count)
            families["pending"].add_metric(key, s.pending)
            if self.counter_latencies:
                families["request_us"].add_metric(key, (s.success.ns + s.fail.ns) // 1000)
                families["queue_us"].add_metric(key, s.queue.ns // 1000)
                families["input_us"].add_metric(key, s.compute_input.ns // 1000)
                families["infer_us"].add_metric(key, s.compute_infer.ns // 1000)
                families["output_us"].add_metric(key, s.compute_output.ns // 1000)
            families["load"].add_metric(key, mv.load_seconds)
            if cache is not None and mv.cache_enabled and self.counter_latencies:
                families["cache_hits"].add_metric(key, s.cache_hit.count)
                families["cache_misses"].add_metric(key, s.cache_miss.count)
                families["cache_hit_us"].add_metric(key, s.cache_hit.ns // 1000)
                families["cache_miss_us"].add_metric(key, s.cache_miss.ns // 1000)
        yield from families.values()
        # Triton's pinned host-memory pool: a CPU-only Triton cannot allocate it, yet reports the configured size
        # and nothing used; Nereid never pins memory, so it reports the same.
        yield GaugeMetricFamily("nv_pinned_memory_pool_total_bytes", "Pinned memory pool total memory size, in bytes", value=self.pinned_pool_bytes)
        yield GaugeMetricFamily("nv_pinned_memory_pool_used_bytes", "Pinned memory pool used memory size, in bytes", value=0)
        yield from self._summaries(labels)
        yield from self._first_response_histogram(labels)
        yield from _instance_metrics(self.server)
        yield from _residency_metrics(self.server)
        yield from rollout_metrics(self.server)
        yield from _monitoring_metrics(self.server)
        yield from self.server.custom_metric_families()  # pb_utils.MetricFamily families of Python models
        if cache is not None:
            counters = cache.counters
            yield GaugeMetricFamily("nv_cache_num_entries", "Number of responses stored in response cache", value=counters.entries)
            yield GaugeMetricFamily("nv_cache_num_lookups", "Number of cache lookups in response cache", value=counters.lookups)
            yield GaugeMetricFamily("nv_cache_num_hits", "Number of cache hits in response cache", value=counters.hits)
            yield GaugeMetricFamily("nv_cache_num_misses", "Number of cache misses in response cache", value=counters.misses)
            yield GaugeMetricFamily("nv_cache_num_evictions", "Number of cache evictions in response cache", value=counters.evictions)
            if counters.capacity:
                yield GaugeMetricFamily("nv_cache_util", "Cache utilization [0.0 - 1.0]", value=counters.bytes_used / counters.capacity)
        if self.server.settings.allow_gpu_metrics:
            yield from _gpu_metrics(self.energy_start_mj)
        if self.server.settings.allow_cpu_metrics:
            memory = psutil.virtual_memory()
            yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=psutil.cpu_percent() / 100.0)
            yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=memory.total)
            yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", value=memory.total - memory.available)


    def _first_response_histogram(self, labels: list[str]) -> Iterator[Metric]:
        versions = [mv for mv in self.server.repository.ready_versions() if mv.stats.first_response is not None]
        if not versions:
            return
        name = "nv_inference_first_response_histogram_ms"
        family = Metric(name, "Duration from request to first response in milliseconds", "histogram")
        for mv in versions:
            base = dict(zip(labels, [mv.name, mv.version_str]))
            counts = mv.stats.first_response or []
            cumulative = 0
            for bound, count in zip((*mv.stats.first_response_buckets, float("inf")), counts):
                cumulative += count
                # Triton's Prometheus library writes a bound as C++ streams it at 16 digits: 100, not 100.0.
                le = "+Inf" if bound == float("inf") else format(bound, ".16g")
                family.add_sample(name + "_bucket", {**base, "le": le}, cumulative)
            family.add_sample(name + "_count", base, cumulative)
            family.add_sample(name + "_sum", base, mv.stats.first_response_sum_ms)
        yield family

    def _summaries(self, labels: list[str]) -> Iterator[Metric]:
        versions = [mv for mv in self.server.repository.ready_versions() if mv.stats.summaries is not None]
        if not versions:
            return
        for key, (name, documentation) in _SUMMARIES.items():
            family = Metric(name, documentation, "summary")
            for mv in versions:
                if key == "request" and mv.cache_enabled and self.server.cache is not None:
                    continue  # Triton leaves the request summary out for models with the response cache
                window = mv.stats.summaries[key]  # type: ignore[index]
                base = dict(zip(labels, [mv.name, mv.version_str]))
                family.add_sample(name + "_count", base, window.count)
                family.add_sample(name + "_sum", base, window.sum_us)
                for quantile, value in window.quantiles(self.quantiles):
                    family.add_sample(name, {**base, "quantile": str(quantile)}, value)
            yield family


# Summary families and their HELP text as Triton 2.51 writes them (the compute ones reuse the counters' text).
_SUMMARIES = {
    "request": ("nv_inference_request_summary_us", "Summary of inference request duration in microseconds (includes cached requests)"),
    "queue": ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds (includes cached requests)"),
    "compute_input": ("nv_inference_compute_input_summary_us", "Cumulative compute input duration in microseconds (does not include cached requests)"),
    "compute_infer": ("nv_inference_compute_infer_summary_us", "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    "compute_output": ("nv_inference_compute_output_summary_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
}


def _instance_metrics(server: Server) -> Iterator[Metric]:
    """Families that backend instances report themselves through `metric_samples()` (the LLM engine's
    vllm:* metrics): (family, type, help, sample name, labels, value), merged across models by family."""
    families: dict[str, Metric] = {}
    for mv in server.repository.ready_versions():
        for instance in mv.instances:
            if not isinstance(instance, MetricSource):
                continue
            for family, kind, documentation, name, sample_labels, value in instance.metric_samples():
                metric = families.get(family)
                if metric is None:
                    metric = families[family] = Metric(family, documentation, kind)
                    metric.name = family  # keep names as given (Metric strips a counter's `_total`)
                metric.add_sample(name, sample_labels, value)
    yield from families.values()


def _residency_metrics(server: Server) -> Iterator[Metric]:
    """Model orchestration: loads by cause, evictions by cause, cold-start waits, resident bytes and the budget."""
    residency = server.repository.residency
    loads = CounterMetricFamily("nereid_model_loads_total", "Completed model loads, by cause (startup, explicit, on_demand, poll)", labels=["model", "cause"])
    for (model, cause), count in sorted(residency.loads.items()):
        loads.add_metric([model, cause], count)
    yield loads
    evictions = CounterMetricFamily("nereid_model_evictions_total", "Models unloaded by the residency policy, by cause (budget, group, idle)", labels=["model", "cause"])
    for (model, cause), count in sorted(residency.evictions.items()):
        evictions.add_metric([model, cause], count)
    yield evictions
    waits = residency.cold_waits
    name = "nereid_model_cold_start_wait_seconds"
    histogram = Metric(name, "Time requests waited for a model's load on demand", "histogram")
    for bound, count in zip(waits.buckets, waits.counts or [0] * len(waits.buckets)):
        histogram.add_sample(name + "_bucket", {"le": str(bound)}, count)
    histogram.add_sample(name + "_bucket", {"le": "+Inf"}, waits.count)
    histogram.add_sample(name + "_count", {}, waits.count)
    histogram.add_sample(name + "_sum", {}, waits.total)
    yield histogram
    resident = GaugeMetricFamily("nereid_model_resident_bytes", "Host memory each resident model holds (measured, remembered, declared or estimated)", labels=["model", "source"])
    for model, size in sorted(residency.resident_bytes().items()):
        footprint = residency.footprint(model)
        resident.add_metric([model, footprint.source if footprint is not None else ""], size)
    yield resident
    yield GaugeMetricFamily("nereid_models_resident_bytes", "Host memory charged to resident and loading models, in total", value=residency.charged_host())
    budget = GaugeMetricFamily("nereid_model_memory_budget_bytes", "--model-memory-budget per device (host; gpuN through NVML); 0: none", labels=["device"])
    budget.add_metric(["host"], residency.host_budget)
    for device, size in sorted(residency.gpu_budget.items()):
        budget.add_metric([f"gpu{device}"], size)
    yield budget


_nvml: Any = None


def rollout_metrics(server: Server) -> Iterator[Metric]:
    """Rollouts: each one's state and step, rollbacks, and what each version did in the current step's window."""
    controller = server.rollouts
    rollouts = controller.all()
    state = GaugeMetricFamily("nereid_rollout_state", "1 for the state each model's rollout is in", labels=["model", "candidate", "state"])
    step = GaugeMetricFamily("nereid_rollout_step", "The step each running or paused rollout is at (0 first)", labels=["model"])
    # Gauges: a step's window starts from zero.
    requests = GaugeMetricFamily("nereid_rollout_window_requests", "Requests each version answered in the rollout step's window", labels=["model", "version"])
    errors = GaugeMetricFamily("nereid_rollout_window_errors", "Failed requests of each version in the rollout step's window", labels=["model", "version"])
    p99 = GaugeMetricFamily("nereid_rollout_window_p99_seconds", "p99 latency of each version in the rollout step's window", labels=["model", "version"])
    divergence = GaugeMetricFamily("nereid_rollout_shadow_divergence", "Mean divergence of shadow answers from the primary's in the window", labels=["model", "version"])
    cpu = GaugeMetricFamily("nereid_rollout_window_cpu_seconds_per_request", "CPU time per request each version used in the window (the cost objective)", labels=["model", "version"])
    for rollout in rollouts:
        state.add_metric([rollout.model, rollout.candidate, rollout.state.value], 1)
        if rollout.open:
            step.add_metric([rollout.model], rollout.step)
            for version, window in sorted(rollout.windows.items()):
                figures = window.figures()
                requests.add_metric([rollout.model, version], figures.requests)
                errors.add_metric([rollout.model, version], figures.errors)
                p99.add_metric([rollout.model, version], figures.p99_ms / 1000)
                cpu.add_metric([rollout.model, version], figures.cpu_ms_per_request / 1000)
                if figures.compared:
                    divergence.add_metric([rollout.model, version], figures.divergence)
    yield from (state, step, requests, errors, p99, divergence, cpu)
    rollbacks = CounterMetricFamily("nereid_rollout_rollbacks_total", "Rollouts rolled back, by hand or by a failing gate", labels=["model"])
    for model, count in sorted(controller.rollbacks.items()):
        rollbacks.add_metric([model], count)
    yield rollbacks
    yield _single_counter("nereid_rollout_shadows_shed_total", "Shadow copies not sent because the candidate was backed up", controller.shadows_shed)


def _monitoring_metrics(server: Server) -> Iterator[Metric]:
    """Drift (the worst PSI and KS statistic over each tensor's features) and data quality per version, and what
    the monitor sampled, dropped and logged."""
    monitor = server.monitor
    families = {
        (direction, statistic): GaugeMetricFamily(
            f"nereid_{direction}_drift_{statistic}",
            f"{statistic.upper()} of each {direction} tensor's values in the window against the version's reference (worst feature)",
            labels=["model", "version", direction],
        )
        for direction in ("input", "output")
        for statistic in ("psi", "ks")
    }
    for (model, version), drifts in sorted(monitor.snapshot.items()):
        for name, drift in sorted(drifts.items()):
            direction = "input" if name.startswith("in:") else "output"
            families[(direction, "psi")].add_metric([model, version, name[name.index(":") + 1 :]], drift.psi)
            families[(direction, "ks")].add_metric([model, version, name[name.index(":") + 1 :]], drift.ks)
    yield from families.values()
    quality = CounterMetricFamily("nereid_data_quality_issues_total", "Values of sampled requests with a data-quality issue (nan, inf, out_of_range, empty_bytes, malformed_bytes)", labels=["model", "version", "tensor", "issue"])
    for (model, version), version_monitor in sorted(monitor.versions.items()):
        for (tensor, issue), count in sorted(version_monitor.quality.items()):
            quality.add_metric([model, version, tensor, issue], count)
    yield quality
    yield _single_counter("nereid_monitor_samples_total", "Requests the monitor took in", monitor.sampled)
    yield _single_counter("nereid_monitor_dropped_total", "Sampled requests dropped because the monitor's queue was full", monitor.dropped)
    if monitor.payload is not None:
        yield _single_counter("nereid_payload_log_records_total", "Records written to the payload log", monitor.payload.written)
        yield _single_counter("nereid_payload_log_dropped_total", "Payload log records lost to a failing or full disk", monitor.payload.dropped)


def _single_counter(name: str, documentation: str, value: float) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=[])
    family.add_metric([], value)
    return family


def _nvml_module() -> Any:
    """pynvml (package nvidia-ml-py) when it is installed and a driver answers; False otherwise."""
    global _nvml
    if _nvml is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _nvml = pynvml
        except Exception:  # no package, no driver, no GPU: GPU metrics are simply absent
            _nvml = False
    return _nvml


def _device_handles(nvml: Any) -> Iterator[tuple[str, Any]]:
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        yield (uuid.decode() if isinstance(uuid, bytes) else uuid), handle


def _energy_mj(nvml: Any, handle: Any) -> int | None:
    """The device's energy counter in mJ since the driver loaded; None where the device has none (before Volta)."""
    try:
        return int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
    except nvml.NVMLError:
        return None


def _energy_readings() -> dict[str, int]:
    nvml = _nvml_module()
    if not nvml:
        return {}
    readings = ((uuid, _energy_mj(nvml, handle)) for uuid, handle in _device_handles(nvml))
    return {uuid: value for uuid, value in readings if value is not None}


def _gpu_metrics(energy_start_mj: dict[str, int]) -> Iterator[Metric]:
    nvml = _nvml_module()
    if not nvml:
        return
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "util": GaugeMetricFamily("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", labels=["gpu_uuid"]),
        "total": GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", labels=["gpu_uuid"]),
        "used": GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", labels=["gpu_uuid"]),
        "power": GaugeMetricFamily("nv_gpu_power_usage", "GPU power usage in watts", labels=["gpu_uuid"]),
        "limit": GaugeMetricFamily("nv_gpu_power_limit", "GPU power management limit in watts", labels=["gpu_uuid"]),
        "energy": CounterMetricFamily(
            "nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started", labels=["gpu_uuid"]
        ),
    }
    for uuid, handle in _device_handles(nvml):
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        families["util"].add_metric([uuid], nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
        families["total"].add_metric([uuid], memory.total)
        families["used"].add_metric([uuid], memory.used)
        families["power"].add_metric([uuid], nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        families["limit"].add_metric([uuid], nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0)
        energy = _energy_mj(nvml, handle)
        if energy is not None:
            families["energy"].add_metric([uuid], (energy - energy_start_mj.setdefault(uuid, energy)) / 1000.0)
    yield from families.values()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format with Triton's exact names (prometheus_client would rename counters)."""
    lines: list[str] = []
    for metric in registry.collect():
        lines.append(f"# HELP {metric.name} {metric.documentation}")
        lines.append(f"# TYPE {metric.name} {metric.type}")
        for sample in metric.samples:
            if sample.labels:
                labels = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(sample.labels.items()))
                lines.append(f"{sample.name}{{{labels}}} {_number(sample.value)}")
            else:
                lines.append(f"{sample.name} {_number(sample.value)}")
    return ("\n".join(lines) + "\n").encode()


class MetricsApp:
    """ASGI app answering GET /metrics in the Prometheus text format."""

    def __init__(self, server: Server) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(TritonMetricsCollector(server))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return  # served with lifespan off: only HTTP scopes arrive
        if scope["path"].rstrip("/") != "/metrics":
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"Not Found"})
            return
        body = render(self.registry)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")],
            }
        )
        await send({"type": "http.response.body", "body": body})
