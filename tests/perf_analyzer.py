"""Install NVIDIA's perf_analyzer into a cache folder and run it, for the perf_analyzer tests and benchmark.

perf_analyzer ships inside the tritonclient 2.51.0 wheel (data/bin); it links libcudart.so.12 (taken from pip's
nvidia-cuda-runtime-cu12, loaded but unused on a CPU) and libb64.so.0d (Debian's libb64-0d). Nothing here imports
the server: perf_analyzer speaks the protocol like any client.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PerfAnalyzer", "PerfAnalyzerUnavailable", "PerfResult", "install_perf_analyzer"]

TRITONCLIENT_VERSION = "2.51.0"
CACHE = Path(os.environ.get("NEREID_PERF_ANALYZER_CACHE", Path.home() / ".cache" / "nereid-bench" / "perf_analyzer"))
_LIBB64 = "libb64.so.0d"


class PerfAnalyzerUnavailable(RuntimeError):
    """perf_analyzer could not be installed here (no registry reachable, no apt)."""


@dataclass(frozen=True, slots=True)
class PerfResult:
    """One perf_analyzer measurement: the CSV row of its last (stable) concurrency or rate, and its output."""

    throughput: float
    p50_us: float
    p99_us: float
    row: dict[str, str]
    output: str


@dataclass(frozen=True, slots=True)
class PerfAnalyzer:
    binary: Path
    library_dir: Path

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(self.library_dir), env.get("LD_LIBRARY_PATH", "")]))
        return env

    def run(self, *args: str, timeout: float = 300, csv_path: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run perf_analyzer with these arguments; with csv_path, it also writes its `-f` report there."""
        command = [str(self.binary), *args]
        if csv_path is not None:
            command += ["-f", str(csv_path)]
        return subprocess.run(command, capture_output=True, text=True, env=self.env(), timeout=timeout, check=False)

    def measure(self, *args: str, csv_path: Path, timeout: float = 300, allow_unstable: bool = False) -> PerfResult:
        """Run and parse the CSV report; raises RuntimeError (with perf_analyzer's output) when it fails.

        With allow_unstable, a run whose windows never agreed within the stability percentage (a loaded machine)
        still counts, with its last window's figures."""
        csv_path.unlink(missing_ok=True)
        # Verbose output logs each window ("Pass [n] throughput: ..."), the only figures an unstable run leaves.
        done = self.run(*args, *(["-v"] if allow_unstable else []), timeout=timeout, csv_path=csv_path)
        output = done.stdout + done.stderr
        unstable = allow_unstable and "Failed to obtain stable measurement" in output
        if done.returncode != 0 and not unstable:
            raise RuntimeError(f"perf_analyzer {' '.join(args)} exited {done.returncode}:\n{output}")
        if unstable and not csv_path.exists():
            # No report is written then; the last window's throughput is in its log (no percentiles there).
            passes = re.findall(r"Pass \[\d+\] throughput: ([\d.]+) infer/sec", output)
            if not passes:
                raise RuntimeError(f"perf_analyzer measured nothing:\n{output}")
            return PerfResult(float(passes[-1]), float("nan"), float("nan"), {"unstable": "1"}, output)
        with open(csv_path, newline="") as handle:
            rows = list(csv.DictReader(handle))
        if not rows:
            raise RuntimeError(f"perf_analyzer wrote no measurement:\n{output}")
        row = rows[-1]
        return PerfResult(
            float(row["Inferences/Second"]), float(row["p50 latency"]), float(row["p99 latency"]), row, output
        )


def _pip_download(requirement: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
        "--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64", "-d", str(into), requirement,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    name = requirement.split("=")[0].split("<")[0].split(">")[0].replace("-", "_")
    wheels = sorted(p for p in into.glob("*.whl") if p.name.lower().startswith(name.lower()))
    if not wheels:
        raise PerfAnalyzerUnavailable(f"pip download {requirement} failed:\n{done.stdout}{done.stderr}")
    return wheels[-1]


def _extract(wheel: Path, member_suffix: str, target: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(member_suffix)]
        if not names:
            raise PerfAnalyzerUnavailable(f"{wheel.name} has no {member_suffix}")
        partial = target.with_suffix(".partial")
        with archive.open(names[0]) as source, open(partial, "wb") as sink:
            shutil.copyfileobj(source, sink)
    partial.chmod(0o755)
    partial.replace(target)  # atomic: a concurrent installer never sees half a file


def _has_system_libb64() -> bool:
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return False
    return _LIBB64 in listing


def _ensure_libb64() -> None:
    if _has_system_libb64():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise PerfAnalyzerUnavailable(f"{_LIBB64} is missing: install Debian's libb64-0d (apt-get install libb64-0d)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, check=False)
    subprocess.run(["apt-get", "install", "-y", "-qq", "libb64-0d"], capture_output=True, env=env, check=False)
    if not _has_system_libb64():
        raise PerfAnalyzerUnavailable(f"apt-get install libb64-0d did not provide {_LIBB64}")


def install_perf_analyzer(cache: Path = CACHE) -> PerfAnalyzer:
    """perf_analyzer from the cache, installing it first if needed; raises PerfAnalyzerUnavailable."""
    binary, library_dir = cache / "bin" / "perf_analyzer", cache / "lib"
    binary.parent.mkdir(parents=True, exist_ok=True)
    library_dir.mkdir(parents=True, exist_ok=True)
    if not binary.exists():
        wheel = _pip_download(f"tritonclient=={TRITONCLIENT_VERSION}", cache / "wheels")
        _extract(wheel, "data/bin/perf_analyzer", binary)
    if not (library_dir / "libcudart.so.12").exists():
        wheel = _pip_download("nvidia-cuda-runtime-cu12<13", cache / "wheels")
        _extract(wheel, "lib/libcudart.so.12", library_dir / "libcudart.so.12")
    _ensure_libb64()
    analyzer = PerfAnalyzer(binary, library_dir)
    probe = analyzer.run("--version", timeout=30)
    if "error while loading shared libraries" in probe.stderr:
        raise PerfAnalyzerUnavailable(f"perf_analyzer does not start: {probe.stderr.strip()}")
    return analyzer
