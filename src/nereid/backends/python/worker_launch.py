"""Starting Python-backend worker processes: their command line and environment, the fork server that makes a worker
in milliseconds, and a small pool of spare workers started ahead of need, waiting for INIT.

Most of a Python model's cold start is the worker's own start (about 0.3-0.5 s of interpreter start and numpy,
pb_utils and protocol imports, against milliseconds for a typical initialize()). Two things skip it: a load that takes
a spare, and a worker forked from the fork server (`fork_server.py`), a process past those imports. A worker is never
forked from the server itself (its threads and its loop must not be copied). A spare or a forked worker runs in the
server's own Python environment and fits any model but one with an environment of its own (`execution_env.py`), whose
workers start from that environment's interpreter. This module starts processes; it never talks to them once they
run.
"""

from __future__ import annotations

import array
import asyncio
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import nereid
from nereid.backends.python.arena import create_arena_fd
from nereid.backends.python.execution_env import ExecutionEnv
from nereid.backends.python.fork_server import ANSWER, MAX_LABEL, READY

__all__ = [
    "FORK_SERVER_START_TIMEOUT_S",
    "ForkServer",
    "ForkedProcess",
    "LaunchedWorker",
    "SpareWorkers",
    "WorkerProcess",
    "launch_worker",
    "worker_command",
    "worker_env",
    "worker_interpreter",
]

log = logging.getLogger("nereid.backends.python")

_WORKER_MODULE = "nereid.backends.python.worker"
_FORK_SERVER_MODULE = "nereid.backends.python.fork_server"
_PR_SET_CHILD_SUBREAPER = 36
# A fork takes milliseconds; past this the fork server is taken for broken and workers start the slow way.
_FORK_ANSWER_TIMEOUT_S = 5.0
# A load waits at most this long for a starting fork server's imports before it starts its worker the slow way.
FORK_SERVER_START_TIMEOUT_S = 30.0
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


def worker_interpreter(execution_env: ExecutionEnv | None) -> tuple[str, dict[str, str]]:
    """The interpreter a worker runs and its environment variables: the server's, or the model's own environment's."""
    if execution_env is None:
        return sys.executable, worker_env()
    return str(execution_env.python), execution_env.worker_env()


def worker_command(socket_fd: int, in_fd: int = -1, out_fd: int = -1, python: str = sys.executable) -> list[str]:
    return [
        python,
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


class WorkerProcess(Protocol):
    """What the backend uses of a worker's process: `subprocess.Popen`'s members, which `ForkedProcess` has too."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class ForkedProcess:
    """A worker forked by the fork server and adopted by this process (a child subreaper), so this process waits for
    it and reads its exit status as for one it started itself."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -signal.SIGKILL  # reaped elsewhere: it is gone, its status unknown
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return code

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ForkServer:
    """The server's side of the fork server: started when a Python model asks for it, it forks workers once it has
    imported what they need. Until it is ready, and if it ever fails, workers are started the ordinary way. The event
    loop watches its socket: the ready byte, and the end-of-file of a fork server that died (reaped at once, and
    replaced at the next load)."""

    def __init__(self) -> None:
        self.enabled = False
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._ready = False
        self._became_ready: asyncio.Future[None] | None = None
        # Forks asked for and not yet answered, in the order asked: the fork server answers them in turn.
        self._answers: deque[asyncio.Future[int]] = deque()
        self._unread = b""

    def enable(self, enabled: bool) -> None:
        """Turn the fork server on (started at once, in the background) or off. Only from the event loop's thread:
        PR_SET_PDEATHSIG ties the fork server's life to the thread that starts it."""
        if enabled and not self.enabled:
            self.enabled = self._adopt_orphans()
            if self.enabled:
                self._start()
        elif not enabled and self.enabled:
            self.enabled = False
            self.close()

    @staticmethod
    def _adopt_orphans() -> bool:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
                return True
        except (OSError, AttributeError):
            pass
        log.warning("the Python backend's fork server needs Linux (a child subreaper); workers start the slow way")
        return False

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        command = [sys.executable, "-m", _FORK_SERVER_MODULE, "--socket-fd", str(theirs.fileno()), "--parent-pid", str(os.getpid())]
        try:
            self._process = subprocess.Popen(command, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=worker_env())
        except OSError as exc:
            ours.close()
            log.warning("cannot start the Python backend's fork server: %s", exc)
            return
        finally:
            theirs.close()
        self._socket = ours
        self._ready = False
        self._unread = b""
        self._became_ready = loop.create_future()  # of the loop whose reader reads the socket
        loop.add_reader(ours.fileno(), self._readable)

    def _readable(self) -> None:
        """The ready byte once, then the answers to forks (read here, so a fork never blocks the loop), then the
        end-of-file of a fork server that died."""
        sock = self._socket
        if sock is None:
            return
        try:
            data = sock.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            log.warning("the Python backend's fork server exited; workers start the slow way until a load starts a new one")
            self.close()
            return
        if not self._ready:
            data = data[len(READY) :]
            self._ready = True
            if self._became_ready is not None and not self._became_ready.done():
                self._became_ready.set_result(None)
        self._unread += data
        while len(self._unread) >= ANSWER.size and self._answers:
            pid = ANSWER.unpack_from(self._unread)[0]
            self._unread = self._unread[ANSWER.size :]
            answer = self._answers.popleft()
            if not answer.done():
                answer.set_result(pid)
            elif pid > 0:  # its load was cancelled while it waited: nobody will use this worker
                _end_abandoned(pid)

    async def fork(self, label: str, channel: socket.socket, in_fd: int, out_fd: int) -> ForkedProcess | None:
        """A worker forked on these descriptors; None when the fork server is off, not ready yet, or broken. The
        answer is awaited, not read in a blocking call: on a loaded machine the fork server may wait milliseconds
        for a core, and a blocking read would hold the whole loop for as long."""
        sock = self._socket
        loop = asyncio.get_running_loop()
        started_here = self._became_ready is not None and self._became_ready.get_loop() is loop
        if not self.enabled or sock is None or not self._ready or not started_here:
            return None  # (or started under an embedding program's earlier loop, whose reader reads no answer)
        answer: asyncio.Future[int] = loop.create_future()
        try:
            fds = array.array("i", (channel.fileno(), in_fd, out_fd))
            sock.sendmsg([label.encode()[:MAX_LABEL] or b"w"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            self._answers.append(answer)
            async with asyncio.timeout(_FORK_ANSWER_TIMEOUT_S):
                pid = await answer
        except (OSError, TimeoutError) as exc:
            log.warning("the Python backend's fork server failed (%s); workers start the slow way until a load starts a new one", str(exc) or "no answer")
            if self._socket is sock:
                self.close()
            return None
        return ForkedProcess(pid) if pid > 0 else None

    async def wait_ready(self, timeout: float) -> None:
        """Wait (without blocking the loop) until the fork server has done its imports, starting a new one if the last
        one died, so that the load's worker is forked too: the wait costs a load no more than starting its worker the
        slow way beside those imports would."""
        if not self.enabled or self._ready:
            return
        if self._socket is None:
            self._start()
        if self._became_ready is None or self._became_ready.get_loop() is not asyncio.get_running_loop():
            return  # (a fork server started under an embedding program's earlier loop: its workers start the slow way)
        # Neither a timeout nor a fork server that dies meanwhile fails the load: its worker starts the slow way.
        await asyncio.wait({self._became_ready}, timeout=timeout)

    def close(self) -> None:
        """End the fork server (the workers it forked are the server's children and stay)."""
        sock, self._socket, self._ready = self._socket, None, False
        process, self._process = self._process, None
        waiting, self._became_ready = self._became_ready, None
        if waiting is not None and not waiting.done():
            waiting.cancel()
        while self._answers:  # forks never to be answered: their workers start the slow way
            answer = self._answers.popleft()
            if not answer.done():
                answer.set_exception(OSError("the fork server closed"))
        if sock is not None:
            try:
                asyncio.get_running_loop().remove_reader(sock.fileno())
            except RuntimeError:
                pass  # no loop any more: the server is ending
            sock.close()  # end-of-file: the fork server exits
        if process is not None:
            try:
                process.wait(2)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _end_abandoned(pid: int) -> None:
    """Kill and reap a forked worker that nobody took (it is this process's child, adopted as a subreaper). Rare (a
    load cancelled while its fork was under way), so a SIGKILLed process's exit is waited for in place."""
    process = ForkedProcess(pid)
    process.kill()
    try:
        process.wait(1.0)
    except subprocess.TimeoutExpired:
        log.warning("a forked Python backend worker (pid %d) did not exit after SIGKILL", pid)



@dataclass(slots=True)
class LaunchedWorker:
    """A worker process just started (or waiting as a spare): the server's end of its channel and its two arenas."""

    process: WorkerProcess
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


async def launch_worker(
    label: str, fork_server: ForkServer | None = None, execution_env: ExecutionEnv | None = None
) -> LaunchedWorker:
    """Start a worker with a socket pair and two fresh arenas (forked by `fork_server` when there is one and it is on
    and ready; from `execution_env`'s interpreter when the model has an environment of its own); OSError when the
    process cannot start."""
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    in_fd = out_fd = -1
    try:
        in_fd = create_arena_fd(f"nereid-{label}-in")
        out_fd = create_arena_fd(f"nereid-{label}-out")
        process: WorkerProcess | None = None
        if fork_server is not None and execution_env is None:
            process = await fork_server.fork(label, child_end, in_fd, out_fd)
        if process is None:
            python, env = worker_interpreter(execution_env)
            command = worker_command(child_end.fileno(), in_fd, out_fd, python)
            process = subprocess.Popen(
                command, pass_fds=(child_end.fileno(), in_fd, out_fd), stdin=subprocess.DEVNULL, env=env
            )
    except BaseException:  # OSError, or the load cancelled while its fork was under way
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
    with the load that took the last one. `launch` starts a worker (the owner's, which knows its fork server)."""

    def __init__(self, launch: Callable[[str], Awaitable[LaunchedWorker]] = launch_worker) -> None:
        self.size = 0
        self._launch = launch
        self._spares: deque[LaunchedWorker] = deque()
        self._refill_task: asyncio.Task[None] | None = None  # held, so that the loop does not drop it

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
        refilling = self._refill_task is not None and not self._refill_task.done()
        if refilling or len(self._spares) >= self.size:
            return
        self._refill_task = asyncio.get_running_loop().create_task(self._refill())

    async def _refill(self) -> None:
        while len(self._spares) < self.size:
            try:
                spare = await self._launch("spare")
            except OSError as exc:
                log.warning("cannot start a spare Python backend worker: %s", exc)
                return
            if len(self._spares) < self.size:
                self._spares.append(spare)
            else:  # the pool was resized or closed meanwhile
                spare.discard()

    @property
    def waiting(self) -> int:
        return len(self._spares)

    def close(self) -> None:
        """End every spare (the server stops)."""
        self.size = 0
        while self._spares:
            self._spares.pop().discard()
