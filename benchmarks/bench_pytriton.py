"""An add/sub function (FP32 [4], max_batch_size 64, dynamic batching) bound through nereid.pytriton against the same
function served by real PyTriton 0.7.0, measured with Triton's perf_analyzer over HTTP and gRPC, c = 1, 16, 64.

The function is served by this very script (`--serve nereid|pytriton`): the only difference between the two is the
import prefix (`nereid.pytriton.` or PyTriton's own `pytriton.`). Real PyTriton needs Python 3.12 here (under
3.11.7 its models fail to initialise in its stub's multiprocessing manager), so the script makes, once, in its
cache folder: a venv of pyenv's 3.12.1 with nvidia-pytriton 0.7.0 (run with LD_LIBRARY_PATH at that Python's lib/
for libpython3.12.so), perf_analyzer from the tritonclient 2.51.0 wheel's data/bin, and the CUDA runtime wheel it
links against; Debian's libb64-0d must be installed (`make system-deps`). Both servers protect statistics with a
triton-access-token, as PyTriton does by default, so perf_analyzer gets the header. Both servers run side by side
and each cell measures one, then the other, three times (the order flipping from pair to pair).

Each measurement is perf_analyzer's average of three 5 s windows, without its 10% stability gate by default: on
this shared 2-core VM that gate found no stable window within ten, for one server or the other, in three of the
six cells of one run (three of the four failures were PyTriton's), which left those cells without a ratio. The pairs stand in for it: the
table gives each side's median and the least favourable pair.

    .venv/bin/python benchmarks/bench_pytriton.py                           # 3 pairs of 3 x 5 s windows per cell
    .venv/bin/python benchmarks/bench_pytriton.py --stability 10 --trials 10 --pairs 1   # perf_analyzer's own gate
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("NEREID_BENCH_CACHE", Path.home() / ".cache" / "nereid-bench" / "pytriton"))
PYENV_312 = Path.home() / ".pyenv" / "versions" / "3.12.1"
TOKEN_HEADER = "triton-access-token"


# -- the served function (both servers run this code; only the import prefix differs) --------------------------
def add_sub(requests: Any) -> list[dict[str, Any]]:
    """Module-level, so worker processes (execution="process") find it by name."""
    return [{"OUTPUT0": r["INPUT0"] + r["INPUT1"], "OUTPUT1": r["INPUT0"] - r["INPUT1"]} for r in requests]


def serve(prefix: str, http_port: int, grpc_port: int, metrics_port: int, instances: int, execution: str) -> None:
    import importlib

    import numpy as np

    model_config = importlib.import_module(f"{prefix}.model_config")
    triton = importlib.import_module(f"{prefix}.triton")

    Tensor = model_config.Tensor
    config = triton.TritonConfig(
        http_address="127.0.0.1", grpc_address="127.0.0.1", metrics_address="127.0.0.1",
        http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
    )  # fmt: skip
    extra = {"execution": execution} if prefix == "nereid.pytriton" else {}
    with triton.Triton(config=config) as server:
        server.bind(
            **extra,
            model_name="add_sub",
            infer_func=[add_sub] * instances,
            inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(4,)), Tensor(name="INPUT1", dtype=np.float32, shape=(4,))],
            outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(4,)), Tensor(name="OUTPUT1", dtype=np.float32, shape=(4,))],
            config=model_config.ModelConfig(max_batch_size=64),
        )
        print(f"TOKEN={server.get_access_token()}", flush=True)
        server.serve()


# -- the tools, made once in the cache ----------------------------------------------------------------------------
def _run(cmd: list[str], **kwargs: Any) -> None:
    subprocess.run(cmd, check=True, **kwargs)


def pytriton_python() -> Path:
    venv = CACHE / "venv312"
    python = venv / "bin" / "python"
    if not python.exists() or subprocess.run([python, "-c", "import pytriton"], capture_output=True).returncode:
        if not (PYENV_312 / "bin" / "python3.12").exists():
            sys.exit(f"needs pyenv's Python 3.12.1 at {PYENV_312} for real PyTriton")
        _run([str(PYENV_312 / "bin" / "python3.12"), "-m", "venv", str(venv)])
        _run([str(venv / "bin" / "pip"), "install", "-q", "nvidia-pytriton==0.7.0", "numpy", "nvidia-cuda-runtime-cu12"])
    return python


def perf_analyzer(python312: Path) -> tuple[Path, dict[str, str]]:
    binary = CACHE / "tritonclient" / "tritonclient-2.51.0.data" / "data" / "bin" / "perf_analyzer"
    if not binary.exists():
        wheels = CACHE / "wheels"
        _run([str(python312), "-m", "pip", "download", "-q", "--no-deps", "tritonclient==2.51.0", "-d", str(wheels),
              "--platform", "manylinux1_x86_64", "--only-binary=:all:"])  # fmt: skip
        wheel = next(wheels.glob("tritonclient-2.51.0-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member.startswith("tritonclient-2.51.0.data/data/bin/"):
                    archive.extract(member, CACHE / "tritonclient")
        binary.chmod(0o755)
    site = subprocess.run([str(python312), "-c", "import site; print(site.getsitepackages()[0])"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    env = dict(os.environ, LD_LIBRARY_PATH=f"{site}/nvidia/cuda_runtime/lib")
    if not Path("/usr/lib/x86_64-linux-gnu/libb64.so.0d").exists():
        sys.exit("perf_analyzer needs Debian's libb64-0d: apt-get install libb64-0d (make system-deps)")
    return binary, env


# -- one server, then perf_analyzer against it --------------------------------------------------------------------
@dataclass
class Server:
    process: subprocess.Popen[str]
    http_port: int
    grpc_port: int
    token: str
    log: Path


def start(kind: str, python312: Path, instances: int, workdir: Path, execution: str) -> Server:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.servers import free_ports  # here, not at the top: `--serve pytriton` runs in PyTriton's own venv

    http_port, grpc_port, metrics_port = free_ports(3)
    args = [__file__, "--serve", kind, "--ports", f"{http_port},{grpc_port},{metrics_port}", "--instances", str(instances),
            "--execution", execution]  # fmt: skip
    log = workdir / f"{kind}.log"
    if kind == "pytriton":
        env = dict(os.environ, LD_LIBRARY_PATH=str(PYENV_312 / "lib"))
        cmd = [str(python312), *args]
    else:
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        cmd = [sys.executable, *args]
    stderr = log.open("w")
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    token = ""
    deadline = time.monotonic() + 180
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        if line.startswith("TOKEN="):
            token = line.strip().split("=", 1)[1]
            break
    if not token:
        process.kill()
        sys.exit(f"{kind} did not start; see {log}:\n{log.read_text()[-3000:]}")
    return Server(process, http_port, grpc_port, token, log)


def stop(server: Server) -> None:
    server.process.send_signal(2)  # SIGINT: serve() returns, the Triton object stops
    try:
        server.process.wait(60)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@dataclass
class Point:
    throughput: float
    p99_ms: float
    error: str = ""


def measure(binary: Path, env: dict[str, str], server: Server, protocol: str, concurrency: int, args: argparse.Namespace,
            workdir: Path) -> Point:  # fmt: skip
    port = server.http_port if protocol == "http" else server.grpc_port
    # Restricted gRPC protocols expect the key with Triton's prefix, as tritonclient's PyTriton auth helper sends it.
    header = TOKEN_HEADER if protocol == "http" else f"triton-grpc-protocol-{TOKEN_HEADER}"
    report = workdir / f"pa-{protocol}-{concurrency}-{time.monotonic_ns()}.csv"
    cmd = [
        str(binary), "-m", "add_sub", "-u", f"127.0.0.1:{port}", "-i", protocol, "-b", "1",
        "--concurrency-range", f"{concurrency}:{concurrency}", "--shape", "INPUT0:4", "--shape", "INPUT1:4",
        "--measurement-mode", "time_windows", "-p", str(args.window_ms), "-r", str(args.trials),
        "-s", str(args.stability), "-H", f"{header}:{server.token}", "-f", str(report),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if not report.exists():
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return Point(0.0, 0.0, " / ".join(tail) or f"perf_analyzer exit {done.returncode}")
    with report.open() as handle:
        row = next(csv.DictReader(handle))
    return Point(float(row["Inferences/Second"]), float(row["p99 latency"]) / 1000.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", choices=["nereid", "pytriton"], help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    parser.add_argument("--instances", type=int, default=1, help="inference callables (instances) per model")
    parser.add_argument("--execution", choices=["thread", "process"], default="thread",
                        help="where nereid.pytriton runs the function: a thread per instance, or worker processes")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--pairs", type=int, default=3, help="alternating measurements of each server per cell")
    parser.add_argument("--window-ms", type=int, default=5000, help="perf_analyzer measurement window")
    parser.add_argument("--trials", type=int, default=3, help="perf_analyzer's most windows before it gives up")
    parser.add_argument("--stability", type=int, default=100,
                        help="perf_analyzer's stability percentage (100: the last three windows, however they spread)")
    args = parser.parse_args()
    if args.serve:
        http_port, grpc_port, metrics_port = (int(p) for p in args.ports.split(","))
        prefix = "nereid.pytriton" if args.serve == "nereid" else "pytriton"
        serve(prefix, http_port, grpc_port, metrics_port, args.instances, args.execution)
        return
    python312 = pytriton_python()
    binary, env = perf_analyzer(python312)
    levels = [int(c) for c in args.concurrency.split(",")]
    protocols = args.protocols.split(",")
    workdir = Path(tempfile.mkdtemp(prefix="bench-pytriton-"))
    pairs: dict[tuple[str, int], list[tuple[Point, Point]]] = {}  # (protocol, c) -> (nereid, pytriton) per pair
    servers: dict[str, Server] = {}
    try:
        # Both servers stay up, and each cell measures one then the other, `--pairs` times, the order flipping
        # from pair to pair, so that both sides of a ratio see the same minutes of this shared machine.
        for kind in ("nereid", "pytriton"):
            servers[kind] = start(kind, python312, args.instances, workdir, args.execution)
        flip = False
        for protocol in protocols:
            for concurrency in levels:
                for _ in range(args.pairs):
                    order = ["pytriton", "nereid"] if flip else ["nereid", "pytriton"]
                    flip = not flip
                    points = {}
                    for kind in order:
                        point = points[kind] = measure(binary, env, servers[kind], protocol, concurrency, args, workdir)
                        print(f"{kind} {protocol} c={concurrency}: {point.throughput:,.0f} inf/s, p99 {point.p99_ms:.2f} ms "
                              f"{point.error}", file=sys.stderr, flush=True)  # fmt: skip
                    pairs.setdefault((protocol, concurrency), []).append((points["nereid"], points["pytriton"]))
    finally:
        for server in servers.values():
            stop(server)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"add_sub through perf_analyzer, batch 1, FP32 [4], {args.instances} instance(s), nereid.pytriton "
          f"execution={args.execution}; per cell {args.pairs} alternating pair(s) of {args.window_ms} ms windows "
          f"(-r {args.trials} -s {args.stability}): medians per server, and the least favourable pair's ratios")  # fmt: skip
    print("| protocol | c | nereid.pytriton inf/s | PyTriton inf/s | ratio of medians | lowest pair ratio | "
          "nereid p99 ms | PyTriton p99 ms | p99 ratio of medians | highest pair p99 ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for protocol in protocols:
        for concurrency in levels:
            good = [(a, b) for a, b in pairs[(protocol, concurrency)] if not a.error and not b.error and b.throughput]
            if not good:
                errors = [a.error or b.error for a, b in pairs[(protocol, concurrency)]]
                print(f"| {protocol} | {concurrency} | no pair measured: {errors[0] if errors else '-'} | | | | | | | |")
                continue
            ours, theirs = statistics.median(a.throughput for a, _ in good), statistics.median(b.throughput for _, b in good)
            our_p99, their_p99 = statistics.median(a.p99_ms for a, _ in good), statistics.median(b.p99_ms for _, b in good)
            lowest = min(a.throughput / b.throughput for a, b in good)
            highest_p99 = max(a.p99_ms / b.p99_ms for a, b in good)
            print(f"| {protocol} | {concurrency} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x | {lowest:.2f}x | "
                  f"{our_p99:.2f} | {their_p99:.2f} | {our_p99 / their_p99:.2f}x | {highest_p99:.2f}x |"
                  + (f" ({len(good)} of {args.pairs} pairs)" if len(good) < args.pairs else ""))  # fmt: skip


if __name__ == "__main__":
    main()
