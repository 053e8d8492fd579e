"""Issue 2 benchmark: the `simple` add/sub ONNX model over HTTP JSON, HTTP binary and gRPC at concurrency
1, 16 and 64, beside onnxruntime called in-process on the same inputs (the server's own cost per request).

    .venv/bin/python benchmarks/bench_core.py [--seconds 8] [--out benchmarks/results/core.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import start_nereid  # noqa: E402

from benchmarks.loadgen import (  # noqa: E402
    LoadResult,
    grpc_body,
    http_binary_body,
    http_json_body,
    require_tools,
    run_h2load,
    run_wrk,
)

REPO = ROOT / "examples" / "model_repository"
CONCURRENCY = (1, 16, 64)


def in_process(inputs: dict[str, np.ndarray], seconds: float) -> LoadResult:
    """One onnxruntime session called in a loop on one thread: the floor under any server."""
    session = ort.InferenceSession(str(REPO / "simple" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        session.run(None, inputs)
        times.append(time.perf_counter() - start)
    ms = np.array(times) * 1000
    return LoadResult(len(times) / sum(times), float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "core.md")
    args = parser.parse_args()
    require_tools()
    inputs = {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16), "INPUT1": np.ones((1, 16), dtype=np.int32)}
    server = start_nereid(REPO, "--log-info=false")
    rows: list[tuple[str, int, LoadResult]] = []
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        grpc_inputs = [grpcclient.InferInput(n, list(a.shape), "INT32") for n, a in inputs.items()]
        for tensor, array in zip(grpc_inputs, inputs.values()):
            tensor.set_data_from_numpy(array)
        assert (client.infer("simple", grpc_inputs).as_numpy("OUTPUT0") == inputs["INPUT0"] + 1).all()
        url = f"http://{server.http_url}/v2/models/simple/infer"
        json_body, json_headers = http_json_body(inputs)
        bin_body, bin_headers = http_binary_body(inputs, ["OUTPUT0", "OUTPUT1"])
        g_body = grpc_body("simple", inputs)
        for c in CONCURRENCY:
            rows.append(("HTTP JSON", c, run_wrk(url, json_body, json_headers, c, args.seconds)))
            rows.append(("HTTP binary", c, run_wrk(url, bin_body, bin_headers, c, args.seconds)))
            rows.append(("gRPC", c, run_h2load(server.grpc_url, "/inference.GRPCInferenceService/ModelInfer", g_body, c, args.seconds)))
    finally:
        server.stop()
    rows.append(("onnxruntime in-process", 1, in_process(inputs, args.seconds)))
    floor = rows[-1][2]
    lines = [
        "| route | concurrency | requests/s | p50 ms | p99 ms | errors | server cost per request (µs) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for route, c, r in rows:
        cost = (1e6 / r.requests_per_s - 1e6 / floor.requests_per_s) if route != "onnxruntime in-process" else 0.0
        lines.append(f"| {route} | {c} | {r.requests_per_s:.0f} | {r.p50_ms:.3f} | {r.p99_ms:.3f} | {r.errors} | {cost:.0f} |")
    table = "\n".join(lines)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        "# Core server benchmark (`benchmarks/bench_core.py`)\n\n"
        f"`simple` add/sub ONNX model (INT32 [1,16]), {args.seconds:.0f} s per cell, wrk (HTTP) and h2load (gRPC) on the "
        "same 2-core machine as the server. Server cost = 1/throughput minus onnxruntime's own time per call.\n\n"
        + table
        + "\n"
    )


if __name__ == "__main__":
    main()
