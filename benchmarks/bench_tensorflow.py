"""Issue 43 benchmark: what serving a TensorFlow SavedModel through Nereid costs against TensorFlow in-process. The
same MLP (256 -> 1024 -> 1024 -> 16 FP32, about 5 MB of weights) answers requests of 1 and of 32 rows at
concurrency 16: in-process as 16 threads calling it (through a session callable, the way the backend runs it, and
through the signature's concrete function, the TF2 way), served over gRPC (h2load) and HTTP binary (wrk) with
dynamic batching. Ratio = served rows/s over the best in-process rows/s.

    .venv/bin/python benchmarks/bench_tensorflow.py [--seconds 10] [--out benchmarks/results/tensorflow.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.tensorflow_models import mlp_savedmodel  # noqa: E402
from tests.servers import start_nereid  # noqa: E402

from benchmarks.loadgen import LoadResult, grpc_body, http_binary_body, require_tools, run_h2load, run_wrk  # noqa: E402

SIZES = (256, 1024, 1024, 16)
CONCURRENCY = 16
BATCHES = (1, 32)
CONFIG = """
backend: "tensorflow"
max_batch_size: 512
dynamic_batching {}
instance_group [{ count: 1 kind: KIND_CPU }]
"""


def _threads_rows_per_s(call: Callable[[], Any], rows: int, threads: int, seconds: float) -> float:
    """Rows per second of `threads` threads calling `call` (each call `rows` rows) for `seconds`."""
    call()
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def worker(index: int) -> None:
        while time.perf_counter() < stop:
            call()
            counts[index] += 1

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts) * rows / (time.perf_counter() - start)


def in_process(path: Path, seconds: float) -> dict[tuple[str, int], float]:
    """Rows/s in-process for each (way, batch): session callable and concrete function, CONCURRENCY threads."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    function = tf.saved_model.load(str(path)).signatures["serving_default"]
    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph)
    with graph.as_default():
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(path))
    signature = meta.signature_def["serving_default"]
    callable_ = session.make_callable([signature.outputs["y"].name], [signature.inputs["x"].name])
    rng = np.random.default_rng(0)
    results: dict[tuple[str, int], float] = {}
    for batch in BATCHES:
        x = rng.standard_normal((batch, SIZES[0])).astype(np.float32)
        results[("session", batch)] = _threads_rows_per_s(lambda x=x: callable_(x), batch, CONCURRENCY, seconds)  # type: ignore[misc]
        results[("function", batch)] = _threads_rows_per_s(
            lambda x=x: function(x=tf.constant(x))["y"].numpy(), batch, CONCURRENCY, seconds  # type: ignore[misc]
        )
    session.close()
    return results


def served(repo: Path, seconds: float) -> dict[tuple[str, int], LoadResult]:
    server = start_nereid(repo, "--log-info=false", log_dir=repo)
    results: dict[tuple[str, int], LoadResult] = {}
    rng = np.random.default_rng(0)
    try:
        for batch in BATCHES:
            x = rng.standard_normal((batch, SIZES[0])).astype(np.float32)
            results[("gRPC", batch)] = run_h2load(
                server.grpc_url, "/inference.GRPCInferenceService/ModelInfer", grpc_body("mlp", {"x": x}), CONCURRENCY, seconds
            )
            body, headers = http_binary_body({"x": x}, ["y"])
            results[("HTTP binary", batch)] = run_wrk(f"{server.base}/v2/models/mlp/infer", body, headers, CONCURRENCY, seconds)
    finally:
        server.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "tensorflow.md")
    parser.add_argument("--note", default="", help="a line saying under what conditions this run was made")
    args = parser.parse_args()
    require_tools()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        mlp_savedmodel(repo / "mlp" / "1" / "model.savedmodel", SIZES)
        (repo / "mlp" / "config.pbtxt").write_text(CONFIG)
        local = in_process(repo / "mlp" / "1" / "model.savedmodel", args.seconds)
        remote = served(repo, args.seconds)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Run: {when} on {platform.node()} ({os.cpu_count()} CPUs, {platform.processor() or platform.machine()}), "
        f"{args.seconds:.0f} s per cell, load generator on the same machine. {args.note}".rstrip(),
        "",
        f"SavedModel MLP {'→'.join(map(str, SIZES))} FP32, tensorflow-cpu, TensorFlow's default thread pools; "
        f"concurrency {CONCURRENCY}; served: one instance, max_batch_size 512, dynamic batching without delay.",
        "",
        "| rows per request | in-process session (rows/s) | in-process concrete function (rows/s) | route | served (rows/s) | "
        "served p50 ms | served p99 ms | ratio served / best in-process | errors |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for batch in BATCHES:
        best = max(local[("session", batch)], local[("function", batch)])
        for route in ("gRPC", "HTTP binary"):
            r = remote[(route, batch)]
            rows_per_s = r.requests_per_s * batch
            lines.append(
                f"| {batch} | {local[('session', batch)]:,.0f} | {local[('function', batch)]:,.0f} | {route} | "
                f"{rows_per_s:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {rows_per_s / best:.2f} | {r.errors} |"
            )
    table = "\n".join(lines) + "\n"
    print(table)
    previous = args.out.read_text() if args.out.exists() else ""
    history = previous.split("\n", 2)[2] if previous.startswith("# ") else ""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        "# TensorFlow backend benchmark (`benchmarks/bench_tensorflow.py`)\n\n" + table
        + ("\n## Earlier runs\n\n" + history.replace("## Earlier runs\n\n", "") if history.strip() else "")
    )


if __name__ == "__main__":
    main()
