"""Memory soak: host memory of the whole server process tree under long mixed traffic, on Nereid and on real Triton.

Traffic for `--duration` seconds (10 minutes by default, `--hour` for one hour), all at once:
- HTTP JSON and gRPC clients on an ONNX model (`simple`, Nereid only), a Python model (`add_sub_python`) and
  ensembles (`python_ensemble` over the Python model on both servers; `simple_ensemble` of ONNX steps on Nereid);
- `--cycles` load/unload cycles (1,000 by default) of a Python model in explicit mode, one inference each;
- a slow reader (pipelined requests, responses read a kilobyte at a time) and a pipelining client (32 requests
  per write, then all answers).
The RSS of the server and of its workers (every child process) is sampled every second. Reported: the
steady-state slope over the second half (target < 1% per 10 minutes), and RSS after a model is unloaded against
before it was loaded (target within 5%). Real Triton serves only Python models here (CPU build, Python backend).
Writes benchmarks/results/memory_soak.md and memory_soak.png (matplotlib, from the analyze extra).

    .venv/bin/python benchmarks/bench_memory_soak.py                     # 10 min per server, 1,000 cycles
    .venv/bin/python benchmarks/bench_memory_soak.py --hour
    .venv/bin/python benchmarks/bench_memory_soak.py --duration 40 --cycles 20 --servers nereid,triton
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.protocol_models import PYTHON_ENSEMBLE  # noqa: E402
from tests.servers import RunningServer, reference_ready, start_nereid, start_real_triton  # noqa: E402

EXAMPLES = ROOT / "examples" / "model_repository"
RESULTS = ROOT / "benchmarks" / "results"
CYCLED = "cycled_python"
_FP32_4 = [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]} for n in ("INPUT0", "INPUT1")]
_BODIES = {
    "add_sub_python": {"inputs": _FP32_4},
    "python_ensemble": {"inputs": _FP32_4},
    CYCLED: {"inputs": _FP32_4},
    "simple": {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))} for n in ("INPUT0", "INPUT1")]},
    "simple_ensemble": {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16} for n in ("INPUT0", "INPUT1")]},
}


def _repository(directory: Path, with_onnx: bool) -> Path:
    names = ["add_sub_python"] + (["simple", "simple_ensemble", "ensemble_preprocess", "ensemble_postprocess"] if with_onnx else [])
    for name in names:
        shutil.copytree(EXAMPLES / name, directory / name)
    cycled = directory / CYCLED
    shutil.copytree(EXAMPLES / "add_sub_python", cycled)
    config = (cycled / "config.pbtxt").read_text().replace('name: "add_sub_python"', f'name: "{CYCLED}"')
    (cycled / "config.pbtxt").write_text(config)
    (directory / "python_ensemble" / "1").mkdir(parents=True)
    (directory / "python_ensemble" / "config.pbtxt").write_text(PYTHON_ENSEMBLE)
    return directory


# -- traffic, each client in a process of its own -------------------------------------------------------------------
def _http_client(port: int, models: list[str], stop: Any, results: Any, rate: float) -> None:
    session = requests.Session()
    ok = errors = 0
    pause = 1.0 / rate
    while not stop.is_set():
        for model in models:
            try:
                reply = session.post(f"http://127.0.0.1:{port}/v2/models/{model}/infer", json=_BODIES[model], timeout=30)
                ok, errors = (ok + 1, errors) if reply.status_code == 200 else (ok, errors + 1)
            except requests.RequestException:
                errors += 1
                session = requests.Session()
        time.sleep(pause)
    results.put(("http " + ",".join(models), ok, errors))


def _grpc_client(port: int, models: list[str], stop: Any, results: Any, rate: float) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    ok = errors = 0
    pause = 1.0 / rate
    while not stop.is_set():
        for model in models:
            inputs = []
            for spec in _BODIES[model]["inputs"]:
                tensor = grpcclient.InferInput(spec["name"], spec["shape"], spec["datatype"])
                dtype = np.float32 if spec["datatype"] == "FP32" else np.int32
                tensor.set_data_from_numpy(np.array(spec["data"], dtype=dtype).reshape(spec["shape"]))
                inputs.append(tensor)
            try:
                client.infer(model, inputs, client_timeout=30)
                ok += 1
            except Exception:
                errors += 1
        time.sleep(pause)
    results.put(("grpc " + ",".join(models), ok, errors))


def _raw_request(port: int, model: str) -> bytes:
    body = json.dumps(_BODIES[model]).encode()
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _pipelining_client(port: int, model: str, stop: Any, results: Any, slow: bool) -> None:
    """32 requests in one write, then every answer: all at once, or (slow) a kilobyte every 20 ms."""
    batch = _raw_request(port, model) * 32
    ok = errors = 0
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(batch)
                received = b""
                while received.count(b"HTTP/1.1 ") < 32 or not received.endswith(b"}"):
                    chunk = sock.recv(1024 if slow else 65536)
                    if not chunk:
                        break
                    received += chunk
                    if slow:
                        time.sleep(0.02)
                ok += received.count(b"HTTP/1.1 200")
                errors += 32 - received.count(b"HTTP/1.1 200")
        except OSError:
            errors += 32
        time.sleep(0.05)
    results.put(("slow reader" if slow else "pipelining", ok, errors))


# -- sampling -------------------------------------------------------------------------------------------------------
@dataclass
class Samples:
    times: list[float] = field(default_factory=list)
    server_mb: list[float] = field(default_factory=list)
    workers_mb: list[float] = field(default_factory=list)

    def total(self) -> list[float]:
        return [s + w for s, w in zip(self.server_mb, self.workers_mb)]


def _rss_mb(pid: int) -> tuple[float, float]:
    """(server, every child process together) resident set sizes in MiB."""
    try:
        process = psutil.Process(pid)
        server = process.memory_info().rss
        workers = 0
        for child in process.children(recursive=True):
            try:
                workers += child.memory_info().rss
            except psutil.NoSuchProcess:
                continue
    except psutil.NoSuchProcess:
        return 0.0, 0.0
    return server / 2**20, workers / 2**20


def _sampler(pid: int, samples: Samples, stop: threading.Event, interval: float, started: float) -> None:
    while not stop.wait(interval if samples.times else 0):
        server, workers = _rss_mb(pid)
        samples.times.append(time.monotonic() - started)
        samples.server_mb.append(server)
        samples.workers_mb.append(workers)


_WINDOW = 10  # samples (seconds) per window of the lower envelope


def _slope_percent_per_10_min(samples: Samples) -> float:
    """Least-squares slope of the total RSS over the second half of the run, as % of its mean per 600 s.

    Fitted to the lower envelope (each 10 s window's minimum): the load/unload cycles add and remove a worker
    process every second or so, a sawtooth that says nothing about growth; the envelope is the RSS between them.
    """
    half = len(samples.times) // 2
    times, total = samples.times[half:], samples.total()[half:]
    windows = range(0, len(times) - _WINDOW + 1, _WINDOW)
    x = np.array([times[i + _WINDOW // 2] for i in windows])
    y = np.array([min(total[i : i + _WINDOW]) for i in windows])
    if len(x) < 3:
        return float("nan")
    slope = np.polyfit(x, y, 1)[0]
    return float(slope * 600 / y.mean() * 100)


def _steady_rss(pid: int, seconds: float = 3.0) -> float:
    values = []
    for _ in range(int(seconds / 0.5)):
        values.append(sum(_rss_mb(pid)))
        time.sleep(0.5)
    return statistics.median(values)


def _post(server: RunningServer, path: str) -> bool:
    try:
        return requests.post(f"{server.base}{path}", json=_BODIES[CYCLED] if path.endswith("infer") else None, timeout=120).status_code == 200
    except requests.RequestException:
        return False


@dataclass
class Run:
    server: str
    duration: float
    samples: Samples
    slope: float
    cycles: int
    cycle_failures: int
    before_load_mb: float
    loaded_mb: float
    after_unload_mb: float
    traffic: list[tuple[str, int, int]]


def _soak(name: str, server: RunningServer, duration: float, cycles: int, with_onnx: bool) -> Run:
    ctx = multiprocessing.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    models_http = ["add_sub_python", "python_ensemble"] + (["simple", "simple_ensemble"] if with_onnx else [])
    models_grpc = ["add_sub_python", "python_ensemble"] + (["simple_ensemble"] if with_onnx else [])
    clients = [
        ctx.Process(target=_http_client, args=(server.http_port, models_http, stop, results, 100.0)),
        ctx.Process(target=_grpc_client, args=(server.grpc_port, models_grpc, stop, results, 100.0)),
        ctx.Process(target=_pipelining_client, args=(server.http_port, "add_sub_python", stop, results, False)),
        ctx.Process(target=_pipelining_client, args=(server.http_port, "add_sub_python", stop, results, True)),
    ]
    samples, sampling = Samples(), threading.Event()
    started = time.monotonic()
    sampler = threading.Thread(target=_sampler, args=(server.process.pid, samples, sampling, 1.0, started), daemon=True)
    sampler.start()
    for client in clients:
        client.start()
    done = failures = 0
    while time.monotonic() - started < duration:
        if done < cycles:
            loaded = _post(server, f"/v2/repository/models/{CYCLED}/load")
            served = loaded and _post(server, f"/v2/models/{CYCLED}/infer")
            unloaded = _post(server, f"/v2/repository/models/{CYCLED}/unload")
            failures += not (loaded and served and unloaded)
            done += 1
        else:
            time.sleep(0.5)
    stop.set()
    traffic = [results.get(timeout=60) for _ in clients]
    for client in clients:
        client.join(30)
    sampling.set()
    sampler.join(5)
    # Unload check, on a quiet server: RSS before a load, loaded (after one inference), and after the unload.
    time.sleep(2)  # let the last responses and worker exits settle before the baseline
    before = _steady_rss(server.process.pid)
    _post(server, f"/v2/repository/models/{CYCLED}/load")
    _post(server, f"/v2/models/{CYCLED}/infer")
    loaded_mb = _steady_rss(server.process.pid)
    _post(server, f"/v2/repository/models/{CYCLED}/unload")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sum(_rss_mb(server.process.pid)) > before * 1.05:
        time.sleep(0.5)
    after = _steady_rss(server.process.pid)
    return Run(name, duration, samples, _slope_percent_per_10_min(samples), done, failures, before, loaded_mb, after, traffic)


def _plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), squeeze=False)
    for axis, run in zip(axes[0], runs):
        minutes = [t / 60 for t in run.samples.times]
        axis.plot(minutes, run.samples.total(), label="server + workers")
        axis.plot(minutes, run.samples.server_mb, label="server process")
        axis.plot(minutes, run.samples.workers_mb, label="workers (child processes)")
        axis.set_title(f"{run.server}: slope {run.slope:+.2f}% / 10 min (2nd half, 10 s minima)")
        axis.set_xlabel("minutes")
        axis.set_ylabel("RSS (MiB)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def _table(runs: list[Run]) -> str:
    lines = [
        "| server | duration s | RSS start MiB | RSS end MiB | slope, 2nd half, 10 s minima (% / 10 min) | load/unload cycles (failed) "
        "| RSS before load / loaded / after unload MiB | after unload vs before | requests ok (failed) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        total = run.samples.total()
        ok = sum(t[1] for t in run.traffic)
        failed = sum(t[2] for t in run.traffic)
        lines.append(
            f"| {run.server} | {run.duration:.0f} | {total[0]:.0f} | {total[-1]:.0f} | {run.slope:+.2f} "
            f"| {run.cycles} ({run.cycle_failures}) | {run.before_load_mb:.0f} / {run.loaded_mb:.0f} / "
            f"{run.after_unload_mb:.0f} | {(run.after_unload_mb / run.before_load_mb - 1) * 100:+.1f}% | {ok:,} ({failed:,}) |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic per server (default 600)")
    parser.add_argument("--hour", action="store_true", help="one hour per server")
    parser.add_argument("--cycles", type=int, default=1000, help="load/unload cycles per server (within the duration)")
    parser.add_argument("--servers", default="nereid,triton", help="nereid, triton or both (comma-separated)")
    parser.add_argument("--note", default="", help="a line about the machine, written above the table")
    args = parser.parse_args()
    duration = 3600.0 if args.hour else args.duration
    runs: list[Run] = []
    for name in args.servers.split(","):
        if name == "triton" and not reference_ready():
            print("real Triton is not on this machine: skipped")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            repo = _repository(Path(tmp) / "models", with_onnx=name == "nereid")
            models = [p.name for p in repo.iterdir() if p.name != CYCLED]
            flags = ["--model-control-mode=explicit", *(f"--load-model={m}" for m in models)]
            server = start_nereid(repo, *flags, log_dir=Path(tmp)) if name == "nereid" else start_real_triton(repo, *flags)
            try:
                print(f"{name}: soaking for {duration:.0f} s ...", flush=True)
                runs.append(_soak(name, server, duration, args.cycles, with_onnx=name == "nereid"))
            finally:
                server.stop()
    if not runs:
        return 1
    table = _table(runs)
    print(table)
    for run in runs:
        print(f"{run.server} traffic: " + "; ".join(f"{kind} {ok} ok {failed} failed" for kind, ok, failed in run.traffic))
    RESULTS.mkdir(parents=True, exist_ok=True)
    _plot(runs, RESULTS / "memory_soak.png")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = [
        "# Memory soak: RSS of the server process tree under mixed traffic (`benchmarks/bench_memory_soak.py`)",
        "",
        f"{stamp}, `--duration {duration:.0f} --cycles {args.cycles}`. {args.note}".rstrip(),
        "",
        table,
        "",
        *(f"- {run.server} traffic: " + "; ".join(f"{kind}: {ok:,} ok, {failed:,} failed" for kind, ok, failed in run.traffic)
          for run in runs),
        "",
        "![RSS curves](memory_soak.png)",
        "",
    ]
    (RESULTS / "memory_soak.md").write_text("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
