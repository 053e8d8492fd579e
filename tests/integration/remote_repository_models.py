"""What the object-store repository tests (S3, GCS, Azure) share: the Python model they upload (it scales its input
by its version, so a test can tell versions apart), starting a store's emulator as a subprocess, asking a served
`nereid serve` over HTTP, and the checks every store passes: served at start-up, polling that loads uploads, an
explicit load of a model uploaded after start-up, and a local copy that follows the store's changes."""

from __future__ import annotations

import subprocess
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import requests
import tritonclient.http as httpclient

from nereid.repository.remote_copy import RemoteCopy
from tests.servers import RunningServer

__all__ = [
    "CONFIG",
    "IDENTITY",
    "Upload",
    "check_explicit_load_after_upload",
    "check_local_copy_follows_changes",
    "check_polling_loads_uploads",
    "check_served_from_start_up",
    "index",
    "infer",
    "model_files",
    "start_emulator",
    "upload_model",
    "wait_for",
]

IDENTITY = textwrap.dedent(
    """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.scale = float(args["model_version"])

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                        "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * self.scale)])
                    for r in requests]
    """
)
CONFIG = (
    'backend: "python"\nmax_batch_size: 0\n'
    'input [{ name: "IN", data_type: TYPE_FP32, dims: [2] }]\n'
    'output [{ name: "OUT", data_type: TYPE_FP32, dims: [2] }]\n'
)


# Writes one object of a store's repository: (path below the repository, content).
Upload = Callable[[str, bytes], None]


def model_files(name: str, versions: tuple[int, ...] = (1,), config: str = CONFIG) -> dict[str, bytes]:
    """The model's objects, keyed by their path below the repository."""
    files = {f"{name}/config.pbtxt": config.encode()}
    files.update({f"{name}/{version}/model.py": IDENTITY.encode() for version in versions})
    return files


def upload_model(upload: Upload, name: str, versions: tuple[int, ...] = (1,)) -> None:
    for path, body in model_files(name, versions).items():
        upload(path, body)


def start_emulator(command: list[str], ready: Callable[[], bool], log: Path, timeout: float = 60) -> subprocess.Popen[bytes]:
    """Start a store's emulator and wait until `ready()` (a request to it that succeeds); its output goes to `log`."""
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return process
        except requests.RequestException:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"{command[0]} did not start:\n{log.read_text()}")
        time.sleep(0.1)


def infer(server: RunningServer, model: str) -> list[float]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensor = httpclient.InferInput("IN", [2], "FP32")
        tensor.set_data_from_numpy(np.array([1.5, -2.0], dtype=np.float32))
        return client.infer(model, [tensor]).as_numpy("OUT").tolist()
    finally:
        client.close()


def index(server: RunningServer) -> dict[str, dict[str, Any]]:
    """The repository index, keyed "name:version"."""
    rows = requests.post(server.base + "/v2/repository/index", json={}, timeout=10).json()
    return {f"{row['name']}:{row.get('version', '')}": row for row in rows}


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.2)


# -- the checks each store's tests run --------------------------------------------------------------------------


def check_served_from_start_up(server: RunningServer, mount: Path) -> None:
    """`identity`, in the repository at start-up, is served, from a copy under the store's mount directory."""
    assert infer(server, "identity") == [1.5, -2.0]
    assert index(server)["identity:1"]["state"] == "READY"
    [copy] = [c / "identity" / "1" / "model.py" for c in mount.iterdir() if (c / "identity").is_dir()]
    assert copy.read_text() == IDENTITY


def check_polling_loads_uploads(server: RunningServer, upload: Upload) -> None:
    """A polling server loads a model uploaded after start-up, then a new version of it (which scales by 2)."""
    upload_model(upload, "added")
    wait_for(lambda: index(server).get("added:1", {}).get("state") == "READY", "the uploaded model is ready")
    assert infer(server, "added") == [1.5, -2.0]
    upload("added/2/model.py", IDENTITY.encode())
    wait_for(lambda: index(server).get("added:2", {}).get("state") == "READY", "version 2 is ready")
    wait_for(lambda: infer(server, "added") == [3.0, -4.0], "requests reach version 2")


def check_explicit_load_after_upload(server: RunningServer, upload: Upload) -> None:
    """A server in explicit mode loads, through the load API, a model uploaded after start-up."""
    upload_model(upload, "late")
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert not client.is_model_ready("late")
        client.load_model("late")
        assert client.is_model_ready("late")
    finally:
        client.close()
    assert infer(server, "late") == [1.5, -2.0]


def check_local_copy_follows_changes(sync: RemoteCopy, upload: Upload, delete: Callable[[str], None], marker: str) -> None:
    """`sync` copies a repository holding `identity` and the folder marker `marker` (its empty version folder 3): an
    unchanged object is never fetched again (its mtime stays, so polling sees no change), a new content under the
    same name is, and a deleted marker's folder goes."""
    root = sync.repository.local_path
    assert sync.sync() is True
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [
        "identity", "identity/1", "identity/1/model.py", "identity/3", "identity/config.pbtxt",
    ]  # fmt: skip
    stamp = (root / "identity/1/model.py").stat().st_mtime_ns
    assert sync.sync() is False
    upload("identity/config.pbtxt", (CONFIG + "# changed\n").encode())
    delete(marker)
    assert sync.sync() is True
    assert (root / "identity/config.pbtxt").read_text().endswith("# changed\n")
    assert not (root / "identity/3").exists()
    assert (root / "identity/1/model.py").stat().st_mtime_ns == stamp
