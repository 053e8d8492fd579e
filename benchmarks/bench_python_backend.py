"""Python-backend add_sub (FP32 [4], max_batch_size 64, no dynamic batching) on Nereid and on real Triton.

Both servers serve the same repository (examples/model_repository/add_sub_python, plus a two-instance copy) and
are driven in the same run with HTTP JSON requests, alternating server by server at each concurrency. The load
generator is wrk with a Lua script when `wrk` is installed, else a multi-process Python client. Prints
throughput and p99 for each server and Nereid's ratio to Triton.

    .venv/bin/python benchmarks/bench_python_backend.py                  # 10 s per point, c = 1, 16, 64
    .venv/bin/python benchmarks/bench_python_backend.py --duration 2 --concurrency 16 --instances 1
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import RunningServer, reference_ready, start_nereid, start_real_triton  # noqa: E402

MODEL = "add_sub_python"
BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [0.5, 0.5, 0.5, 0.5]},
        ]
    }
)


@dataclass
class Point:
    server: str
    model: str
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def _repository(directory: Path) -> Path:
    """The example model, and the same model with two instances."""
    source = ROOT / "examples" / "model_repository" / MODEL
    shutil.copytree(source, directory / MODEL)
    two = directory / f"{MODEL}_x2"
    shutil.copytree(source, two)
    config = (two / "config.pbtxt").read_text()
    config = config.replace(f'name: "{MODEL}"', f'name: "{MODEL}_x2"').replace("count: 1", "count: 2")
    (two / "config.pbtxt").write_text(config)
    return directory


# -- wrk ----------------------------------------------------------------------------------------------------------
_WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [[%s]]
"""
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _wrk_ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    return float(match.group(1)) * _UNITS[match.group(2)] if match else float("nan")


def _run_wrk(url: str, concurrency: int, duration: float, script: Path) -> tuple[float, float, float, int]:
    threads = 1 if concurrency < 4 else 2
    command = [
        "wrk",
        f"-t{threads}",
        f"-c{concurrency}",
        f"-d{max(1, round(duration))}s",
        "--latency",
        "-s",
        str(script),
        url,
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    p50 = _wrk_ms(re.search(r"\s50%\s+(\S+)", output).group(1))  # type: ignore[union-attr]
    p99 = _wrk_ms(re.search(r"\s99%\s+(\S+)", output).group(1))  # type: ignore[union-attr]
    errors_match = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    return rps, p50, p99, int(errors_match.group(1)) if errors_match else 0


# -- the Python fallback --------------------------------------------------------------------------------------------
def _client_loop(port: int, path: str, connections: int, stop_at: float, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import selectors

    body = BODY.encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    latencies: list[float] = []
    errors = 0
    conns = [http.client.HTTPConnection("127.0.0.1", port) for _ in range(connections)]
    selector = selectors.DefaultSelector()
    started: dict[int, float] = {}
    for conn in conns:
        conn.connect()
        conn.sock.sendall(request)  # type: ignore[union-attr]
        started[id(conn)] = time.perf_counter()
        selector.register(conn.sock, selectors.EVENT_READ, conn)  # type: ignore[arg-type]
    while time.perf_counter() < stop_at:
        for key, _ in selector.select(timeout=0.5):
            conn = key.data
            response = http.client.HTTPResponse(conn.sock)  # type: ignore[arg-type]
            response.begin()
            response.read()
            latencies.append(time.perf_counter() - started[id(conn)])
            if response.status != 200:
                errors += 1
            conn.sock.sendall(request)
            started[id(conn)] = time.perf_counter()
    queue.put((latencies, errors))


def _run_python(port: int, model: str, concurrency: int, duration: float) -> tuple[float, float, float, int]:
    processes = min(concurrency, 4)
    per_process = [concurrency // processes + (1 if i < concurrency % processes else 0) for i in range(processes)]
    queue: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    stop_at = time.perf_counter() + duration
    workers = [
        multiprocessing.Process(target=_client_loop, args=(port, f"/v2/models/{model}/infer", n, stop_at, queue))
        for n in per_process
    ]
    for worker in workers:
        worker.start()
    latencies: list[float] = []
    errors = 0
    for _ in workers:
        got, failed = queue.get()
        latencies.extend(got)
        errors += failed
    for worker in workers:
        worker.join()
    latencies.sort()
    if not latencies:
        return 0.0, float("nan"), float("nan"), errors
    return (
        len(latencies) / duration,
        latencies[len(latencies) // 2] * 1e3,
        latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        errors,
    )


# -- the run ---------------------------------------------------------------------------------------------------------
def _measure(server: RunningServer, model: str, concurrency: int, duration: float, script: Path | None) -> tuple[float, float, float, int]:
    if script is not None:
        return _run_wrk(f"{server.base}/v2/models/{model}/infer", concurrency, duration, script)
    return _run_python(server.http_port, model, concurrency, duration)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each server's first point")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 2], choices=[1, 2])
    parser.add_argument("--servers", nargs="+", default=["nereid", "triton"], choices=["nereid", "triton"])
    parser.add_argument("--python-client", action="store_true", help="use the Python load generator even if wrk exists")
    args = parser.parse_args()
    if "triton" in args.servers and not reference_ready():
        print("the real Triton reference cannot be set up; running Nereid only", file=sys.stderr)
        args.servers = [s for s in args.servers if s != "triton"]

    with tempfile.TemporaryDirectory(prefix="bench-python-") as tmp:
        repo = _repository(Path(tmp))
        script: Path | None = None
        if shutil.which("wrk") and not args.python_client:
            script = Path(tmp) / "post.lua"
            script.write_text(_WRK_SCRIPT % BODY)
        generator = "wrk" if script is not None else "python multi-process client"
        servers: dict[str, RunningServer] = {}
        try:
            for name in args.servers:
                flags = ["--log-verbose=0", "--exit-timeout-secs=2"]
                servers[name] = start_nereid(repo, *flags) if name == "nereid" else start_real_triton(repo, *flags)
            models = [MODEL if n == 1 else f"{MODEL}_x2" for n in args.instances]
            if args.warmup > 0:
                for server in servers.values():
                    for model in models:
                        _measure(server, model, 16, args.warmup, script)
            points: list[Point] = []
            for model in models:
                for concurrency in args.concurrency:
                    order = list(servers.items())
                    if concurrency % 2:  # alternate which server goes first
                        order.reverse()
                    for name, server in order:
                        rps, p50, p99, errors = _measure(server, model, concurrency, args.duration, script)
                        points.append(Point(name, model, concurrency, rps, p50, p99, errors))
        finally:
            for server in servers.values():
                server.stop()
    _print_table(points, generator, args.duration)
    return 0


def _print_table(points: list[Point], generator: str, duration: float) -> None:
    print(f"\nPython backend add_sub, HTTP JSON, {generator}, {duration:g} s per point\n")
    header = "| model | c | Nereid req/s | Triton req/s | ratio | Nereid p99 ms | Triton p99 ms | p99 ratio | errors |"
    print(header)
    print("|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(p.model, p.concurrency) for p in points}, key=lambda k: (k[0], k[1]))
    for model, concurrency in keys:
        by_server = {p.server: p for p in points if p.model == model and p.concurrency == concurrency}
        nereid, triton = by_server.get("nereid"), by_server.get("triton")

        def fmt(value: float | None, digits: int = 0) -> str:
            return "-" if value is None else f"{value:,.{digits}f}"

        ratio = nereid.rps / triton.rps if nereid and triton and triton.rps else None
        p99_ratio = nereid.p99_ms / triton.p99_ms if nereid and triton and triton.p99_ms else None
        errors = sum(p.errors for p in by_server.values())
        print(
            f"| {model} | {concurrency} | {fmt(nereid.rps if nereid else None)} | {fmt(triton.rps if triton else None)} "
            f"| {fmt(ratio, 2)}x | {fmt(nereid.p99_ms if nereid else None, 2)} | {fmt(triton.p99_ms if triton else None, 2)} "
            f"| {fmt(p99_ratio, 2)}x | {errors} |"
        )


if __name__ == "__main__":
    sys.exit(main())
