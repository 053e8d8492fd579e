"""Same-run A/B of Nereid's CPU time per request: two source trees (say the code before a change and after it)
serve the same repository and perf_analyzer sends each the same fixed number of requests, the two alternating.

CPU time per request (user + system, from psutil, over the requests the server's statistics counted) barely
depends on how loaded the machine is, unlike throughput, so it can judge a hot-path change on a busy machine.
It is given for the server process alone and for its whole tree (Python workers included), beside the requests
per second of each run (perf_analyzer's start-up included, so only the ratio means much). Prints medians.

    .venv/bin/python benchmarks/bench_cpu_per_request.py --a /tmp/before/src --b src --requests 3000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.perf_analyzer import PerfAnalyzer, install_perf_analyzer  # noqa: E402
from tests.perf_analyzer_models import ADD_SUB, ADD_SUB_BATCHED, build_perf_analyzer_repository  # noqa: E402
from tests.servers import RunningServer, start_nereid  # noqa: E402


def _cpu(server: RunningServer) -> tuple[float, float]:
    """CPU seconds of the server process, and of it with every process it started."""
    root = psutil.Process(server.process.pid)
    own = sum(root.cpu_times()[:2])
    tree = own
    for child in root.children(recursive=True):
        try:
            tree += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return own, tree


def _count(server: RunningServer, model: str) -> int:
    stats = requests.get(f"{server.base}/v2/models/{model}/stats", timeout=10).json()
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats["model_stats"])


def _run(
    analyzer: PerfAnalyzer, server: RunningServer, model: str, protocol: str, concurrency: int, n: int
) -> tuple[float, float, float]:
    """CPU µs per request of the server and of its tree, and the requests per second of the whole run."""
    url = server.http_url if protocol == "http" else server.grpc_url
    own0, tree0 = _cpu(server)
    count0 = _count(server, model)
    started = time.perf_counter()
    done = analyzer.run(
        "-m", model, "-i", protocol, "-u", url, "--concurrency-range", str(concurrency),
        "--measurement-mode", "count_windows", "--measurement-request-count", str(n),
        "--max-trials", "1", "--stability-percentage", "999", timeout=600,
    )  # fmt: skip
    # One window is never "stable" to perf_analyzer; the figures here come from the server's side anyway.
    if done.returncode != 0 and "Failed to obtain stable measurement" not in done.stdout + done.stderr:
        raise RuntimeError(done.stdout + done.stderr)
    elapsed = time.perf_counter() - started  # perf_analyzer's start-up included: read throughput as a ratio
    own1, tree1 = _cpu(server)
    count = _count(server, model) - count0
    return (own1 - own0) / count * 1e6, (tree1 - tree0) / count * 1e6, count / elapsed


def _start(src: Path, repo: Path) -> RunningServer:
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(src.resolve())
    try:
        return start_nereid(repo, "--log-verbose=0")
    finally:
        if previous is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = previous


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", type=Path, required=True, help="the src folder of the code before")
    parser.add_argument("--b", type=Path, required=True, help="the src folder of the code after")
    parser.add_argument("--requests", type=int, default=3000, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--protocols", nargs="+", default=["http", "grpc"], choices=["http", "grpc"])
    parser.add_argument("--batched", action="store_true", help="the dynamic-batching add_sub instead of the plain one")
    args = parser.parse_args()
    model = ADD_SUB_BATCHED if args.batched else ADD_SUB
    analyzer = install_perf_analyzer()
    results: dict[tuple[str, int, str], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        repo = build_perf_analyzer_repository(Path(tmp) / "repo")
        servers = {"A": _start(args.a, repo), "B": _start(args.b, repo)}
        try:
            for server in servers.values():  # warm-up
                for protocol in args.protocols:
                    _run(analyzer, server, model, protocol, 4, 300)
            flip = False
            for _ in range(args.rounds):
                for protocol in args.protocols:
                    for concurrency in args.concurrency:
                        order = list(servers.items())
                        if flip:
                            order.reverse()
                        flip = not flip
                        for name, server in order:
                            cell = _run(analyzer, server, model, protocol, concurrency, args.requests)
                            results.setdefault((protocol, concurrency, name), []).append(cell)
        finally:
            for server in servers.values():
                server.stop()
    print(f"\n{model}, {args.requests} requests x {args.rounds} rounds, medians (µs of CPU per request; req/s)\n")
    print("| protocol | c | A server | B server | B/A | A tree | B tree | B/A tree | B server runs | A req/s | B req/s | B/A |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for protocol in args.protocols:
        for concurrency in args.concurrency:
            a = results[(protocol, concurrency, "A")]
            b = results[(protocol, concurrency, "B")]
            a_own, b_own = statistics.median(x[0] for x in a), statistics.median(x[0] for x in b)
            a_tree, b_tree = statistics.median(x[1] for x in a), statistics.median(x[1] for x in b)
            a_rate, b_rate = statistics.median(x[2] for x in a), statistics.median(x[2] for x in b)
            runs = " ".join(f"{x[0]:.0f}" for x in b)
            print(
                f"| {protocol} | {concurrency} | {a_own:.0f} | {b_own:.0f} | {b_own / a_own:.2f} | {a_tree:.0f} "
                f"| {b_tree:.0f} | {b_tree / a_tree:.2f} | {runs} | {a_rate:,.0f} | {b_rate:,.0f} | {b_rate / a_rate:.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
