"""The reference server for differential tests and side-by-side benchmarks: the real `tritonserver` 2.51 (CPU, Python
backend only) that PyPI's nvidia-pytriton 0.7.0 ships, set up once in a cache folder by this module.

    python -m tests.reference_triton install      # set it up (once); prints where, or why it cannot be
    python -m tests.reference_triton env          # the paths, as NAME=value lines
    python -m tests.reference_triton serve --model-repository DIR --http-port 18000 ...   # run it

The cache is ~/.cache/nereid/reference-triton (NEREID_REFERENCE_TRITON_CACHE overrides it). Differential tests call
`require()`: it sets the reference up, fails the test with the reason when that is impossible, and skips only when
NEREID_SKIP_DIFFERENTIAL=1 opts out. Nothing here depends on a path outside the checkout.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["OPT_OUT", "ReferenceTriton", "ReferenceUnavailable", "install", "opted_out", "require"]

OPT_OUT = "NEREID_SKIP_DIFFERENTIAL"
_PACKAGES = ["nvidia-pytriton==0.7.0", "tritonclient[all]", "numpy"]
# Real Triton's binary is built against glibc 2.35.
_GLIBC = (2, 35)


class ReferenceUnavailable(RuntimeError):
    """The reference cannot be set up on this machine; the message says why."""


@dataclass(frozen=True, slots=True)
class ReferenceTriton:
    """An installed reference: the binary, its libraries and backends, and the venv's Python (which runs the Python
    backend's models and has a newer tritonclient and PyTriton's own client)."""

    venv: Path
    site_packages: Path

    @property
    def root(self) -> Path:
        return self.site_packages / "pytriton" / "tritonserver"

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def libs(self) -> Path:
        return self.site_packages / "nvidia_pytriton.libs"

    @property
    def backends(self) -> Path:
        return self.root / "backends"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def command(self, *args: str) -> list[str]:
        """The command line that serves with `args` (Triton's flags), listening on loopback only."""
        return [
            str(self.binary),
            "--backend-directory",
            str(self.backends),
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            *args,
        ]

    def environment(self) -> dict[str, str]:
        """The environment the binary needs: its bundled libraries, and the venv first on PATH so that the Python
        backend's stub runs models with the venv's interpreter and numpy."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(self.libs), env.get("LD_LIBRARY_PATH", "")]))
        env["PATH"] = os.pathsep.join([str(self.venv / "bin"), env.get("PATH", "")])
        return env


def cache_folder() -> Path:
    return Path(os.environ.get("NEREID_REFERENCE_TRITON_CACHE", Path.home() / ".cache" / "nereid" / "reference-triton"))


def opted_out() -> bool:
    return os.environ.get(OPT_OUT, "") not in ("", "0")


def _installed(venv: Path) -> ReferenceTriton | None:
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-c", "import pytriton, site; print(site.getsitepackages()[0])"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        return None
    reference = ReferenceTriton(venv, Path(probe.stdout.strip()))
    return reference if reference.binary.exists() and (reference.backends / "python").is_dir() else None


def _check_machine() -> None:
    if sys.platform != "linux":
        raise ReferenceUnavailable(f"real Triton's binary runs on Linux only, not {sys.platform}")
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split() if hasattr(os, "confstr") else ("", "0")
    found = tuple(int(part) for part in version.split(".")[:2])
    if name != "glibc" or found < _GLIBC:
        raise ReferenceUnavailable(f"real Triton's binary needs glibc >= 2.35, this machine has {name} {version}")


def install() -> ReferenceTriton:
    """The reference, set up in the cache folder if it is not there yet (under a lock: pytest-xdist's workers and
    the controller may all ask at once). Raises ReferenceUnavailable with the reason."""
    _check_machine()
    folder = cache_folder()
    folder.mkdir(parents=True, exist_ok=True)
    venv = folder / "venv"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        reference = _installed(venv)
        if reference is None:
            print(f"reference-triton: installing {' '.join(_PACKAGES)} into {venv} (once)", file=sys.stderr)
            shutil.rmtree(venv, ignore_errors=True)
            steps = [
                [sys.executable, "-m", "venv", str(venv)],
                [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", *_PACKAGES],
            ]
            for step in steps:
                done = subprocess.run(step, capture_output=True, text=True, timeout=1200)
                if done.returncode != 0:
                    raise ReferenceUnavailable(
                        f"setting up real Triton failed at `{' '.join(step)}`:\n{(done.stderr or done.stdout)[-2000:]}"
                    )
            reference = _installed(venv)
            if reference is None:
                raise ReferenceUnavailable(f"nvidia-pytriton installed into {venv} but its tritonserver is missing")
        _place_stub(reference)
        return reference


def _place_stub(reference: ReferenceTriton) -> None:
    """The Python backend looks for its stub beside libtriton_python.so; the wheel ships one per Python version."""
    stub = reference.backends / "python" / "triton_python_backend_stub"
    if stub.exists():
        return
    version = subprocess.run(
        [str(reference.python), "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    shipped = reference.root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not shipped.exists():
        raise ReferenceUnavailable(f"nvidia-pytriton 0.7.0 ships no Python backend stub for Python {version}")
    shutil.copy2(shipped, stub)


_found: ReferenceTriton | None = None  # this process's answer: asking means starting the reference's Python (~1 s)


def require() -> ReferenceTriton:
    """For a test that needs the reference: it, set up; a skip only under the documented opt-out; otherwise a
    failure that says why it cannot be set up. Checked once per process (every differential test asks)."""
    import pytest

    global _found
    if opted_out():
        pytest.skip(f"differential test: {OPT_OUT}=1 opts out of the real Triton reference")
    if _found is not None:
        return _found
    try:
        _found = install()
        return _found
    except ReferenceUnavailable as exc:
        pytest.fail(f"the real Triton reference cannot be set up ({OPT_OUT}=1 opts out): {exc}", pytrace=False)


def main(argv: list[str]) -> int:
    verb, args = (argv[0], argv[1:]) if argv else ("install", [])
    if verb == "install" and opted_out():
        print(f"reference-triton: {OPT_OUT}=1, not set up; differential tests will be skipped", file=sys.stderr)
        return 0
    try:
        reference = install()
    except ReferenceUnavailable as exc:
        print(f"reference-triton: {exc}\n(set {OPT_OUT}=1 to run the suite without differential tests)", file=sys.stderr)
        return 1
    if verb == "install":
        print(f"reference-triton: {reference.binary}")
    elif verb == "env":
        print(f"REFERENCE_TRITON_BIN={reference.binary}\nREFERENCE_TRITON_PYTHON={reference.python}")
        print(f"REFERENCE_TRITON_LIBS={reference.libs}\nREFERENCE_TRITON_BACKENDS={reference.backends}")
    elif verb == "serve":
        os.execve(str(reference.binary), reference.command(*args), reference.environment())
    else:
        print(f"usage: python -m tests.reference_triton [install | env | serve FLAGS...], not {verb!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
