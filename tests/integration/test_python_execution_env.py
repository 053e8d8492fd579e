"""Python models in environments of their own (Triton's EXECUTION_ENV_PATH): a model whose environment has another
version of a package than the server's serves beside a model using the server's, from a venv-pack tarball and from
an unpacked folder, its auto_complete_config run in its environment too; an environment of another Python minor version, or without numpy, is refused with the model
and the reason named; the server's own packages never leak into such a model's workers (spares and the fork server
included)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import packaging
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.onnx_builders import write
from tests.servers import RunningServer, start_nereid

# A version of `packaging` the server's environment does not have (it has a recent one).
ENV_PACKAGING = "21.3"

_REPORT_MODEL = """
import json
import sys

import numpy as np
import packaging
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        # Runs in the model's environment too: its packaging's major version becomes the batch size.
        auto_complete_model_config.set_max_batch_size(int(packaging.__version__.split(".")[0]))
        return auto_complete_model_config

    def execute(self, requests):
        report = {"packaging": packaging.__version__, "prefix": sys.prefix, "numpy": np.__version__,
                  "nereid_paths": [p for p in sys.path if "site-packages" in p]}
        out = np.array([[json.dumps(report).encode()]], dtype=np.object_)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", out),
                                                         pb_utils.Tensor("Y", (x * 2).astype(np.float32))]))
        return responses
"""


def _model(repository: Path, name: str, env_path: str = "") -> None:
    write(repository / name / "1" / "model.py", _REPORT_MODEL)
    parameter = f'parameters: {{ key: "EXECUTION_ENV_PATH", value: {{ string_value: "{env_path}" }} }}\n' if env_path else ""
    write(
        repository / name / "config.pbtxt",
        'backend: "python"\n'
        'input [{ name: "X" data_type: TYPE_FP32 dims: [2] }]\n'
        'output [{ name: "REPORT" data_type: TYPE_STRING dims: [1] }, { name: "Y" data_type: TYPE_FP32 dims: [2] }]\n'
        + parameter,
    )


@pytest.fixture(scope="module")
def packed_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A virtual environment with numpy (a copy of the server's, which pip would download again) and packaging 21.3,
    and its venv-pack tarball."""
    root = tmp_path_factory.mktemp("env")
    folder = root / "own-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    ours = Path(np.__file__).parent.parent
    for entry in [ours / "numpy", ours / "numpy.libs", *ours.glob("numpy-*.dist-info")]:
        if entry.is_dir():
            shutil.copytree(entry, site / entry.name)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), f"packaging=={ENV_PACKAGING}"],
        check=True,
    )  # fmt: skip
    tarball = root / "env.tar.gz"
    subprocess.run([str(Path(sys.executable).parent / "venv-pack"), "-p", str(folder), "-o", str(tarball), "-q"], check=True)
    return folder, tarball


@pytest.fixture(scope="module")
def server(packed_env: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder, tarball = packed_env
    repository = tmp_path_factory.mktemp("models")
    _model(repository, "server_env")
    _model(repository, "packed_env", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    (repository / "packed_env" / "env.tar.gz").write_bytes(tarball.read_bytes())
    _model(repository, "folder_env", str(folder))
    cache = tmp_path_factory.mktemp("unpacked")
    # Spare workers and the fork server on: both run in the server's environment and must not serve these models.
    server = start_nereid(
        repository, "--backend-config=python,spare-workers=1", "--backend-config=python,fork-server=true",
        env={"NEREID_PYTHON_ENV_CACHE": str(cache)},
    )  # fmt: skip
    yield server
    server.stop()


def _report(server: RunningServer, model: str) -> dict[str, object]:
    client = httpclient.InferenceServerClient(server.http_url)
    x = httpclient.InferInput("X", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.5, -2.0]], np.float32))
    result = client.infer(model, [x])
    np.testing.assert_array_equal(result.as_numpy("Y"), [[3.0, -4.0]])
    return json.loads(result.as_numpy("REPORT")[0][0])  # type: ignore[no-any-return]


def _max_batch_size(server: RunningServer, model: str) -> int:
    return int(requests.get(f"{server.base}/v2/models/{model}/config", timeout=30).json()["max_batch_size"])


@pytest.mark.parametrize("model", ["packed_env", "folder_env"])
def test_a_model_runs_with_its_own_environments_packages_beside_one_using_the_servers(
    server: RunningServer, model: str, packed_env: tuple[Path, Path]
) -> None:
    own = _report(server, model)
    assert own["packaging"] == ENV_PACKAGING
    assert own["numpy"] == np.__version__
    assert not any(".venv" in str(path) for path in own["nereid_paths"])  # type: ignore[attr-defined]
    if model == "folder_env":
        assert own["prefix"] == str(packed_env[0])
    else:
        assert own["prefix"] != str(packed_env[0])  # the tarball's unpacked copy
    theirs = _report(server, "server_env")
    assert theirs["packaging"] == packaging.__version__ != ENV_PACKAGING
    # auto_complete_config ran in each model's own environment
    assert _max_batch_size(server, model) == 21
    assert _max_batch_size(server, "server_env") == int(packaging.__version__.split(".")[0])


def test_a_model_with_its_own_environment_also_answers_over_grpc(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.0, 2.0]], np.float32))
    result = client.infer("packed_env", [x])
    assert json.loads(result.as_numpy("REPORT")[0][0])["packaging"] == ENV_PACKAGING


def _load_error(server: RunningServer, model: str) -> str:
    reply = requests.post(f"{server.base}/v2/repository/models/{model}/load", timeout=60)
    assert reply.status_code == 400, reply.text
    return str(reply.json()["error"])


def test_an_environment_of_another_python_minor_version_or_without_numpy_is_refused_by_name(
    tmp_path: Path,
) -> None:
    other = tmp_path / "py39-env"
    (other / "lib" / "python3.9" / "site-packages" / "numpy").mkdir(parents=True)
    (other / "bin").mkdir()
    bare = tmp_path / "no-numpy-env"
    (bare / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages").mkdir(parents=True)
    repository = tmp_path / "models"
    _model(repository, "old_python", str(other))
    _model(repository, "no_numpy", str(bare))
    _model(repository, "missing", "$$TRITON_MODEL_DIRECTORY/absent.tar.gz")
    server = start_nereid(repository, "--model-control-mode=explicit")
    try:
        message = _load_error(server, "old_python")
        assert "model 'old_python'" in message and "Python 3.9" in message
        assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in message
        message = _load_error(server, "no_numpy")
        assert "model 'no_numpy'" in message and "no numpy" in message
        message = _load_error(server, "missing")
        assert "model 'missing'" in message and "absent.tar.gz" in message
    finally:
        server.stop()
