"""`nereid analyze` resource figures: psutil on a process tree, and the metrics fallback (nv_cpu_*, nv_gpu_*)
read from a stand-in metrics endpoint, as a remote server or a GPU machine would expose them."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nereid.tools.analyze.budget import TimeBudget
from nereid.tools.analyze.resources import ResourceMonitor, scrape_metrics

METRICS = """# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.25
# TYPE nv_cpu_memory_used_bytes gauge
nv_cpu_memory_used_bytes 2147483648
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-a"} 0.5
nv_gpu_utilization{gpu_uuid="GPU-b"} 0.7
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 1048576000
nv_gpu_memory_used_bytes{gpu_uuid="GPU-b"} 48576000
"""


@pytest.fixture
def metrics_url() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = METRICS.encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_metrics_fallback_reads_cpu_memory_and_sums_gpus(metrics_url: str) -> None:
    assert scrape_metrics(metrics_url) is not None
    monitor = ResourceMonitor(None, metrics_url)
    assert "nv_cpu_" in monitor.source and monitor.has_gpu
    monitor.begin()
    sample = monitor.end()
    assert sample.cpu_percent == pytest.approx(25.0) and sample.memory_mb == pytest.approx(2048.0)
    assert sample.gpu_utilization_percent == pytest.approx(60.0)
    assert sample.gpu_memory_mb == pytest.approx((1048576000 + 48576000) / 2**20)


def test_no_process_and_no_metrics_leaves_figures_empty() -> None:
    monitor = ResourceMonitor(None, "127.0.0.1:1")
    assert "not available" in monitor.source
    monitor.begin()
    sample = monitor.end()
    assert sample.cpu_percent is None and sample.memory_mb is None and sample.gpu_memory_mb is None


def test_process_tree_cpu_and_peak_memory_include_children() -> None:
    # A parent that starts a busy child holding ~60 MB: both count, as Python-backend stubs do for a server.
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'b = bytearray(60 * 2**20)\\nimport time\\nt = time.time()\\n"
        "while time.time() - t < 30: pass'])\n"
        "time.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        import psutil

        deadline = time.monotonic() + 10
        while not psutil.Process(parent.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        monitor = ResourceMonitor(parent.pid, "")
        assert f"pid {parent.pid}" in monitor.source
        child = psutil.Process(parent.pid).children()[0]
        child_before, wall_before = sum(child.cpu_times()[:2]), time.monotonic()
        monitor.begin()
        time.sleep(0.6)
        sample = monitor.end()
        child_percent = 100 * (sum(child.cpu_times()[:2]) - child_before) / (time.monotonic() - wall_before)
        assert sample.memory_mb is not None and sample.memory_mb > 60
        # The child spins: what it got of a core (less on a loaded machine) is in the tree's figure.
        assert child_percent > 5
        assert sample.cpu_percent is not None and sample.cpu_percent > 0.7 * child_percent
        assert sample.gpu_memory_mb is None
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()


def test_time_budget_keeps_a_reserve_and_learns_level_costs() -> None:
    budget = TimeBudget(10.0, 100, 0.0)
    assert 0 < budget.reserve_s <= 5 and budget.remaining() <= 10 - budget.reserve_s
    assert budget.fits_variant() and budget.fits_level()
    assert 60 <= budget.trials_that_fit(500) <= 95  # windows of 0.1 s in what is left
    assert budget.trials_that_fit(4) == 4
    budget.observe_level(100.0)
    assert not budget.fits_level()  # a level has been seen to take longer than what is left
