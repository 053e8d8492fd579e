"""A Python model's own environment (Triton's `EXECUTION_ENV_PATH` parameter): a packed environment (a conda-pack or
venv-pack tarball) or an unpacked folder whose interpreter runs the model's workers, for models whose dependencies
clash with the server's.

    parameters: { key: "EXECUTION_ENV_PATH", value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }

A tarball is unpacked once into a cache keyed by its content (a changed tarball gets a new folder; the same tarball
in two models, one). As in Triton, the environment must have numpy and the server's Python minor version: the worker
runs Nereid's worker code, which speaks to the server through numpy arrays and marshal, both tied to the minor version.
The worker sees Nereid's own package and nothing else of the server's environment.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import nereid
from nereid.backends.base import ModelContext
from nereid.core.errors import NereidError

__all__ = ["EXECUTION_ENV_KEY", "ExecutionEnv", "execution_env_of", "unpack_cache_root"]

EXECUTION_ENV_KEY = "EXECUTION_ENV_PATH"
_MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
_CACHE_ENV = "NEREID_PYTHON_ENV_CACHE"
_TARBALL_SUFFIXES = (".tar.gz", ".tgz", ".tar")
_unpacking = threading.Lock()  # one unpacking at a time in this process; other processes meet at the rename
# A tarball's digest by (path, size, mtime): every instance of a model, and its auto-complete, ask for the environment,
# and a conda environment is gigabytes to hash.
_digests: dict[tuple[str, int, int], str] = {}


@dataclass(frozen=True, slots=True)
class ExecutionEnv:
    """An environment ready to run workers: its folder and its interpreter."""

    prefix: Path
    python: Path

    def worker_env(self) -> dict[str, str]:
        """The worker's environment variables: the server's, less its Python paths, with this environment first on
        PATH (and on LD_LIBRARY_PATH, for conda's shared libraries) and only Nereid's package added to sys.path."""
        env = {
            k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX")
        }
        env["PYTHONPATH"] = str(_nereid_only())
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONNOUSERSITE"] = "1"
        env["PATH"] = str(self.prefix / "bin") + os.pathsep + os.environ.get("PATH", "")
        libraries = os.environ.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = str(self.prefix / "lib") + (os.pathsep + libraries if libraries else "")
        env["VIRTUAL_ENV" if (self.prefix / "pyvenv.cfg").is_file() else "CONDA_PREFIX"] = str(self.prefix)
        return env


def unpack_cache_root() -> Path:
    """Where tarballs are unpacked: $NEREID_PYTHON_ENV_CACHE, else ~/.cache/nereid/python-envs."""
    given = os.environ.get(_CACHE_ENV)
    return Path(given) if given else Path.home() / ".cache" / "nereid" / "python-envs"


def execution_env_of(context: ModelContext) -> ExecutionEnv | None:
    """The model's environment, unpacked and checked; None for a model that runs in the server's own. Blocking (a
    first unpacking reads the whole tarball): call it off the event loop."""
    parameter = context.config.parameters.get(EXECUTION_ENV_KEY)
    value = parameter.string_value.strip() if parameter is not None else ""
    if not value:
        return None
    path = Path(value.replace(_MODEL_DIRECTORY, str(context.model_path)))
    if not path.is_absolute():
        path = context.model_path / path
    label = f"model '{context.name}'"
    if path.is_dir():
        prefix = path
    elif path.is_file() and path.name.endswith(_TARBALL_SUFFIXES):
        prefix = _unpacked(path, label)
    else:
        raise NereidError.invalid(
            f"{label}: {EXECUTION_ENV_KEY} '{value}' is neither a folder nor a .tar.gz/.tgz/.tar file ('{path}')"
        )
    return _checked(prefix, label)


def _checked(prefix: Path, label: str) -> ExecutionEnv:
    """The environment's interpreter, once its Python minor version is the server's and it has numpy."""
    ours = f"{sys.version_info.major}.{sys.version_info.minor}"
    libraries = sorted(p.name[len("python") :] for p in (prefix / "lib").glob("python3.*") if p.is_dir())
    if not libraries:
        raise NereidError.invalid(f"{label}: the execution environment '{prefix}' has no lib/python3.* folder")
    if ours not in libraries:
        raise NereidError.invalid(
            f"{label}: the execution environment '{prefix}' is Python {', '.join(libraries)}, the server runs Python "
            f"{ours}: the environment must have the server's Python minor version"
        )
    site = prefix / "lib" / f"python{ours}" / "site-packages"
    if not (site / "numpy").is_dir():
        raise NereidError.invalid(f"{label}: the execution environment '{prefix}' has no numpy (looked in '{site}')")
    for name in (f"python{ours}", "python3", "python"):
        python = prefix / "bin" / name
        if python.exists() and os.access(python, os.X_OK):
            return ExecutionEnv(prefix, python)
    raise NereidError.invalid(f"{label}: the execution environment '{prefix}' has no bin/python3")


def _unpacked(tarball: Path, label: str) -> Path:
    """The folder the tarball was unpacked into, unpacking it the first time: into a temporary folder beside the
    cache's, renamed into place when complete, so that no process ever sees half an environment."""
    stat = tarball.stat()
    key = (str(tarball), stat.st_size, stat.st_mtime_ns)
    digest = _digests.get(key)
    if digest is None:
        with tarball.open("rb") as f:
            digest = _digests[key] = hashlib.file_digest(f, "sha256").hexdigest()
    root = unpack_cache_root()
    target = root / digest[:32]
    with _unpacking:
        if target.is_dir():
            return target
        root.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=root))
        try:
            with tarfile.open(tarball) as archive:
                archive.extractall(partial, filter="tar")  # refuses absolute paths and paths leaving the folder
            try:
                partial.rename(target)
            except OSError:
                if not target.is_dir():
                    raise
        except (OSError, tarfile.TarError) as exc:
            raise NereidError.invalid(f"{label}: cannot unpack the execution environment '{tarball}': {exc}") from None
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return target


def _nereid_only() -> Path:
    """A folder holding only Nereid's package (a link to it), for the worker's sys.path: the folder Nereid is
    installed in may be the server's whole site-packages."""
    package = Path(nereid.__file__).resolve().parent
    folder = unpack_cache_root() / "nereid-path" / hashlib.sha256(str(package).encode()).hexdigest()[:16]
    link = folder / "nereid"
    if not link.is_symlink():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            link.symlink_to(package, target_is_directory=True)
        except FileExistsError:
            pass
    return folder
