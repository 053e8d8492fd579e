"""Nereid against real Triton measured with NVIDIA's own perf_analyzer (tritonclient 2.51.0), in one run.

Both servers serve the same repository: the Python add_sub model without batching and with dynamic batching
(max_batch_size 64, 100 µs delay, one instance). For each model, protocol (HTTP, gRPC) and concurrency
(1, 16, 64) perf_analyzer drives one server then the other, the order flipping from cell to cell, with its
default random inputs and its server-side statistics. Prints throughput, p99 and the server processes' CPU time
per request (server plus its Python workers or stubs, from psutil, over the requests the server's statistics
counted), with Nereid's ratio to Triton, and writes the table to benchmarks/results/perf_analyzer.md.
`--modes` adds one row per other perf_analyzer mode (shared memory, request rate, sequences, streaming). `--async`
runs the concurrency cells in perf_analyzer's async mode (at most 16 threads, its default --max-threads, each keeping
several requests in flight, each request with an id of its own) instead of its default sync mode (one thread per
request in flight, ids empty).

    .venv/bin/python benchmarks/bench_perf_analyzer.py                       # 5 s windows
    .venv/bin/python benchmarks/bench_perf_analyzer.py --window-ms 500 --modes --output /tmp/pa.md   # smoke run

perf_analyzer is installed once into ~/.cache/nereid-bench/perf_analyzer (see tests/perf_analyzer.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.perf_analyzer import PerfAnalyzer, install_perf_analyzer  # noqa: E402
from tests.perf_analyzer_models import (  # noqa: E402
    ADD_SUB,
    ADD_SUB_BATCHED,
    DECOUPLED,
    SEQUENCE,
    build_perf_analyzer_repository,
)
from tests.servers import RunningServer, reference_ready, start_nereid, start_real_triton  # noqa: E402

from benchmarks.report import publish  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "perf_analyzer.md"
# The other perf_analyzer modes, each as (model, arguments); run at the given protocol only where it exists.
MODES: dict[str, tuple[str, list[str], tuple[str, ...]]] = {
    "shared memory (system), c=16": (ADD_SUB_BATCHED, ["--shared-memory", "system", "--output-shared-memory-size", "64", "--concurrency-range", "16"], ("http", "grpc")),
    "request rate 500/s": (ADD_SUB_BATCHED, ["--request-rate-range", "500"], ("http", "grpc")),
    "sequences of 5, c=8": (SEQUENCE, ["--sequence-length", "5", "--concurrency-range", "8"], ("http", "grpc")),
    "streaming decoupled (3 responses), c=16": (DECOUPLED, ["--streaming", "--concurrency-range", "16"], ("grpc",)),
}  # fmt: skip


# perf_analyzer's own stability rule (its defaults); set from the command line.
_STABILITY: list[str] = []
_WARMUP = ["--measurement-mode", "count_windows", "--measurement-request-count", "200", "--max-trials", "2"]
_WARMUP += ["--stability-percentage", "999"]


class Measured(NamedTuple):
    """One perf_analyzer run against one server."""

    throughput: float  # perf_analyzer's infer/s (NaN when it never ended)
    p99_us: float
    cpu_us_per_request: float
    served_per_s: float  # the server's own success count over the whole perf_analyzer run, over its wall time
    unstable: bool
    timed_out: bool
    cpu_parts: dict[str, float]  # CPU µs per request of the server's main thread, its other threads, its children


def _cpu_parts(server: RunningServer) -> dict[str, float]:
    """CPU seconds by part: the server process's main thread (Nereid's event loop), its other threads (Nereid's
    batchers and transports; Triton's thread pools), and the processes it started (Python workers or stubs)."""
    parts = {"main thread": 0.0, "other threads": 0.0, "child processes": 0.0}
    try:
        root = psutil.Process(server.process.pid)
        for thread in root.threads():
            parts["main thread" if thread.id == root.pid else "other threads"] += thread.user_time + thread.system_time
        for child in root.children(recursive=True):
            times = child.cpu_times()
            parts["child processes"] += times.user + times.system
    except psutil.NoSuchProcess:
        pass
    return parts


def _pin(server: RunningServer, cpus: str) -> None:
    """Confine every thread of the server and of the processes it started to `cpus` (threads and processes made
    later inherit it)."""
    root = psutil.Process(server.process.pid)
    for process in [root, *root.children(recursive=True)]:
        subprocess.run(["taskset", "-a", "-cp", cpus, str(process.pid)], capture_output=True, check=True)


@dataclass
class Cell:
    label: str
    protocol: str
    concurrency: str
    server: str
    measured: Measured


def _process_tree_cpu(server: RunningServer) -> float:
    """User + system CPU seconds of the server and everything it started (Python workers, backend stubs)."""
    try:
        root = psutil.Process(server.process.pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def _success_count(server: RunningServer, model: str) -> int:
    stats = requests.get(f"{server.base}/v2/models/{model}/stats", timeout=10).json()
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats["model_stats"])


def _measure(
    analyzer: PerfAnalyzer, server: RunningServer, model: str, protocol: str, args: list[str], window_ms: int, csv: Path
) -> Measured:
    args = [*args, *_STABILITY]
    url = server.http_url if protocol == "http" else server.grpc_url
    parts_before = _cpu_parts(server)
    cpu_before, count_before, started = _process_tree_cpu(server), _success_count(server, model), time.perf_counter()
    # perf_analyzer itself has hung (against real Triton, HTTP c=32 and up: its main thread never finishes copying
    # the request records of its first windows while its sync threads fill them): a run is given three times its
    # longest possible measurement, then the cell is recorded as timed out and the sweep goes on.
    trials = int(args[args.index("--max-trials") + 1])
    throughput = p99 = float("nan")
    unstable = timed_out = False
    try:
        result = analyzer.measure(
            "-m", model, "-i", protocol, "-u", url, "-p", str(window_ms), *args, csv_path=csv,
            timeout=60 + 3 * (trials + 2) * window_ms / 1000, allow_unstable=True,
        )  # fmt: skip
        throughput, p99, unstable = result.throughput, result.p99_us, "unstable" in result.row
    except subprocess.TimeoutExpired:
        timed_out = True
    elapsed = time.perf_counter() - started
    cpu = _process_tree_cpu(server) - cpu_before
    # The count covers every trial perf_analyzer ran, so the CPU is divided over the same requests.
    count = _success_count(server, model) - count_before
    cpu_per_request = cpu / count * 1e6 if count else float("nan")
    parts = {name: (seconds - parts_before[name]) / count * 1e6 if count else float("nan") for name, seconds in _cpu_parts(server).items()}
    return Measured(throughput, p99, cpu_per_request, count / elapsed, unstable, timed_out, parts)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b and a == a and b == b else "-"


def _table(cells: list[Cell]) -> list[str]:
    lines = [
        "| case | protocol | c | Nereid infer/s | Triton infer/s | ratio | Nereid p99 µs | Triton p99 µs | p99 ratio "
        "| Nereid CPU µs/req | Triton CPU µs/req | Nereid served/s | Triton served/s | served ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = list(dict.fromkeys((c.label, c.protocol, c.concurrency) for c in cells))
    for label, protocol, concurrency in keys:
        group = [c for c in cells if (c.label, c.protocol, c.concurrency) == (label, protocol, concurrency)]
        by: dict[str, list[Cell]] = {}
        for cell in group:
            by.setdefault(cell.server, []).append(cell)

        def median(server: str, field: str, by: dict[str, list[Cell]] = by) -> float:
            # A hung perf_analyzer's main thread takes most of a core copying its records, starving the server it
            # measures: a hung run's CPU and served/s count only where no run of that server's cell ended.
            runs = [c for c in by.get(server, []) if not c.measured.timed_out] or by.get(server, [])
            values = [v for c in runs if (v := getattr(c.measured, field)) == v]  # NaN: a timed-out run
            return statistics.median(values) if values else float("nan")

        n_t, t_t = median("nereid", "throughput"), median("triton", "throughput")
        n_p, t_p = median("nereid", "p99_us"), median("triton", "p99_us")
        n_c, t_c = median("nereid", "cpu_us_per_request"), median("triton", "cpu_us_per_request")
        n_s, t_s = median("nereid", "served_per_s"), median("triton", "served_per_s")

        def fmt(value: float) -> str:
            return "-" if value != value else f"{value:,.0f}"

        if any(c.measured.unstable for c in group):
            label += " (unstable\\*)"
        if any(c.measured.timed_out for c in group):
            label += " (timed out\\*\\*)"
        lines.append(
            f"| {label} | {protocol} | {concurrency} | {fmt(n_t)} | {fmt(t_t)} | {_ratio(n_t, t_t)} | {fmt(n_p)} "
            f"| {fmt(t_p)} | {_ratio(n_p, t_p)} | {fmt(n_c)} | {fmt(t_c)} | {fmt(n_s)} | {fmt(t_s)} | {_ratio(n_s, t_s)} |"
        )
    return lines


def _cpu_list(text: str) -> set[int]:
    """A taskset-style CPU list ("1", "0,2", "2-5") as a set."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _parts_table(cells: list[Cell]) -> list[str]:
    """Where each server's CPU per request goes (medians over rounds), the input of docs/scaling.md's projection."""
    names = list(cells[0].measured.cpu_parts) if cells else []
    lines = [
        "| case | protocol | c | server | " + " | ".join(f"{n} µs/req" for n in names) + " |",
        "|---|---|---|---|" + "---|" * len(names),
    ]
    keys = list(dict.fromkeys((c.label, c.protocol, c.concurrency, c.server) for c in cells))
    for key in keys:
        runs = [c for c in cells if (c.label, c.protocol, c.concurrency, c.server) == key and not c.measured.timed_out]
        values = []
        for name in names:
            got = [v for c in runs if (v := c.measured.cpu_parts[name]) == v]
            values.append(f"{statistics.median(got):,.1f}" if got else "-")
        lines.append(f"| {' | '.join(key)} | " + " | ".join(values) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window-ms", type=int, default=5000, help="perf_analyzer's measurement interval (-p)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"], choices=["http", "grpc"])
    parser.add_argument("--servers", nargs="+", default=["nereid", "triton"], choices=["nereid", "triton"])
    parser.add_argument("--cases", nargs="+", default=["batched", "unbatched"], choices=["batched", "unbatched"])
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole sweep; the table shows medians")
    parser.add_argument(
        "--modes", action="store_true", help="also run shared memory, request rate, sequences, streaming"
    )
    parser.add_argument(
        "--async",
        dest="async_mode",
        action="store_true",
        help="perf_analyzer's async mode for the concurrency cells (its sync mode has hung against Triton's HTTP)",
    )
    parser.add_argument("--max-trials", type=int, default=10, help="perf_analyzer's --max-trials")
    parser.add_argument("--stability-percentage", type=float, default=10, help="perf_analyzer's --stability-percentage")
    parser.add_argument(
        "--server-cpus", default="", help="confine each server's process tree to these CPUs (taskset list, e.g. 0)"
    )
    parser.add_argument(
        "--client-cpus", default="", help="confine perf_analyzer to these CPUs (e.g. 1): throughput per core"
    )
    parser.add_argument("--note", default="", help="a line to put above the table (how and where it was measured)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    if "triton" in args.servers and not reference_ready():
        print("the real Triton reference cannot be set up; running Nereid only", file=sys.stderr)
        args.servers = [s for s in args.servers if s != "triton"]

    _STABILITY[:] = ["--max-trials", str(args.max_trials), "--stability-percentage", f"{args.stability_percentage:g}"]
    analyzer = install_perf_analyzer()
    cells: list[Cell] = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-perf-analyzer-") as tmp:
        repo = build_perf_analyzer_repository(Path(tmp) / "repo")
        csv = Path(tmp) / "report.csv"
        servers: dict[str, RunningServer] = {}
        try:
            for name in args.servers:
                flags = ["--log-verbose=0", "--exit-timeout-secs=2"]
                # Triton 2.51 always lets clients register shared memory; Nereid asks for the flag, as newer Tritons do.
                servers[name] = (
                    start_nereid(repo, *flags, "--allow-client-shm=true")
                    if name == "nereid"
                    else start_real_triton(repo, *flags)
                )
            if args.server_cpus:
                for server in servers.values():
                    _pin(server, args.server_cpus)
            if args.client_cpus:  # perf_analyzer, started from here, inherits it
                os.sched_setaffinity(0, _cpu_list(args.client_cpus))
            plan: list[tuple[str, str, str, str, list[str]]] = []
            cases = {"batched": (ADD_SUB_BATCHED, "add_sub, dynamic batching"), "unbatched": (ADD_SUB, "add_sub, no batching")}
            for model, label in (cases[case] for case in args.cases):
                for protocol in args.protocols:
                    for concurrency in args.concurrency:
                        extra = ["--concurrency-range", str(concurrency), *(["--async"] if args.async_mode else [])]
                        plan.append((label, protocol, str(concurrency), model, extra))
            if args.modes:
                for label, (model, extra, protocols) in MODES.items():
                    for protocol in protocols:
                        if protocol in args.protocols:
                            plan.append((label, protocol, "-", model, extra))
            for server in servers.values():  # warm up each model's worker once
                for model in (ADD_SUB, ADD_SUB_BATCHED):
                    analyzer.run("-m", model, "-i", "grpc", "-u", server.grpc_url, "--concurrency-range", "4", *_WARMUP)
            flip = False
            for _ in range(args.rounds):
                for label, protocol, concurrency, model, extra in plan:
                    order = list(servers.items())
                    if flip:
                        order.reverse()
                    flip = not flip
                    for name, server in order:
                        m = _measure(analyzer, server, model, protocol, extra, args.window_ms, csv)
                        cells.append(Cell(label, protocol, concurrency, name, m))
                        outcome = "perf_analyzer timed out" if m.timed_out else f"{m.throughput:10,.0f}/s p99 {m.p99_us:8,.0f} µs"
                        print(f"{name:7} {label:40} {protocol:4} c={concurrency:3} {outcome}"
                              f" CPU {m.cpu_us_per_request:6,.0f} µs/req served {m.served_per_s:8,.0f}/s", flush=True)  # fmt: skip
        finally:
            for server in servers.values():
                server.stop()
    lines = [
        "# perf_analyzer: Nereid vs real Triton 2.51",
        "",
        f"`benchmarks/bench_perf_analyzer.py --window-ms {args.window_ms}{' --modes' if args.modes else ''}"
        f"{' --async' if args.async_mode else ''}"
        f" --max-trials {args.max_trials} --stability-percentage {args.stability_percentage:g}"
        f" --rounds {args.rounds}"
        f"{f' --server-cpus {args.server_cpus}' if args.server_cpus else ''}"
        f"{f' --client-cpus {args.client_cpus}' if args.client_cpus else ''}`, perf_analyzer 2.51.0 (random inputs, server-side statistics), "
        f"{time.strftime('%Y-%m-%d', time.gmtime(started))}, {(time.time() - started) / 60:.1f} min. The servers "
        "alternate cell by cell, the order flipping each time. CPU µs/req is user+system time of the server's "
        "process tree over the requests its statistics counted. (unstable\\*): perf_analyzer's windows never "
        "agreed within its stability percentage; that cell shows its last window's throughput, without p99. "
        "(timed out\\*\\*): a perf_analyzer run of that cell never ended and was killed; the medians of its "
        "figures leave it out. Served/s is the server's own success count over perf_analyzer's whole run (its "
        "start, every trial, its end) divided by the run's wall time: a cross-check that does not depend on "
        "perf_analyzer closing its windows. A hung perf_analyzer spends most of a core copying its records, "
        "starving the server, so a timed-out run's CPU and served/s count only where every round of that server "
        "timed out.",
        "",
    ]
    if args.note:
        lines += [args.note, ""]
    lines += _table(cells)
    lines += ["", "Where each server's CPU per request goes:", "", *_parts_table(cells)]
    publish(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
