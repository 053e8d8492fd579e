"""The container image's recipe: deploy/docker/install.sh really installs Nereid with its extras into a fresh virtual
environment and serves from it, refuses unknown extras, and the Dockerfile runs that same script."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.servers import ROOT

SCRIPT = ROOT / "deploy" / "docker" / "install.sh"
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"


def _build_context(tmp_path: Path) -> Path:
    """What the Dockerfile copies into the build stage, and nothing else."""
    source = tmp_path / "src-copy"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return source


def _fresh_venv(tmp_path: Path) -> Path:
    """A throwaway environment. Its third-party dependencies come from this test environment (a path entry after its
    own site-packages), so the install runs offline and fast; Nereid itself is built and installed into it for real."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (Path(purelib) / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)  # the script must stand on its own, not on the checkout's sources
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.timeout(600)
def test_install_script_installs_the_package_with_its_extras_and_serves_from_it(tmp_path: Path) -> None:
    venv = _fresh_venv(tmp_path)
    result = _run("--venv", str(venv), "--extras", "s3", "--check", str(_build_context(tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"installed in {venv} and served" in result.stdout
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import nereid; print(nereid.__file__)"],
                           capture_output=True, text=True, check=True, cwd=tmp_path, env={"PATH": os.environ["PATH"]})  # fmt: skip
    assert where.stdout.strip().startswith(str(venv))  # an installed copy, not the checkout
    assert (venv / "bin" / "nereid").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (("--extras", "s3,gpus"), "unknown extra(s) gpus"),
    (("--frobnicate",), "unknown option --frobnicate"),
])  # fmt: skip
def test_install_script_refuses_what_it_does_not_know(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    result = _run("--venv", str(tmp_path / "never-made"), *args, str(ROOT), timeout=60)
    assert result.returncode != 0
    assert message in result.stderr
    assert not (tmp_path / "never-made").exists()


@pytest.mark.skipif(os.environ.get("NEREID_NETWORK_TESTS") != "1", reason="resolves every requirement on the package index (about a minute); set NEREID_NETWORK_TESTS=1")
@pytest.mark.timeout(600)
def test_dry_run_resolves_every_requirement_of_the_image_on_the_index(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    result = _run("--venv", str(venv), "--extras", "s3,redis", "--dry-run", str(_build_context(tmp_path)))
    assert result.returncode == 0, result.stderr
    names = {item["metadata"]["name"].lower() for item in json.loads((venv / "install-report.json").read_text())["install"]}
    assert {"nereid", "boto3", "redis", "protobuf", "grpcio", "tritonclient", "onnxruntime"} <= names


def test_dockerfile_builds_through_the_install_script_with_the_extras_argument() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG EXTRAS=", text, re.M)
    run = re.search(r"^RUN nereid-install (.+)$", text, re.M)
    assert run is not None
    assert '--extras "${EXTRAS}"' in run.group(1) and "--check" in run.group(1)
    assert "COPY deploy/docker/install.sh /usr/local/bin/nereid-install" in text
    copied = set(re.findall(r"^COPY (?!--from)(.+) /src/", text, re.M))
    assert copied == {"pyproject.toml README.md", "src"}  # what _build_context gives the script above
    # The chart passes `serve ...` as arguments and runs as user 1000: the image's entry point and user agree.
    assert 'ENTRYPOINT ["nereid"]' in text and "USER 1000" in text
    assert text.count("FROM python:${PYTHON_VERSION}-slim") == 2  # a slim base, and the same one in both stages
