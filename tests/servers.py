"""Start real `nereid serve` (and real Triton) processes on free ports for tests and benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests import reference_triton

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["RunningServer", "free_port", "start_nereid", "start_real_triton", "reference_ready", "ROOT"]


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` different free ports: each socket stays bound until all are chosen, so that the system cannot hand
    the same port out twice (a server given one port for two listeners refuses to start)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class RunningServer:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.extra.get("process_group"):
            # Real Triton's Python stubs live in the server's process group: none may outlive a test.
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return self.process.returncode


def _wait_live(server: RunningServer, timeout: float, need_ready: bool) -> None:
    deadline = time.monotonic() + timeout
    path = "/v2/health/ready" if need_ready else "/v2/health/live"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()}")
        try:
            if requests.get(server.base + path, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server did not become {'ready' if need_ready else 'live'} in {timeout}s:\n{server.log()}")


# How a `nereid serve` whose port another process took first fails to start (see start_nereid).
_PORT_TAKEN = "address already in use"


def start_nereid(
    repository: Path | str | list[Path | str],
    *args: str,
    log_dir: Path | None = None,
    timeout: float = 60,
    need_ready: bool = True,
    env: dict[str, str] | None = None,
) -> RunningServer:
    """Start `python -m nereid serve` on free ports (with `env` added to this process's environment); waits until
    ready (or live). The ports are free when chosen, but the server binds them only once its models have loaded,
    seconds later, and another test process may take one meanwhile: a start that fails on that is tried again on new
    ports."""
    for _ in range(2):
        try:
            return _start_nereid(repository, args, log_dir, timeout, need_ready, env)
        except RuntimeError as exc:
            if _PORT_TAKEN not in str(exc):
                raise
    return _start_nereid(repository, args, log_dir, timeout, need_ready, env)


def _start_nereid(
    repository: Path | str | list[Path | str],
    args: tuple[str, ...],
    log_dir: Path | None,
    timeout: float,
    need_ready: bool,
    env: dict[str, str] | None = None,
) -> RunningServer:
    repositories = repository if isinstance(repository, list) else [repository]
    http_port, grpc_port, metrics_port = free_ports(3)
    log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    log_path = log_dir / f"nereid-{http_port}.log"
    command = [sys.executable, "-m", "nereid", "serve"]
    for repo in repositories:
        command += ["--model-repository", str(repo)]
    command += [
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        *args,
    ]
    with open(log_path, "wb") as log_file:
        environment = {**os.environ, **env} if env else None
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, cwd=ROOT, env=environment)
    server = RunningServer(process, http_port, grpc_port, metrics_port, log_path)
    _wait_live(server, timeout, need_ready)
    return server


# Real Triton 2.51's Python backend can abort while its stubs start under heavy load (a boost::interprocess
# lock_exception in the stubs' shared memory, seen under two test workers beside a benchmark): a start that dies
# of it is tried once more. Any other failure to start is reported at once.
_TRITON_START_RACE = "boost::interprocess::lock_exception"


def reference_ready() -> bool:
    """Whether the real Triton reference is set up (it is, after this call, where the machine allows); for
    benchmarks that run Nereid alone without it. Tests use `reference_triton.require()` (the differential mark)."""
    try:
        reference_triton.install()
    except reference_triton.ReferenceUnavailable as exc:
        print(f"real Triton reference unavailable: {exc}", file=sys.stderr)
        return False
    return True


def start_real_triton(repository: Path | str, *args: str, timeout: float = 120, need_ready: bool = True) -> RunningServer:
    """Start the real tritonserver (tests/reference_triton.py, set up on first use) on free ports."""
    try:
        return _start_real_triton(repository, *args, timeout=timeout, need_ready=need_ready)
    except RuntimeError as exc:
        if _TRITON_START_RACE not in str(exc):
            raise
    return _start_real_triton(repository, *args, timeout=timeout, need_ready=need_ready)


def _start_real_triton(repository: Path | str, *args: str, timeout: float, need_ready: bool) -> RunningServer:
    reference = reference_triton.install()
    http_port, grpc_port, metrics_port = free_ports(3)
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"triton-{http_port}.log"
    command = reference.command(
        "--model-repository",
        str(repository),
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        *args,
    )
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=reference.environment(), start_new_session=True
        )
    server = RunningServer(process, http_port, grpc_port, metrics_port, log_path, {"process_group": "1"})
    try:
        _wait_live(server, timeout, need_ready)
    except RuntimeError:
        server.stop(signal.SIGKILL)  # and its process group: no stub of a failed start may linger
        raise
    return server
