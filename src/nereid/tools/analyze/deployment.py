"""Where variants run: a server analyze starts itself (`nereid serve --model-control-mode explicit` on free
ports, as a subprocess) or one already running in explicit mode, and the repository API that loads each
variant there (load with a `config` override, unload, index, config) over plain HTTP."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from nereid.tools import common
from nereid.tools.analyze.settings import AnalyzeError

__all__ = ["RepositoryClient", "TargetServer", "connect_server", "start_server", "split_host_port"]


def split_host_port(url: str, default_port: int, flag: str = "--url") -> tuple[str, int]:
    """`host[:port]` of a flag, refused as an AnalyzeError (see tools.common.split_host_port)."""
    try:
        return common.split_host_port(url, default_port, flag)
    except common.AddressError as exc:
        raise AnalyzeError(str(exc)) from None


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class RepositoryClient:
    """The HTTP calls analyze needs besides inference; every failure is an `AnalyzeError` in one line."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url
        self.host, self.port = split_host_port(url, 8000)
        self.timeout = timeout

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float | None = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=payload, headers={"Content-Type": "application/json"} if payload else {})
            reply = conn.getresponse()
            raw = reply.read()
        except TimeoutError:
            raise AnalyzeError(f"the server at {self.url} did not answer {method} {path} within {timeout or self.timeout:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else (str(exc) or type(exc).__name__)
            raise AnalyzeError(f"cannot reach the server at {self.url}: {reason}") from None
        finally:
            conn.close()
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = {"error": raw[:200].decode("utf-8", "replace")}
        return reply.status, doc

    @staticmethod
    def _error(doc: Any, status: int) -> str:
        if isinstance(doc, dict) and doc.get("error"):
            return str(doc["error"])
        return f"HTTP {status}"

    def live(self) -> bool:
        try:
            status, _ = self._request("GET", "/v2/health/live", timeout=2.0)
        except AnalyzeError:
            return False
        return status == 200

    def check_live(self) -> None:
        status, doc = self._request("GET", "/v2/health/live")
        if status != 200:
            raise AnalyzeError(f"the server at {self.url} is not live: {self._error(doc, status)}")

    def index(self) -> list[dict[str, Any]]:
        status, doc = self._request("POST", "/v2/repository/index", {})
        if status != 200 or not isinstance(doc, list):
            raise AnalyzeError(f"cannot list the repository of the server at {self.url}: {self._error(doc, status)}")
        return doc

    def model_state(self, model: str) -> str | None:
        """READY, UNAVAILABLE, LOADING, "" (never loaded)... or None when the repository does not hold the model."""
        states = [str(e.get("state", "") or "") for e in self.index() if e.get("name") == model]
        if not states:
            return None
        return "READY" if "READY" in states else states[0]

    def load(self, model: str, config_json: str | None, timeout: float) -> None:
        body: dict[str, Any] = {"parameters": {"config": config_json}} if config_json is not None else {}
        status, doc = self._request("POST", f"/v2/repository/models/{quote(model, safe='')}/load", body, timeout=timeout)
        if status != 200:
            raise AnalyzeError(self._error(doc, status))

    def unload(self, model: str, timeout: float) -> None:
        status, doc = self._request("POST", f"/v2/repository/models/{quote(model, safe='')}/unload", {}, timeout=timeout)
        if status != 200:
            raise AnalyzeError(self._error(doc, status))
        # Triton may answer before the model has finished unloading; wait for the index to say so.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.model_state(model) not in ("READY", "UNLOADING"):
                return
            time.sleep(0.05)

    def model_config(self, model: str) -> dict[str, Any]:
        status, doc = self._request("GET", f"/v2/models/{quote(model, safe='')}/config")
        if status != 200 or not isinstance(doc, dict):
            raise AnalyzeError(f"cannot read the config of model '{model}': {self._error(doc, status)}")
        return doc


@dataclass(slots=True)
class TargetServer:
    """A server analyze measures against. `process` is set when analyze started it (and must stop it)."""

    http_url: str
    grpc_url: str
    metrics_url: str
    pid: int | None  # the server's process, when known (started here, or found listening on a local port)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    description: str = ""

    @property
    def owned(self) -> bool:
        return self.process is not None

    def exited(self) -> str | None:
        """Why the server analyze started is gone (with the last line of its log), or None while it runs."""
        if self.process is None or self.process.poll() is None:
            return None
        return f"the server analyze started exited with status {self.process.returncode}{_last_log_line(self.log_path)}"

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _last_log_line(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return f": {lines[-1].strip()[:300]} (log: {path})" if lines else f" (log: {path})"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(repository: Path, log_path: Path, timeout: float) -> TargetServer:
    """Start `nereid serve` in explicit mode on free local ports; returns once it answers /v2/health/live."""
    http_port, grpc_port, metrics_port = _free_port(), _free_port(), _free_port()
    command = [
        sys.executable,
        "-m",
        "nereid",
        "serve",
        "--model-repository",
        str(repository),
        "--model-control-mode",
        "explicit",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--metrics-interval-ms=500",
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = TargetServer(
        http_url=f"127.0.0.1:{http_port}",
        grpc_url=f"127.0.0.1:{grpc_port}",
        metrics_url=f"127.0.0.1:{metrics_port}",
        pid=process.pid,
        process=process,
        log_path=log_path,
        description=f"nereid serve started by analyze (HTTP 127.0.0.1:{http_port}, explicit model control)",
    )
    client = RepositoryClient(server.http_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reason = server.exited()
        if reason is not None:
            raise AnalyzeError(reason)
        if client.live():
            return server
        time.sleep(0.1)
    server.stop()
    raise AnalyzeError(f"the server analyze started did not become live within {timeout:g} s (log: {log_path})")


def connect_server(url: str, grpc_url: str, metrics_url: str) -> TargetServer:
    """A running server: check it answers, and find its process when it listens on this machine."""
    host, port = split_host_port(url, 8000)
    grpc = grpc_url or _join(host, 8001)
    split_host_port(grpc, 8001, "--grpc-url")
    metrics = metrics_url or _join(host, 8002)
    split_host_port(metrics, 8002, "--metrics-url")
    client = RepositoryClient(_join(host, port))
    client.check_live()
    return TargetServer(
        http_url=_join(host, port),
        grpc_url=grpc,
        metrics_url=metrics,
        pid=_local_listener_pid(host, port),
        description=f"the server at {_join(host, port)}",
    )


def _local_listener_pid(host: str, port: int) -> int | None:
    """The process listening on a local port (psutil), or None for a remote host or when it cannot be seen."""
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
    except OSError:
        return None
    local = {"127.0.0.1", "::1", "0.0.0.0", "::"}
    try:
        local |= {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        pass
    if not addresses & local:
        return None
    import psutil

    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    return None
