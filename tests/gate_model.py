"""A Python model that holds each execution until a file (the gate) exists, and says when one started: for tests
that need requests held in flight or queued behind a running one, on Nereid and on real Triton alike."""

from __future__ import annotations

from pathlib import Path

__all__ = ["gate_repository", "GATE_BODY"]

_GATE_MODEL = '''
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        open({started!r}, "a").close()
        deadline = time.monotonic() + 60
        while not os.path.exists({gate!r}) and time.monotonic() < deadline:
            time.sleep(0.01)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
'''
_GATE_CONFIG = """
name: "gate"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

# One request to the gate model over HTTP JSON.
GATE_BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]}


def gate_repository(root: Path) -> tuple[Path, Path, Path]:
    """A repository under `root` holding the gate model: (repository, gate file, started file)."""
    model = root / "repo" / "gate"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(_GATE_CONFIG)
    gate, started = root / "open", root / "started"
    (model / "1" / "model.py").write_text(_GATE_MODEL.format(gate=str(gate), started=str(started)))
    return root / "repo", gate, started
