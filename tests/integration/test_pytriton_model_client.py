"""nereid.pytriton through PyTriton's own clients (ModelClient over HTTP and gRPC, DecoupledModelClient), run with
the Python of the real-Triton tool's venv, which has nvidia-pytriton 0.7.0: PyTriton's client code, unchanged."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest

from nereid.pytriton.model_config import ModelConfig, Tensor
from nereid.pytriton.triton import Triton, TritonConfig
from tests.integration import pytriton_models as models
from tests.reference_triton import ReferenceTriton
from tests.servers import free_port

F32 = np.float32

CLIENT_SCRIPT = r"""
import json, sys
import numpy as np
from pytriton.client import DecoupledModelClient, ModelClient

http, grpc = sys.argv[1], sys.argv[2]
out = {}
a = np.arange(8, dtype=np.float32).reshape(2, 4)
for scheme, url in (("http", http), ("grpc", grpc)):
    with ModelClient(url, "add_sub", init_timeout_s=60) as client:
        batch = client.infer_batch(INPUT0=a, INPUT1=np.ones_like(a))
        one = client.infer_sample(INPUT0=a[0], INPUT1=a[0])
        out[scheme] = {
            "sum": batch["OUTPUT0"].tolist(), "diff": batch["OUTPUT1"].tolist(),
            "sample_sum": one["OUTPUT0"].tolist(), "max_batch": client.model_config.max_batch_size,
        }
with ModelClient(http, "scale", init_timeout_s=60) as client:
    out["scale"] = client.infer_sample(x=np.array([1, 2], np.float32), factor=np.array([3], np.float32))["y"].tolist()
with ModelClient(http, "fails", init_timeout_s=60) as client:
    try:
        client.infer_batch(x=np.zeros((1, 1), np.float32))
        out["error"] = None
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
with DecoupledModelClient(grpc, "countdown", init_timeout_s=60) as client:
    out["stream"] = [int(r["value"][0]) for r in client.infer_sample(start=np.array([4], np.int32))]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def pytriton_python(reference_triton: ReferenceTriton) -> str:
    """PyTriton's own client lives in the reference's venv (nvidia-pytriton)."""
    python = str(reference_triton.python)
    subprocess.run([python, "-c", "import pytriton.client"], check=True, timeout=120)
    return python


@pytest.fixture(scope="module")
def urls() -> Iterator[tuple[str, str]]:
    config = TritonConfig(http_address="127.0.0.1", grpc_address="127.0.0.1", allow_metrics=False,
                          http_port=free_port(), grpc_port=free_port())  # fmt: skip
    with Triton(config=config) as triton:
        vec = [Tensor(name="INPUT0", dtype=F32, shape=(4,)), Tensor(name="INPUT1", dtype=F32, shape=(4,))]
        triton.bind("add_sub", models.add_sub, vec,
                    [Tensor(name="OUTPUT0", dtype=F32, shape=(4,)), Tensor(name="OUTPUT1", dtype=F32, shape=(4,))],
                    config=ModelConfig(max_batch_size=16))  # fmt: skip
        triton.bind("scale", models.scale, [Tensor(name="x", dtype=F32, shape=(-1,)), Tensor(name="factor", dtype=F32, shape=(1,))],
                    [Tensor(name="y", dtype=F32, shape=(-1,))], config=ModelConfig(batching=False))  # fmt: skip
        triton.bind("fails", models.fails, [Tensor(name="x", dtype=F32, shape=(1,))], [Tensor(name="y", dtype=F32, shape=(1,))])
        triton.bind("countdown", models.countdown, [Tensor(name="start", dtype=np.int32, shape=(1,))],
                    [Tensor(name="value", dtype=np.int32, shape=(1,))], config=ModelConfig(max_batch_size=4, decoupled=True))
        yield f"http://127.0.0.1:{config.http_port}", f"grpc://127.0.0.1:{config.grpc_port}"


def test_pytritons_model_clients_work_against_bound_functions(pytriton_python: str, urls: tuple[str, str]) -> None:
    done = subprocess.run(
        [pytriton_python, "-c", CLIENT_SCRIPT, *urls], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    a = np.arange(8, dtype=F32).reshape(2, 4)
    for scheme in ("http", "grpc"):
        assert out[scheme]["sum"] == (a + 1).tolist()
        assert out[scheme]["diff"] == (a - 1).tolist()
        assert out[scheme]["sample_sum"] == (a[0] * 2).tolist()
        assert out[scheme]["max_batch"] == 16
    assert out["scale"] == [3.0, 6.0]
    assert out["error"] is not None and "ValueError: the input was not welcome" in out["error"]
    assert out["stream"] == [4, 3, 2, 1]
