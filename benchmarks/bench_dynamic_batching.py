"""Issue 4 headline benchmark: the Python-backend add_sub model (FP32 [4], max_batch_size 64) with
dynamic_batching { max_queue_delay_microseconds: 100 } on Nereid and on real Triton, same repository, same
run, alternating server by server: HTTP JSON through wrk and gRPC through h2load at concurrency 1, 16, 64.

    .venv/bin/python benchmarks/bench_dynamic_batching.py [--seconds 10] [--out benchmarks/results/dynamic_batching.md]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import RunningServer, start_nereid, start_real_triton  # noqa: E402

from benchmarks.loadgen import LoadResult, grpc_body, http_json_body, require_tools, run_h2load, run_wrk  # noqa: E402

MODEL = "add_sub_python"


def _repository(directory: Path) -> Path:
    target = directory / MODEL
    shutil.copytree(ROOT / "examples" / "model_repository" / MODEL, target)
    config = (target / "config.pbtxt").read_text()
    (target / "config.pbtxt").write_text(config + "\ndynamic_batching { max_queue_delay_microseconds: 100 }\n")
    return directory


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dynamic_batching.md")
    args = parser.parse_args()
    require_tools()
    inputs = {"INPUT0": np.array([[1, 2, 3, 4]], dtype=np.float32), "INPUT1": np.array([[0.5] * 4], dtype=np.float32)}
    json_body, json_headers = http_json_body(inputs)
    g_body = grpc_body(MODEL, inputs)
    rows: list[tuple[str, int, LoadResult, LoadResult]] = []
    with tempfile.TemporaryDirectory(prefix="bench-db-") as tmp:
        repo = _repository(Path(tmp))
        servers: dict[str, RunningServer] = {}
        try:
            servers["nereid"] = start_nereid(repo, "--log-info=false")
            servers["triton"] = start_real_triton(repo, "--log-info=false")
            for server in servers.values():  # warm both up the same way
                run_wrk(f"{server.base}/v2/models/{MODEL}/infer", json_body, json_headers, 16, 2)
            for route in ("HTTP JSON", "gRPC"):
                for c in args.concurrency:
                    results: dict[str, LoadResult] = {}
                    for name, server in servers.items():
                        if route == "HTTP JSON":
                            url = f"{server.base}/v2/models/{MODEL}/infer"
                            results[name] = run_wrk(url, json_body, json_headers, c, args.seconds)
                        else:
                            path = "/inference.GRPCInferenceService/ModelInfer"
                            results[name] = run_h2load(server.grpc_url, path, g_body, c, args.seconds)
                    rows.append((route, c, results["nereid"], results["triton"]))
                    print(route, c, results["nereid"].row(), results["triton"].row(), flush=True)
        finally:
            for server in servers.values():
                server.stop()
    lines = [
        "| route | c | Nereid req/s | Triton req/s | throughput ratio | Nereid p50 ms | Triton p50 ms | Nereid p99 ms | Triton p99 ms | p99 ratio | errors (N/T) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for route, c, n, t in rows:
        lines.append(
            f"| {route} | {c} | {n.requests_per_s:.0f} | {t.requests_per_s:.0f} | {n.requests_per_s / t.requests_per_s:.2f}x | "
            f"{n.p50_ms:.2f} | {t.p50_ms:.2f} | {n.p99_ms:.2f} | {t.p99_ms:.2f} | {n.p99_ms / t.p99_ms:.2f}x | {n.errors}/{t.errors} |"
        )
    table = "\n".join(lines)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        "# Dynamic batching: Python-backend add_sub, Nereid vs real Triton (`benchmarks/bench_dynamic_batching.py`)\n\n"
        f"FP32 [1,4] inputs, max_batch_size 64, one instance, max_queue_delay 100 µs; {args.seconds:.0f} s per cell; "
        "wrk (HTTP JSON) and h2load (gRPC, one stream per connection) on the same 2-core machine as the servers.\n\n"
        + table
        + "\n"
    )


if __name__ == "__main__":
    main()
