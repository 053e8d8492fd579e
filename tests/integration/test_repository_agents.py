"""Repository agents on a real server: a model whose files match its checksums loads and serves; a tampered one,
and one whose listed file is missing, are refused with the agent's words; a user's agent in --repoagent-directory
is asked too, and a reload after the files are fixed succeeds."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.servers import RunningServer, start_nereid

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "model_repository" / "simple"
_MODEL_FILE = "1/model.onnx"


def _simple(repository: Path, name: str, agents: str) -> Path:
    folder = repository / name
    shutil.copytree(EXAMPLE, folder)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "simple"', f'name: "{name}"') + "\n" + agents + "\n")
    return folder


def _checksum(key: str, value: str) -> str:
    return f'model_repository_agents {{ agents [ {{ name: "checksum", parameters {{ key: "{key}" value: "{value}" }} }} ] }}'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    repository = tmp_path_factory.mktemp("models")
    digest = hashlib.sha256((EXAMPLE / _MODEL_FILE).read_bytes()).hexdigest()
    _simple(repository, "intact", _checksum(f"SHA256:{_MODEL_FILE}", digest))
    tampered = _simple(repository, "tampered", _checksum(f"MD5:{_MODEL_FILE}", hashlib.md5((EXAMPLE / _MODEL_FILE).read_bytes()).hexdigest()))
    (tampered / _MODEL_FILE).write_bytes((tampered / _MODEL_FILE).read_bytes() + b"\0")
    _simple(repository, "missing", _checksum("MD5:1/absent.onnx", "0" * 32))
    _simple(repository, "screened", 'model_repository_agents { agents [ { name: "deny_list", parameters { key: "deny" value: "screened" } } ] }')
    agents = tmp_path_factory.mktemp("agents")
    (agents / "deny_list").mkdir()
    (agents / "deny_list" / "agent.py").write_text(
        "from nereid.core.errors import NereidError\n"
        "class DenyList:\n"
        "    def before_load(self, model, location, parameters):\n"
        "        if model in parameters['deny'].split(','):\n"
        "            raise NereidError.invalid(f'{model} is on the deny list')\n"
        "def create_agent():\n"
        "    return DenyList()\n"
    )
    running = start_nereid(repository, "--model-control-mode=explicit", f"--repoagent-directory={agents}")
    yield running, repository
    running.stop()


def _load_error(client: httpclient.InferenceServerClient, model: str) -> str:
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(model)
    return str(caught.value.message())


def test_a_model_whose_files_match_loads_and_serves(server: tuple[RunningServer, Path]) -> None:
    client = httpclient.InferenceServerClient(server[0].http_url)
    client.load_model("intact")
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
    np.testing.assert_array_equal(client.infer("intact", inputs).as_numpy("OUTPUT0"), np.full((1, 16), 2))


def test_a_tampered_or_missing_file_is_refused_with_the_agents_words(server: tuple[RunningServer, Path]) -> None:
    client = httpclient.InferenceServerClient(server[0].http_url)
    message = _load_error(client, "tampered")
    assert "model 'tampered': repository agent 'checksum': Mismatched MD5 hash for file 1/model.onnx" in message
    assert not client.is_model_ready("tampered")
    message = _load_error(client, "missing")
    assert "failed to open text file for read 1/absent.onnx" in message


def test_a_users_agent_refuses_what_it_screens_and_a_fixed_model_then_loads(server: tuple[RunningServer, Path]) -> None:
    running, repository = server
    client = httpclient.InferenceServerClient(running.http_url)
    assert "model 'screened': repository agent 'deny_list': screened is on the deny list" in _load_error(client, "screened")
    shutil.copy(EXAMPLE / _MODEL_FILE, repository / "tampered" / _MODEL_FILE)  # the file restored
    client.load_model("tampered")
    assert client.is_model_ready("tampered")
