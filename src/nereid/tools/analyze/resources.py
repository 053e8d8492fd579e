"""CPU, memory and GPU of the server while a level is measured: psutil on the server's process tree when its
pid is known (started here, or listening on this machine), else the server's `nv_cpu_*` metrics; `nv_gpu_*`
metrics wherever the metrics endpoint has them."""

from __future__ import annotations

import threading
import time
import urllib.request
from dataclasses import dataclass

__all__ = ["ResourceMonitor", "ResourceSample", "scrape_metrics"]

_SAMPLE_INTERVAL_S = 0.1


@dataclass(slots=True)
class ResourceSample:
    cpu_percent: float | None = None
    memory_mb: float | None = None
    gpu_utilization_percent: float | None = None
    gpu_memory_mb: float | None = None


def scrape_metrics(metrics_url: str, timeout: float = 2.0) -> dict[str, list[float]] | None:
    """Values of each metric family at a Prometheus endpoint (host:port), or None when it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    url = metrics_url if metrics_url.startswith("http") else f"http://{metrics_url}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 - a host:port the user gave
            text = reply.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    values: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values.setdefault(sample.name, []).append(float(sample.value))
    except ValueError:
        return None
    return values


class ResourceMonitor:
    """Measures one level at a time: `begin()` before the load starts, `end()` after it stops."""

    def __init__(self, pid: int | None, metrics_url: str) -> None:
        self._metrics_url = metrics_url
        self._process = None
        if pid is not None:
            import psutil

            try:
                self._process = psutil.Process(pid)
            except psutil.Error:
                self._process = None
        self._cpu_before: dict[int, float] = {}
        self._started = 0.0
        self._peak_rss = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._metrics_seen = scrape_metrics(metrics_url) if metrics_url else None

    @property
    def source(self) -> str:
        if self._process is not None:
            return f"psutil on the server's process tree (pid {self._process.pid}): CPU time and peak resident memory"
        if self._metrics_seen and "nv_cpu_utilization" in self._metrics_seen:
            return f"the server's nv_cpu_* metrics at {self._metrics_url} (machine-wide CPU utilisation and used memory)"
        return "not available (no local server process and no metrics endpoint)"

    @property
    def has_gpu(self) -> bool:
        return bool(self._metrics_seen and self._metrics_seen.get("nv_gpu_memory_used_bytes"))

    def _tree(self) -> list:  # type: ignore[type-arg]
        import psutil

        assert self._process is not None
        try:
            return [self._process, *self._process.children(recursive=True)]
        except psutil.Error:
            return []

    def _cpu_times(self) -> dict[int, float]:
        import psutil

        times = {}
        for proc in self._tree():
            try:
                t = proc.cpu_times()
                times[proc.pid] = t.user + t.system
            except psutil.Error:
                continue
        return times

    def _rss(self) -> int:
        import psutil

        total = 0
        for proc in self._tree():
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                continue
        return total

    def _sample_loop(self) -> None:
        while not self._stop.wait(_SAMPLE_INTERVAL_S):
            self._peak_rss = max(self._peak_rss, self._rss())

    def begin(self) -> None:
        self._started = time.monotonic()
        if self._process is None:
            return
        self._cpu_before = self._cpu_times()
        self._peak_rss = self._rss()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample_loop, name="analyze-resources", daemon=True)
        self._thread.start()

    def end(self) -> ResourceSample:
        elapsed = max(time.monotonic() - self._started, 1e-6)
        sample = ResourceSample()
        if self._process is not None:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            after = self._cpu_times()
            used = sum(t - self._cpu_before.get(pid, 0.0) for pid, t in after.items())
            sample.cpu_percent = 100.0 * max(used, 0.0) / elapsed
            sample.memory_mb = max(self._peak_rss, self._rss()) / 2**20
        metrics = scrape_metrics(self._metrics_url) if self._metrics_url and (self._process is None or self.has_gpu) else None
        if metrics:
            if self._process is None:
                if metrics.get("nv_cpu_utilization"):
                    sample.cpu_percent = 100.0 * metrics["nv_cpu_utilization"][0]
                if metrics.get("nv_cpu_memory_used_bytes"):
                    sample.memory_mb = metrics["nv_cpu_memory_used_bytes"][0] / 2**20
            if metrics.get("nv_gpu_memory_used_bytes"):
                sample.gpu_memory_mb = sum(metrics["nv_gpu_memory_used_bytes"]) / 2**20
            util = metrics.get("nv_gpu_utilization")
            if util:
                sample.gpu_utilization_percent = 100.0 * sum(util) / len(util)
        return sample
