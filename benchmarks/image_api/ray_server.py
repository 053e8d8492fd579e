"""ResNet-50 behind Ray Serve with `@serve.batch`, as a Ray user writes it: raw float32 bytes POSTed to /binary,
JPEG bytes to /jpeg, decoded in the batch handler; the logits come back as raw bytes.

    python -m benchmarks.image_api.ray_server MODEL.onnx PORT MAX_ONGOING_REQUESTS
"""

from __future__ import annotations

import sys
import time

import numpy as np
import onnxruntime as ort
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from benchmarks.image_api.batch_log import record_batch
from benchmarks.image_api.imaging import decode
from benchmarks.image_api.nereid_repository import MAX_BATCH


def main() -> None:
    onnx, port, max_ongoing = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    @serve.deployment(max_ongoing_requests=max_ongoing)
    class ResNet:
        def __init__(self) -> None:
            self.session = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])

        @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=0.002)
        async def infer(self, items: list[tuple[str, bytes]]) -> list[bytes]:
            batch = np.stack(
                [
                    decode(body) if kind == "jpeg" else np.frombuffer(body, np.float32).reshape(3, 224, 224)
                    for kind, body in items
                ]
            )
            record_batch(len(items))
            logits = self.session.run(None, {"INPUT": batch})[0]
            return [row.tobytes() for row in logits]

        async def __call__(self, request: Request) -> Response:
            kind = "jpeg" if request.url.path.rstrip("/").endswith("jpeg") else "binary"
            return Response(await self.infer((kind, await request.body())), media_type="application/octet-stream")

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(ResNet.bind(), route_prefix="/")
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
