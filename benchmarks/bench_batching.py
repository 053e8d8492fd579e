"""Issue 4 benchmark 2: an ONNX MLP (256 -> 1024 -> 1024 -> 16, FP32) at concurrency 32, with dynamic
batching on and off, through gRPC (h2load) and HTTP binary (wrk). Target: at least 3x throughput on.

    .venv/bin/python benchmarks/bench_batching.py [--seconds 10] [--out benchmarks/results/batching.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.build_models import mlp  # noqa: E402
from tests.servers import start_nereid  # noqa: E402

from benchmarks.loadgen import LoadResult, grpc_body, http_binary_body, require_tools, run_h2load, run_wrk  # noqa: E402

CONFIG = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: 64
input [ {{ name: "input" data_type: TYPE_FP32 dims: [ 256 ] }} ]
output [ {{ name: "probabilities" data_type: TYPE_FP32 dims: [ 16 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
{batching}
"""


def build(repo: Path) -> None:
    for name, batching in (("mlp_batched", "dynamic_batching { max_queue_delay_microseconds: 500 }"), ("mlp_unbatched", "")):
        mlp(repo / name / "1" / "model.onnx", sizes=(256, 1024, 1024, 16))
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, batching=batching))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "batching.md")
    args = parser.parse_args()
    require_tools()
    rows: list[tuple[str, str, LoadResult]] = []
    inputs = {"input": np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        build(repo)
        server = start_nereid(repo, "--log-info=false")
        try:
            for name in ("mlp_unbatched", "mlp_batched"):
                label = "on" if name == "mlp_batched" else "off"
                g = run_h2load(server.grpc_url, "/inference.GRPCInferenceService/ModelInfer", grpc_body(name, inputs), args.concurrency, args.seconds)
                rows.append(("gRPC", label, g))
                body, headers = http_binary_body(inputs, ["probabilities"])
                h = run_wrk(f"http://{server.http_url}/v2/models/{name}/infer", body, headers, args.concurrency, args.seconds)
                rows.append(("HTTP binary", label, h))
        finally:
            server.stop()
    lines = [
        "| route | dynamic batching | requests/s | p50 ms | p99 ms | errors |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for route, label, r in rows:
        lines.append(f"| {route} | {label} | {r.requests_per_s:.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.errors} |")
    ratios = []
    for route in ("gRPC", "HTTP binary"):
        off = next(r for ro, la, r in rows if ro == route and la == "off")
        on = next(r for ro, la, r in rows if ro == route and la == "on")
        ratios.append(f"| {route} | {on.requests_per_s / off.requests_per_s:.2f}x | {on.p99_ms / off.p99_ms:.2f}x |")
    table = "\n".join(lines) + "\n\n| route | throughput on/off | p99 on/off |\n|---|---:|---:|\n" + "\n".join(ratios)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        "# Dynamic batching benchmark (`benchmarks/bench_batching.py`)\n\n"
        f"ONNX MLP 256→1024→1024→16 FP32, one instance (intra_op_thread_count 1), max_batch_size 64, "
        f"max_queue_delay 500 µs when on; concurrency {args.concurrency}, {args.seconds:.0f} s per cell, "
        "load from h2load (gRPC) and wrk (HTTP binary) on the same 2-core machine.\n\n" + table + "\n"
    )


if __name__ == "__main__":
    main()
