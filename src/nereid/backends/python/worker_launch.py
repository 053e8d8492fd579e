"""Starting Python-backend worker processes: their command line and environment, and a small pool of spare workers
started ahead of need, already past the interpreter's start and the common imports and waiting for INIT.

Most of a Python model's cold start is the worker's own start (about 0.3-0.5 s of interpreter start and numpy,
pb_utils and protocol imports, against milliseconds for a typical initialize()); a load that takes a spare skips it.
Spares are started with subprocess like any worker, never forked from the server, and every model here runs in the
server's own Python environment, so a spare fits any of them. This module starts processes; it never talks to them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import nereid
from nereid.backends.python.arena import create_arena_fd

__all__ = ["LaunchedWorker", "SpareWorkers", "launch_worker", "worker_command", "worker_env"]

log = logging.getLogger("nereid.backends.python")

_WORKER_MODULE = "nereid.backends.python.worker"
_env: dict[str, str] | None = None


def worker_env() -> dict[str, str]:
    """The server's environment, with nereid importable and unbuffered output (model prints reach the log)."""
    global _env
    if _env is None:
        env = dict(os.environ)
        source = str(Path(nereid.__file__).resolve().parent.parent)
        existing = env.get("PYTHONPATH")
        env["PYTHONPATH"] = source + (os.pathsep + existing if existing else "")
        env["PYTHONUNBUFFERED"] = "1"
        _env = env
    return _env


def worker_command(socket_fd: int, in_fd: int = -1, out_fd: int = -1) -> list[str]:
    return [
        sys.executable,
        "-m",
        _WORKER_MODULE,
        "--socket-fd",
        str(socket_fd),
        "--in-fd",
        str(in_fd),
        "--out-fd",
        str(out_fd),
        "--parent-pid",
        str(os.getpid()),
    ]


@dataclass(slots=True)
class LaunchedWorker:
    """A worker process just started (or waiting as a spare): the server's end of its channel and its two arenas."""

    process: subprocess.Popen[bytes]
    channel: socket.socket
    in_fd: int
    out_fd: int

    def discard(self) -> None:
        """End a worker that never served: kill it, reap it, close what the server held of it."""
        if self.process.poll() is None:
            self.process.kill()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self.channel.close()
        for fd in (self.in_fd, self.out_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def launch_worker(label: str) -> LaunchedWorker:
    """Start a worker with a socket pair and two fresh arenas; OSError when the process cannot start."""
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    in_fd = out_fd = -1
    try:
        in_fd = create_arena_fd(f"nereid-{label}-in")
        out_fd = create_arena_fd(f"nereid-{label}-out")
        command = worker_command(child_end.fileno(), in_fd, out_fd)
        process = subprocess.Popen(
            command, pass_fds=(child_end.fileno(), in_fd, out_fd), stdin=subprocess.DEVNULL, env=worker_env()
        )
    except OSError:
        parent_end.close()
        for fd in (in_fd, out_fd):
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        child_end.close()
    return LaunchedWorker(process, parent_end, in_fd, out_fd)


class SpareWorkers:
    """Up to `size` workers started ahead of need. A load takes one (or starts its own when none is left) and, once
    its model is up, asks for the pool to be filled again, so that a new spare's imports do not compete for the CPU
    with the load that took the last one."""

    def __init__(self) -> None:
        self.size = 0
        self._spares: deque[LaunchedWorker] = deque()
        self._refill_scheduled = False

    def resize(self, size: int) -> None:
        self.size = max(0, size)
        while len(self._spares) > self.size:
            self._spares.pop().discard()

    def take(self) -> LaunchedWorker | None:
        """A spare that is still alive, or None."""
        while self._spares:
            spare = self._spares.popleft()
            if spare.process.poll() is None:
                return spare
            spare.discard()
        return None

    def refill_soon(self) -> None:
        """Start the missing spares on the next turn of the event loop (starting a process takes milliseconds; its
        imports then run in the new process)."""
        if self._refill_scheduled or len(self._spares) >= self.size:
            return
        self._refill_scheduled = True
        asyncio.get_running_loop().call_soon(self._refill)

    def _refill(self) -> None:
        self._refill_scheduled = False
        while len(self._spares) < self.size:
            try:
                self._spares.append(launch_worker("spare"))
            except OSError as exc:
                log.warning("cannot start a spare Python backend worker: %s", exc)
                return

    @property
    def waiting(self) -> int:
        return len(self._spares)

    def close(self) -> None:
        """End every spare (the server stops)."""
        self.size = 0
        while self._spares:
            self._spares.pop().discard()
