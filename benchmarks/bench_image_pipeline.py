"""An image pipeline as one server-side ensemble (issue 42, deployment 3): JPEG decode and resize to 320x320
(Python model), DETR with a ResNet-50 backbone (ONNX Runtime, random weights), then labelled boxes (Python model).

Three ways, each with `--clients` threads sending one 640x480 JPEG at a time for `--seconds`:
- the ensemble `detect`: one request per image (tritonclient HTTP, binary tensors);
- the client making the three calls itself: decode, detector, labels, passing the tensors back and forth;
- in-process: the same three functions called in this Python process (no server), the better of one thread and
  `--clients` threads: the limit the ensemble is set against.

Real Triton 2.51 serves the same repository both ways, with the detector's ONNX Runtime session in a Python-backend
model (its ONNX Runtime backend does not ship on PyPI).

    .venv/bin/python benchmarks/bench_image_pipeline.py                 # 4 clients, 30 s per way
    .venv/bin/python benchmarks/bench_image_pipeline.py --seconds 5     # smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import start_nereid, start_real_triton  # noqa: E402

from benchmarks import triton_python  # noqa: E402
from benchmarks.image_api.imaging import decode, sample_jpeg  # noqa: E402
from benchmarks.image_pipeline import repository  # noqa: E402
from benchmarks.image_pipeline.detector import SIZE, export_detr  # noqa: E402
from benchmarks.image_pipeline.labels import detections  # noqa: E402
from benchmarks.report import publish  # noqa: E402

OUT = ROOT / "benchmarks" / "out" / "image_pipeline"
RESULTS = ROOT / "benchmarks" / "results" / "image_pipeline.md"


@dataclass
class Measured:
    images_per_s: float
    p50_ms: float
    p99_ms: float
    threads: int


def _drive(make_call: Callable[[], Callable[[], None]], threads: int, seconds: float) -> Measured:
    """`threads` loops, each with its own call (its own client), for `seconds` after one warm-up call each."""
    latencies: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def loop() -> None:
        call = make_call()
        call()
        start.wait()
        mine = []
        while not stop.is_set():
            began = time.perf_counter()
            call()
            mine.append(time.perf_counter() - began)
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    ms = np.array(latencies) * 1000
    return Measured(len(latencies) / elapsed, float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), threads)


def _client_calls(url: str, jpeg: bytes, ensemble: bool) -> Callable[[], Callable[[], None]]:
    import tritonclient.http as http

    def make() -> Callable[[], None]:
        client = http.InferenceServerClient(url, network_timeout=300, connection_timeout=300)
        image = http.InferInput("IMAGE", [1, 1], "BYTES")
        image.set_data_from_numpy(np.array([[jpeg]], dtype=object), binary_data=True)

        def tensor(name: str, array: np.ndarray) -> http.InferInput:
            item = http.InferInput(name, list(array.shape), "FP32")
            item.set_data_from_numpy(array, binary_data=True)
            return item

        def outputs(*names: str) -> list[http.InferRequestedOutput]:
            return [http.InferRequestedOutput(n, binary_data=True) for n in names]

        def one_request() -> None:
            client.infer("detect", [image], outputs=outputs("DETECTIONS")).as_numpy("DETECTIONS")

        def three_calls() -> None:
            pixels = client.infer("decode", [image], outputs=outputs("PIXELS")).as_numpy("PIXELS")
            found = client.infer("detector", [tensor("PIXELS", pixels)], outputs=outputs("LOGITS", "BOXES"))
            logits, boxes = found.as_numpy("LOGITS"), found.as_numpy("BOXES")
            client.infer(
                "labels", [tensor("LOGITS", logits), tensor("BOXES", boxes)], outputs=outputs("DETECTIONS")
            ).as_numpy("DETECTIONS")

        return one_request if ensemble else three_calls

    return make


def _in_process(onnx: Path, jpeg: bytes) -> Callable[[], Callable[[], None]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])

    def make() -> Callable[[], None]:
        def pipeline() -> None:
            pixels = decode(jpeg, SIZE)[None]
            logits, boxes = session.run(None, {"PIXELS": pixels})
            detections(logits, boxes)

        return pipeline

    return make


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    onnx = export_detr(OUT / "detr_resnet50.onnx")
    jpeg = sample_jpeg()
    started = time.time()
    rows: list[tuple[str, Measured]] = []
    for threads in sorted({1, args.clients}):
        measured = _drive(_in_process(onnx, jpeg), threads, args.seconds)
        print(
            f"in-process, {threads} thread(s): {measured.images_per_s:.2f} images/s p99 {measured.p99_ms:.0f} ms",
            flush=True,
        )
        rows.append(("in-process pipeline", measured))
    with tempfile.TemporaryDirectory(prefix="bench-image-pipeline-") as tmp:
        for server_name in ("Nereid", "Triton 2.51 (Python backend)"):
            if server_name == "Nereid":
                server = start_nereid(repository.build(Path(tmp) / "repo", onnx), "--log-verbose=0", timeout=300)
            else:
                triton_python.ensure_packages("onnxruntime", "pillow", imports="onnxruntime, PIL")
                repo = repository.build(Path(tmp) / "triton-repo", onnx, python_detector=True)
                server = start_real_triton(repo, timeout=300)
            try:
                url = f"127.0.0.1:{server.http_port}"
                for label, ensemble in (
                    (f"{server_name} ensemble (one request)", True),
                    (f"{server_name}, the client's three calls", False),
                ):
                    measured = _drive(_client_calls(url, jpeg, ensemble), args.clients, args.seconds)
                    print(f"{label}: {measured.images_per_s:.2f} images/s p99 {measured.p99_ms:.0f} ms", flush=True)
                    rows.append((label, measured))
            finally:
                server.stop()
    limit = max(m.images_per_s for label, m in rows if label == "in-process pipeline")
    lines = [
        "# Image pipeline: JPEG decode, DETR (ResNet-50), labels as one ensemble, against the same steps in one process",
        "",
        f"`benchmarks/bench_image_pipeline.py --clients {args.clients} --seconds {args.seconds:g}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {os.cpu_count()} CPUs; 640x480 JPEGs resized to "
        f"{SIZE}x{SIZE}; tritonclient HTTP with binary tensors, {args.clients} client threads. The limit is the better "
        "in-process row.",
        "",
        "| way | threads | images/s | p50 ms | p99 ms | of the in-process limit |",
        "|---|---|---|---|---|---|",
    ]
    for label, m in rows:
        lines.append(
            f"| {label} | {m.threads} | {m.images_per_s:.2f} | {m.p50_ms:.0f} | {m.p99_ms:.0f} | {m.images_per_s / limit:.2f} |"
        )
    publish(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
