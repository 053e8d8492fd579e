"""Repository agents: Triton's checksum agent (MD5, SHA-256) and a user's own agent from the agent directory."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from nereid.config.model_config import ModelConfig, mc
from nereid.core.errors import NereidError, Status
from nereid.repository.agents import RepositoryAgents


def _model(tmp_path: Path) -> Path:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(b"weights")
    return folder


def _config(*agents: tuple[str, dict[str, str]]) -> ModelConfig:
    config = mc.ModelConfig()
    for name, parameters in agents:
        entry = config.model_repository_agents.agents.add()
        entry.name = name
        entry.parameters.update(parameters)
    return config


MD5 = hashlib.md5(b"weights").hexdigest()
SHA256 = hashlib.sha256(b"weights").hexdigest()


def test_matching_md5_and_sha256_digests_let_the_model_load(tmp_path: Path) -> None:
    RepositoryAgents().check("m", _model(tmp_path), _config(("checksum", {"MD5:1/model.onnx": MD5, "sha256:1/model.onnx": SHA256.upper()})))


def test_a_tampered_file_is_refused_in_tritons_words(tmp_path: Path) -> None:
    folder = _model(tmp_path)
    (folder / "1" / "model.onnx").write_bytes(b"tampered")
    with pytest.raises(NereidError) as caught:
        RepositoryAgents().check("m", folder, _config(("checksum", {"MD5:1/model.onnx": MD5})))
    assert caught.value.status is Status.INVALID_ARG
    assert caught.value.message == (
        f"model 'm': repository agent 'checksum': Mismatched MD5 hash for file 1/model.onnx, expect: {MD5}, "
        f"got: {hashlib.md5(b'tampered').hexdigest()}"
    )


@pytest.mark.parametrize(
    ("key", "status", "words"),
    [
        ("MD5:1/absent.onnx", Status.INVALID_ARG, "failed to open text file for read 1/absent.onnx: No such file"),
        ("SHA1:1/model.onnx", Status.UNSUPPORTED, "Unsupported checksum algorithm: SHA1"),
        ("1/model.onnx", Status.INVALID_ARG, "failed to parse key: 1/model.onnx"),
        ("MD5:../../etc/passwd", Status.INVALID_ARG, "outside the model's folder"),
    ],
)
def test_a_missing_file_or_a_bad_key_is_refused(tmp_path: Path, key: str, status: Status, words: str) -> None:
    with pytest.raises(NereidError) as caught:
        RepositoryAgents().check("m", _model(tmp_path), _config(("checksum", {key: MD5})))
    assert caught.value.status is status and words in caught.value.message


def test_a_users_agent_from_the_agent_directory_is_asked_with_its_parameters(tmp_path: Path) -> None:
    agents_dir = tmp_path / "agents"
    (agents_dir / "size_limit").mkdir(parents=True)
    (agents_dir / "size_limit" / "agent.py").write_text(
        "class SizeLimit:\n"
        "    def before_load(self, model, location, parameters):\n"
        "        size = sum(p.stat().st_size for p in location.rglob('*') if p.is_file())\n"
        "        if size > int(parameters['max_bytes']):\n"
        "            raise ValueError(f'{model} holds {size} bytes')\n"
        "def create_agent():\n"
        "    return SizeLimit()\n"
    )
    agents = RepositoryAgents(agents_dir)
    agents.check("m", _model(tmp_path), _config(("size_limit", {"max_bytes": "100"})))
    with pytest.raises(NereidError, match="model 'm': repository agent 'size_limit' failed: ValueError: m holds 7 bytes"):
        agents.check("m", _model(tmp_path / "again"), _config(("size_limit", {"max_bytes": "3"})))


def test_an_unknown_agent_fails_the_load_by_name(tmp_path: Path) -> None:
    with pytest.raises(NereidError, match="model 'm': unable to find repository agent 'decrypt'"):
        RepositoryAgents(tmp_path).check("m", _model(tmp_path), _config(("decrypt", {})))
