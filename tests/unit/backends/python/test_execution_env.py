"""A Python model's own environment (EXECUTION_ENV_PATH): where it is found, the unpacking cache keyed by content,
the checks that refuse an unusable environment by name, and the worker environment that leaks nothing of the
server's Python paths."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest

from nereid.backends.python.execution_env import ExecutionEnv, execution_env_of
from nereid.core.errors import NereidError
from tests.unit.backends.python.fakes import context

PY = f"python{sys.version_info.major}.{sys.version_info.minor}"


def _env_folder(root: Path, python: str = PY, numpy: bool = True) -> Path:
    (root / "lib" / python / "site-packages").mkdir(parents=True)
    if numpy:
        (root / "lib" / python / "site-packages" / "numpy").mkdir()
    (root / "bin").mkdir()
    interpreter = root / "bin" / "python3"
    interpreter.symlink_to(sys.executable)
    return root


def _with_env(tmp_path: Path, value: str) -> object:
    ctx = context(tmp_path)
    ctx.config.parameters["EXECUTION_ENV_PATH"].string_value = value
    return ctx


def _tarball(folder: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w:gz") as archive:
        archive.add(folder, arcname=".")
    return target


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("NEREID_PYTHON_ENV_CACHE", str(root))
    return root


def test_a_model_without_the_parameter_runs_in_the_servers_environment(tmp_path: Path) -> None:
    assert execution_env_of(context(tmp_path)) is None


def test_a_folder_is_used_in_place_and_the_model_directory_is_substituted(tmp_path: Path) -> None:
    ctx = _with_env(tmp_path, "$$TRITON_MODEL_DIRECTORY/env")
    folder = _env_folder(tmp_path / "m" / "env")
    env = execution_env_of(ctx)  # type: ignore[arg-type]
    assert env == ExecutionEnv(folder, folder / "bin" / "python3")


def test_a_tarball_is_unpacked_once_per_content(tmp_path: Path, cache: Path) -> None:
    packed = _tarball(_env_folder(tmp_path / "src"), tmp_path / "m" / "env.tar.gz")
    first = execution_env_of(_with_env(tmp_path, "env.tar.gz"))  # type: ignore[arg-type]
    assert first is not None and first.prefix.parent == cache
    marker = first.prefix / "marker"
    marker.write_text("unpacked once")
    again = execution_env_of(_with_env(tmp_path, str(packed)))  # type: ignore[arg-type]
    assert again == first and marker.exists()  # the same content: the same folder, not unpacked again
    with tarfile.open(packed, "w:gz") as archive:  # other content
        archive.add(tmp_path / "src", arcname=".")
        info = tarfile.TarInfo("extra.txt")
        archive.addfile(info, io.BytesIO(b""))
    changed = execution_env_of(_with_env(tmp_path, "env.tar.gz"))  # type: ignore[arg-type]
    assert changed is not None and changed.prefix != first.prefix


def test_a_tarball_reaching_outside_its_folder_is_refused(tmp_path: Path, cache: Path) -> None:
    target = tmp_path / "m" / "env.tar.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w:gz") as archive:
        info = tarfile.TarInfo("../../escaped.txt")
        archive.addfile(info, io.BytesIO(b""))
    with pytest.raises(NereidError, match="model 'm': cannot unpack the execution environment"):
        execution_env_of(_with_env(tmp_path, "env.tar.gz"))  # type: ignore[arg-type]
    assert not (tmp_path / "escaped.txt").exists()
    assert [p.name for p in cache.iterdir()] == []  # nothing half-unpacked is left behind


@pytest.mark.parametrize(
    ("python", "numpy", "message"),
    [
        ("python3.9", True, r"model 'm': the execution environment .* is Python 3\.9, the server runs Python 3\.\d+"),
        (PY, False, "model 'm': the execution environment .* has no numpy"),
    ],
)
def test_an_unusable_environment_is_refused_by_name(tmp_path: Path, python: str, numpy: bool, message: str) -> None:
    _env_folder(tmp_path / "env", python, numpy)
    with pytest.raises(NereidError, match=message):
        execution_env_of(_with_env(tmp_path, str(tmp_path / "env")))  # type: ignore[arg-type]


def test_a_path_that_is_neither_folder_nor_tarball_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NereidError, match="model 'm': EXECUTION_ENV_PATH 'nowhere.zip' is neither"):
        execution_env_of(_with_env(tmp_path, "nowhere.zip"))  # type: ignore[arg-type]


def test_the_worker_sees_its_environment_first_and_only_nereids_package_of_the_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/server/site-packages")
    monkeypatch.setenv("VIRTUAL_ENV", "/server/venv")
    folder = _env_folder(tmp_path / "env")
    variables = ExecutionEnv(folder, folder / "bin" / "python3").worker_env()
    assert variables["PATH"].startswith(str(folder / "bin"))
    assert variables["CONDA_PREFIX"] == str(folder) and "VIRTUAL_ENV" not in variables
    path = Path(variables["PYTHONPATH"])
    assert [p.name for p in path.iterdir()] == ["nereid"] and (path / "nereid" / "__init__.py").is_file()
