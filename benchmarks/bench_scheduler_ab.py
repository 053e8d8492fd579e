"""The dynamic batcher's own cost per request, A/B between two source trees in one run: an in-process
BatchingScheduler over an instance that answers at once, driven by closed-loop clients, with the two trees
measured in alternating subprocesses. Measures the scheduler only (no transport, no model).

    .venv/bin/python benchmarks/bench_scheduler_ab.py --base REV [--seconds 2] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (label, dynamic_batching body, max_batch_size, clients)
CASES = (
    ("no batching, c=1", "", 0, 1),
    ("dynamic, c=16", "dynamic_batching { }", 8, 16),
    ("preferred [4, 8], c=16", "dynamic_batching { preferred_batch_size: [ 4, 8 ] }", 8, 16),
    ("dynamic, c=64", "dynamic_batching { }", 64, 64),
)


def _measure(batching: str, max_batch_size: int, clients: int, seconds: float) -> float:
    """Requests per CPU second through one scheduler (imported from whatever tree is first on sys.path): CPU
    time, not wall time, so that other work on a shared machine changes the figure less."""
    import numpy as np

    from nereid.backends.base import ExecutionTimes
    from nereid.config.model_config import parse_pbtxt
    from nereid.core.statistics import ModelStatistics
    from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor
    from nereid.scheduling.dynamic_batcher import BatchingScheduler

    class Instant:
        name = "m_0"

        async def execute(self, requests: list[InferenceRequest]) -> tuple[list[InferenceResponse], ExecutionTimes]:
            await asyncio.sleep(0)  # a real backend yields to the loop while it executes
            return [InferenceResponse(r.model_name, "1", r.id) for r in requests], ExecutionTimes()

        async def close(self) -> None:
            pass

    config = parse_pbtxt(
        f'name: "m" backend: "python" max_batch_size: {max_batch_size} '
        f'input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ] {batching}',
        "m",
    )
    data = np.zeros((1, 4), np.float32)
    shape = (1, 4) if max_batch_size else (4,)

    async def run() -> float:
        scheduler = BatchingScheduler(config, [Instant()], ModelStatistics("m", "1"))  # type: ignore[list-item]
        loop = asyncio.get_running_loop()
        done = 0
        deadline = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                future: asyncio.Future[InferenceResponse] = loop.create_future()
                request = InferenceRequest("m", "", [InputTensor("X", "FP32", shape, data)])
                request.respond = future.set_result
                scheduler.submit(request)
                await future
                done += 1

        start = time.process_time()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.process_time() - start
        await scheduler.close()
        return done / elapsed

    return asyncio.run(run())


def _worker(seconds: float) -> None:
    print(json.dumps([_measure(batching, mbs, clients, seconds) for _, batching, mbs, clients in CASES]))


def _run_tree(src: Path, seconds: float) -> list[float]:
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{ROOT}"}
    out = subprocess.run(
        [sys.executable, __file__, "--worker", "--seconds", str(seconds)],
        env=env, check=True, capture_output=True, text=True, timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _extract(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", help="the git revision to compare this tree against")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.seconds)
        return
    if not args.base:
        parser.error("--base is required")
    results: dict[str, list[list[float]]] = {"base": [], "this tree": []}
    with tempfile.TemporaryDirectory(prefix="bench-sched-") as tmp:
        trees = {"base": _extract(args.base, Path(tmp)), "this tree": ROOT / "src"}
        for round_index in range(args.rounds):
            order = list(trees) if round_index % 2 == 0 else list(reversed(trees))  # alternate who goes first
            for name in order:
                results[name].append(_run_tree(trees[name], args.seconds))
    lines = [
        f"Dynamic batcher in-process, {args.rounds} alternating rounds of {args.seconds:g} s per case, "
        f"base {args.base} against this tree (median requests per CPU second; a shared, loaded machine: read ratios, not levels).",
        "",
        "| case | base req/CPU-s | this tree req/CPU-s | ratio | base CPU µs/req | this tree CPU µs/req |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for index, (label, *_rest) in enumerate(CASES):
        base = statistics.median(r[index] for r in results["base"])
        new = statistics.median(r[index] for r in results["this tree"])
        lines.append(f"| {label} | {base:,.0f} | {new:,.0f} | {new / base:.3f} | {1e6 / base:.1f} | {1e6 / new:.1f} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
