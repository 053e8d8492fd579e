"""ResNet-50 behind LitServe with its batching, as a LitServe user writes it: a JSON body with the tensor's raw
float32 bytes or the JPEG in base64 (LitServe decodes a request as JSON or a form), decoded per request in its
worker; the logits come back base64 in JSON.

    python -m benchmarks.image_api.litserve_server MODEL.onnx PORT
"""

from __future__ import annotations

import base64
import sys
from typing import Any

import litserve as ls
import numpy as np
import onnxruntime as ort

from benchmarks.image_api.batch_log import record_batch
from benchmarks.image_api.imaging import decode
from benchmarks.image_api.nereid_repository import MAX_BATCH


class ResNetAPI(ls.LitAPI):
    def __init__(self, onnx: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.onnx = onnx

    def setup(self, device: str) -> None:
        self.session = ort.InferenceSession(self.onnx, providers=["CPUExecutionProvider"])

    def decode_request(self, request: dict[str, str]) -> np.ndarray:
        body = base64.b64decode(request["data"])
        return decode(body) if request.get("kind") == "jpeg" else np.frombuffer(body, np.float32).reshape(3, 224, 224)

    def batch(self, inputs: list[np.ndarray]) -> np.ndarray:
        return np.stack(inputs)

    def predict(self, batch: np.ndarray) -> np.ndarray:
        record_batch(len(batch))
        return self.session.run(None, {"INPUT": batch})[0]

    def unbatch(self, output: np.ndarray) -> list[np.ndarray]:
        return list(output)

    def encode_response(self, output: np.ndarray) -> dict[str, str]:
        return {"logits": base64.b64encode(output.tobytes()).decode()}


def main() -> None:
    onnx, port = sys.argv[1], int(sys.argv[2])
    api = ResNetAPI(onnx, max_batch_size=MAX_BATCH, batch_timeout=0.002)
    ls.LitServer(api, accelerator="cpu", workers_per_device=1).run(
        port=port, host="127.0.0.1", generate_client_file=False
    )


if __name__ == "__main__":
    main()
