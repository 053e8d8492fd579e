"""Issue 6 benchmark: what the server adds to a TorchScript model. The same scripted MLP (256 -> 512 -> 512 -> 16,
FP32) is timed called in-process by torch and served by Nereid's pytorch backend (gRPC through h2load, HTTP
binary through wrk): at concurrency 1 the difference in median latency is the server's own cost per request;
at concurrency 16 dynamic batching has to earn back that cost.

    .venv/bin/python benchmarks/bench_pytorch.py [--seconds 10] [--out benchmarks/results/pytorch.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import start_nereid  # noqa: E402

from benchmarks.loadgen import LoadResult, grpc_body, http_binary_body, require_tools, run_h2load, run_wrk  # noqa: E402

SIZES = (256, 512, 512, 16)
CONFIG = """
name: "{name}"
backend: "pytorch"
max_batch_size: 64
input [{{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {inputs} ] }}]
output [{{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {outputs} ] }}]
instance_group [{{ count: 1 kind: KIND_CPU }}]
parameters {{ key: "INTRA_OP_THREAD_COUNT" value {{ string_value: "1" }} }}
parameters {{ key: "DISABLE_OPTIMIZED_EXECUTION" value {{ string_value: "true" }} }}
{batching}
"""
# DISABLE_OPTIMIZED_EXECUTION, as Triton's PyTorch backend documents it: dynamic batching gives TorchScript a
# new batch size at almost every call, and its profiling executor re-specialises for each one (measured here:
# about half the batched throughput with it on; batch 1 alone is the same either way).


def build(path: Path) -> object:
    import torch

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for a, b in zip(SIZES, SIZES[1:], strict=False):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    module = torch.jit.script(torch.nn.Sequential(*layers[:-1]).eval())
    path.parent.mkdir(parents=True, exist_ok=True)
    module.save(str(path))
    return module


def in_process(module: object, rows: np.ndarray, seconds: float) -> float:
    """Median seconds per call of the module on `rows`, one thread, inference mode."""
    import torch

    torch.set_num_threads(1)
    tensor = torch.from_numpy(rows)
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    with torch.inference_mode():
        module(tensor)  # type: ignore[operator]
        while time.perf_counter() < deadline or len(samples) < 20:
            t0 = time.perf_counter()
            module(tensor)  # type: ignore[operator]
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "pytorch.md")
    args = parser.parse_args()
    require_tools()
    rng = np.random.default_rng(0)
    one = rng.standard_normal((1, SIZES[0])).astype(np.float32)
    sixteen = rng.standard_normal((16, SIZES[0])).astype(np.float32)
    rows: list[tuple[str, str, int, LoadResult]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        repo = Path(tmp_name)
        module = None
        for name, batching in (("mlp", ""), ("mlp_batched", "dynamic_batching { max_queue_delay_microseconds: 200 }")):
            module = build(repo / name / "1" / "model.pt")
            (repo / name / "config.pbtxt").write_text(
                CONFIG.format(name=name, inputs=SIZES[0], outputs=SIZES[-1], batching=batching)
            )
        torch_one = in_process(module, one, min(args.seconds, 3.0))
        torch_sixteen = in_process(module, sixteen, min(args.seconds, 3.0))
        server = start_nereid(repo, "--log-info=false", log_dir=repo)
        try:
            for model, concurrency in (("mlp", 1), ("mlp_batched", 16)):
                grpc = grpc_body(model, {"INPUT__0": one})
                rows.append((model, "gRPC", concurrency, run_h2load(server.grpc_url, "/inference.GRPCInferenceService/ModelInfer",
                                                                     grpc, concurrency, args.seconds)))
                body, headers = http_binary_body({"INPUT__0": one}, ["OUTPUT__0"])
                rows.append((model, "HTTP binary", concurrency,
                             run_wrk(f"{server.base}/v2/models/{model}/infer", body, headers, concurrency, args.seconds)))
        finally:
            server.stop()
    lines = [
        f"TorchScript MLP {'→'.join(map(str, SIZES))} FP32, batch 1 per request, one instance, INTRA_OP_THREAD_COUNT 1, DISABLE_OPTIMIZED_EXECUTION; "
        f"{args.seconds:.0f} s per cell on the same 2-core machine as the load generator.",
        "",
        f"torch in-process, one thread: batch 1 median {torch_one * 1e6:.0f} µs per call "
        f"({1 / torch_one:,.0f} calls/s); batch 16 median {torch_sixteen * 1e6:.0f} µs ({16 / torch_sixteen:,.0f} rows/s).",
        "",
        "| model | route | concurrency | requests/s | p50 ms | p99 ms | server cost per request (p50 − torch) | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for model, route, concurrency, r in rows:
        cost = f"{(r.p50_ms / 1000 - torch_one) * 1e6:.0f} µs" if concurrency == 1 else "-"
        lines.append(f"| {model} | {route} | {concurrency} | {r.requests_per_s:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {cost} | {r.errors} |")
    table = "\n".join(lines) + "\n"
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("# PyTorch backend benchmark (`benchmarks/bench_pytorch.py`)\n\n" + table)


if __name__ == "__main__":
    main()
