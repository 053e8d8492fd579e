"""What the dashboard page shows, read from the objects the statistics and metrics endpoints read: the models
table, one model's details, and live snapshots of cumulative counters that the page turns into rates. It only
reads; it never changes a model, and nothing here runs on the inference path."""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Iterable
from typing import Any

import psutil

from nereid.config.model_config import config_to_json_dict
from nereid.core.capabilities import MetricSource
from nereid.core.statistics import ModelStatistics
from nereid.server import Server

__all__ = ["DashboardState", "model_rows", "model_detail", "display_state"]

_KIND_NAMES = {0: "AUTO", 1: "GPU", 2: "CPU", 3: "MODEL"}
# Backends whose models speak the OpenAI API (the page offers a chat box for them).
_LLM_BACKENDS = frozenset({"vllm", "llm", "tensorrtllm"})


def display_state(row: dict[str, Any]) -> str:
    """The state a row of the repository index shows: Triton's, with EVICTED for a model the residency
    policy unloaded (the index says UNAVAILABLE with an `evicted: ...` reason)."""
    state = str(row.get("state", ""))
    if state == "UNAVAILABLE" and str(row.get("reason", "")).startswith("evicted"):
        return "EVICTED"
    return state or "UNAVAILABLE"  # a model of the repository never loaded: the index names it only


def _instances(config: Any) -> str:
    groups = [f"{g.count or 1}×{_KIND_NAMES.get(g.kind, str(g.kind))}" for g in config.instance_group]
    return ", ".join(groups) if groups else "1×AUTO"


def _batching(config: Any) -> str:
    parts: list[str] = []
    if config.max_batch_size:
        parts.append(f"max {config.max_batch_size}")
    if config.HasField("dynamic_batching"):
        dyn = config.dynamic_batching
        text = "dynamic"
        if dyn.preferred_batch_size:
            text += " preferred " + ",".join(str(s) for s in dyn.preferred_batch_size)
        if dyn.max_queue_delay_microseconds:
            text += f" delay {dyn.max_queue_delay_microseconds} µs"
        parts.append(text)
    elif config.HasField("sequence_batching"):
        parts.append("sequence")
    elif config.HasField("ensemble_scheduling"):
        parts.append("ensemble")
    return ", ".join(parts) if parts else "none"


def _backend(config: Any) -> str:
    if config.HasField("ensemble_scheduling") or config.platform == "ensemble":
        return "ensemble"
    return config.backend or config.platform or ""


def model_rows(server: Server) -> list[dict[str, Any]]:
    """One row per model version of the repository index, with the details of the versions that are loaded."""
    loaded = {(mv.name, mv.version_str): mv for mv in server.repository.ready_versions()}
    residency = server.repository.residency
    rows: list[dict[str, Any]] = []
    for entry in server.repository_index():
        name = str(entry.get("name", ""))
        version = str(entry.get("version", ""))
        row: dict[str, Any] = {
            "name": name,
            "version": version,
            "state": display_state(entry),
            "reason": entry.get("reason", "" if "state" in entry else "not loaded"),
        }
        mv = loaded.get((name, version))
        if mv is not None:
            config = mv.config
            backend = _backend(config)
            row |= {
                "backend": backend,
                "instances": _instances(config),
                "batching": _batching(config),
                "decoupled": bool(mv.decoupled),
                "llm": backend in _LLM_BACKENDS,
            }
        footprint = residency.footprint(name)
        if footprint is not None:
            row["footprint_bytes"] = footprint.host_bytes
            row["footprint_source"] = footprint.source
        elif "footprint_bytes" in entry:
            row["footprint_bytes"] = entry["footprint_bytes"]
        rows.append(row)
    return rows


def model_detail(server: Server, name: str, version: str = "") -> dict[str, Any]:
    """A loaded model's config as /config renders it, and its metadata; raises the server's NOT_FOUND or
    UNAVAILABLE error for a model that is not loaded."""
    mv = server.model(name, version)
    return {
        "name": mv.name,
        "version": mv.version_str,
        "config": config_to_json_dict(mv.config),
        "metadata": server.model_metadata(name, version),
        "backend": _backend(mv.config),
        "llm": _backend(mv.config) in _LLM_BACKENDS,
    }


def _totals(stats: Iterable[ModelStatistics]) -> dict[str, int]:
    keys = ("success", "fail", "queue_ns", "input_ns", "infer_ns", "output_ns", "executions", "inferences", "pending")
    total = dict.fromkeys(keys, 0)
    for s in stats:
        total["success"] += s.success.count
        total["fail"] += s.fail.count
        total["queue_ns"] += s.queue.ns
        total["input_ns"] += s.compute_input.ns
        total["infer_ns"] += s.compute_infer.ns
        total["output_ns"] += s.compute_output.ns
        total["executions"] += s.execution_count
        total["inferences"] += s.inference_count
        total["pending"] += s.pending
    return total


def _quantiles(stats: ModelStatistics) -> dict[str, dict[str, float | None]] | None:
    """p50 and p99 per stage from the summary windows, which exist with --metrics-config summary_latencies=true."""
    windows = stats.summaries
    if windows is None:
        return None
    out: dict[str, dict[str, float | None]] = {}
    for stage in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        values = dict(windows[stage].quantiles())
        p50, p99 = values.get(0.5), values.get(0.99)
        out[stage] = {
            "p50": p50 if p50 is not None and p50 == p50 else None,  # NaN (no samples) becomes null
            "p99": p99 if p99 is not None and p99 == p99 else None,
        }
    return out


def _llm(instances: Iterable[Any]) -> dict[str, float] | None:
    """Tokens, running and waiting sequences, time to first token, KV cache use, prefix-cache hits, preemptions
    and refused requests from the engine's own counters (the samples the vllm:* metrics are made of)."""
    found = False
    out = {
        "running": 0.0, "waiting": 0.0, "tokens_per_second": 0.0, "generation_tokens": 0.0, "ttft_sum": 0.0, "ttft_count": 0.0,
        "kv_blocks_used": 0.0, "kv_blocks_free": 0.0, "prefix_cache_queries": 0.0, "prefix_cache_hits": 0.0, "preemptions": 0.0,
        "refused": 0.0,
    }
    summed = {
        "nereid_llm_kv_blocks_used": "kv_blocks_used",
        "nereid_llm_kv_blocks_free": "kv_blocks_free",
        "vllm:prefix_cache_queries_total": "prefix_cache_queries",
        "vllm:prefix_cache_hits_total": "prefix_cache_hits",
        "vllm:num_preemptions_total": "preemptions",
        "nereid_llm_requests_refused_total": "refused",
    }
    for instance in instances:
        if not isinstance(instance, MetricSource):
            continue
        for _family, _kind, _help, sample, _labels, value in instance.metric_samples():
            found = True
            if sample == "vllm:num_requests_running":
                out["running"] += value
            elif sample == "vllm:num_requests_waiting":
                out["waiting"] += value
            elif sample == "nereid_llm_generation_tokens_per_second":
                out["tokens_per_second"] += value
            elif sample == "vllm:generation_tokens_total":
                out["generation_tokens"] += value
            elif sample == "vllm:time_to_first_token_seconds_sum":
                out["ttft_sum"] += value
            elif sample == "vllm:time_to_first_token_seconds_count":
                out["ttft_count"] += value
            elif sample in summed:
                out[summed[sample]] += value
    return out if found else None


class _Gpus:
    """Utilisation and memory of each NVIDIA GPU through NVML, where a driver and nvidia-ml-py exist."""

    def __init__(self) -> None:
        self._lib: Any = None
        self._handles: list[Any] = []
        self._tried = False

    def read(self) -> list[dict[str, Any]]:
        if not self._tried:
            self._tried = True
            try:
                import pynvml  # type: ignore[import-not-found]

                pynvml.nvmlInit()
                self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
                self._lib = pynvml
            except Exception:  # no package, no driver, no device: GPU figures are simply absent
                self._lib = None
        if self._lib is None:
            return []
        out = []
        for index, handle in enumerate(self._handles):
            try:
                memory = self._lib.nvmlDeviceGetMemoryInfo(handle)
                util = self._lib.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            except Exception:
                continue
            out.append({"index": index, "utilization": util, "used_bytes": memory.used, "total_bytes": memory.total})
        return out


class DashboardState:
    """Live snapshots for the page, and the recent loads and evictions, found by comparing the residency
    counters with those of the previous snapshot (so they are times of the poll that saw them, within a second)."""

    _EVENTS = 50

    def __init__(self, server: Server) -> None:
        self.server = server
        self._process = psutil.Process(os.getpid())
        self._children: dict[int, psutil.Process] = {}
        self._gpus = _Gpus()
        self._cpus = psutil.cpu_count() or 1
        self._seen_loads: dict[tuple[str, str], int] | None = None
        self._seen_evictions: dict[tuple[str, str], int] = {}
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=self._EVENTS)

    def _process_figures(self, versions: list[Any]) -> dict[str, Any]:
        """CPU seconds and RSS of the server and of its worker processes (the Python-backend instances, found
        through the loaded models: listing the process's children would scan every process of the machine)."""
        main = self._process
        with main.oneshot():
            times = main.cpu_times()
            cpu = times.user + times.system
            rss = main.memory_info().rss
        workers_cpu = 0.0
        workers_rss = 0
        alive: dict[int, psutil.Process] = {}
        for mv in versions:
            for instance in mv.instances:
                pid = getattr(instance, "pid", None)
                if not isinstance(pid, int) or pid in alive:
                    continue
                try:
                    # One Process per pid: psutil checks a pid's identity against the creation time it saw first.
                    known = self._children.get(pid) or psutil.Process(pid)
                    with known.oneshot():
                        ctimes = known.cpu_times()
                        workers_cpu += ctimes.user + ctimes.system
                        workers_rss += known.memory_info().rss
                    alive[pid] = known
                except psutil.Error:
                    continue
        self._children = alive
        return {
            "cpu_seconds": cpu,
            "rss_bytes": rss,
            "workers": len(alive),
            "workers_cpu_seconds": workers_cpu,
            "workers_rss_bytes": workers_rss,
            "cpu_count": self._cpus,
            "gpus": self._gpus.read(),
        }

    def _memory(self, now: float) -> dict[str, Any]:
        residency = self.server.repository.residency
        loads = dict(residency.loads)
        evictions = dict(residency.evictions)
        if self._seen_loads is not None:  # the first snapshot only sets the baseline
            for (model, cause), count in evictions.items():
                for _ in range(min(count - self._seen_evictions.get((model, cause), 0), self._EVENTS)):
                    self.events.append({"time": now, "kind": "eviction", "model": model, "cause": cause})
            for (model, cause), count in loads.items():
                for _ in range(min(count - self._seen_loads.get((model, cause), 0), self._EVENTS)):
                    kind = "cold start" if cause == "on_demand" else "load"
                    self.events.append({"time": now, "kind": kind, "model": model, "cause": cause})
        self._seen_loads, self._seen_evictions = loads, evictions
        resident = []
        for model, size in sorted(residency.resident_bytes().items()):
            footprint = residency.footprint(model)
            resident.append({"model": model, "bytes": size, "source": footprint.source if footprint is not None else ""})
        waits = residency.cold_waits
        return {
            "orchestrated": bool(residency.active),
            "budget_bytes": residency.host_budget,
            "charged_bytes": residency.charged_host(),
            "resident": resident,
            "loads_total": sum(loads.values()),
            "evictions_total": sum(evictions.values()),
            "cold_starts_total": sum(c for (_m, cause), c in loads.items() if cause == "on_demand"),
            "cold_wait_count": waits.count,
            "cold_wait_seconds": waits.total,
            "events": list(self.events),
        }

    def live(self, model: str = "") -> dict[str, Any]:
        """Cumulative counters of the server and of `model` (every loaded version added up), with the time they
        were read: the page divides the differences of two snapshots by the difference of their times."""
        now = time.time()
        versions = list(self.server.repository.ready_versions())
        snapshot: dict[str, Any] = {
            "time": now,
            "server": _totals(mv.stats for mv in versions) | {"models_ready": len(versions)},
            "process": self._process_figures(versions),
            "memory": self._memory(now),
            "model": None,
        }
        chosen = [mv for mv in versions if mv.name == model] if model else []
        if chosen:
            batches: dict[int, int] = {}
            for mv in chosen:
                for size, batch in mv.stats.batches.items():
                    batches[size] = batches.get(size, 0) + batch.compute_infer.count
            latest = max(chosen, key=lambda mv: mv.version)
            snapshot["model"] = _totals(mv.stats for mv in chosen) | {
                "name": model,
                "batches": {str(k): v for k, v in sorted(batches.items())},
                "quantiles_us": _quantiles(latest.stats),
                "llm": _llm(instance for mv in chosen for instance in mv.instances),
            }
        return snapshot
