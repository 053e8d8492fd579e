"""The fork server: a process that has imported everything a Python-backend worker needs and forks a new worker on
request, in milliseconds instead of the half second of a fresh interpreter and its imports.

Started by the server as `python -m nereid.backends.python.fork_server --socket-fd N --parent-pid P`. It imports the
worker's modules (numpy, pb_utils, the channel, the model worker, asyncio), freezes what it imported out of the
collector's reach (so a worker's collections do not touch, and so copy, the pages it shares with its siblings), says
it is ready with one byte, then answers requests on its socket: each is a label and three descriptors (the worker's
end of its channel and its two arenas) passed with SCM_RIGHTS, and each answer is the new worker's pid.

Every worker is forked twice, so that it is orphaned at once and adopted by the server, which is a child subreaper:
the server can then wait for it, read its exit status and be its parent for PR_SET_PDEATHSIG, exactly as for a worker
it started itself. The fork server runs no thread of its own and never imports a model: each worker imports its
model after the fork, and reseeds numpy's global generator, as a fresh process would have its own.
"""

from __future__ import annotations

import argparse
import array
import ctypes
import gc
import os
import signal
import socket
import struct
import sys
import time

__all__ = ["ANSWER", "FORK_SERVER_NAME", "FORKED_WORKER_NAME", "MAX_LABEL", "READY", "main"]

READY = b"R"
ANSWER = struct.Struct("=i")  # the new worker's pid, or -1 when it could not be forked
MAX_LABEL = 256
_FDS_PER_WORKER = 3
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
# The process names `ps -o comm`, top and psutil's name() show (a forked worker's command line is the fork server's).
FORK_SERVER_NAME = "nereid-forksrv"
FORKED_WORKER_NAME = "nereid-worker"
# How long a new worker waits to be adopted by the server once its first parent has exited (it exits at once).
_ADOPTION_TIMEOUT_S = 5.0


def _prctl(option: int, value: int | bytes) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: end-of-file on the socket still ends the fork server, and names are cosmetic


def _die_with_parent(parent_pid: int) -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(0)


def _become_worker(fds: list[int], parent_pid: int) -> None:
    """In the grandchild: wait to be adopted by the server, then serve as an ordinary worker. Never returns."""
    code = 0
    try:
        deadline = time.monotonic() + _ADOPTION_TIMEOUT_S
        while os.getppid() != parent_pid:
            if time.monotonic() > deadline:
                os._exit(3)  # not adopted: the server is not a subreaper (or is gone); it sees the worker fail
            time.sleep(0.0002)
        _prctl(_PR_SET_NAME, FORKED_WORKER_NAME.encode())
        import numpy

        numpy.random.seed()  # `random` reseeds itself after a fork; numpy's global generator does not
        from nereid.backends.python import worker

        socket_fd, in_fd, out_fd = fds
        worker.run(socket_fd, in_fd, out_fd, parent_pid)
    except BaseException:
        code = 1
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _fork_worker(server: socket.socket, fds: list[int], parent_pid: int) -> int:
    """Fork a worker on `fds` (twice, so that the server adopts it); its pid, or -1."""
    read_end, write_end = os.pipe()
    try:
        first = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return -1
    if first == 0:
        os.close(read_end)
        try:
            worker = os.fork()
        except OSError:
            os._exit(1)
        if worker == 0:
            os.close(write_end)
            server.close()
            _become_worker(fds, parent_pid)
        os.write(write_end, ANSWER.pack(worker))
        os._exit(0)
    os.close(write_end)
    try:
        answer = os.read(read_end, ANSWER.size)
    finally:
        os.close(read_end)
        os.waitpid(first, 0)
    return ANSWER.unpack(answer)[0] if len(answer) == ANSWER.size else -1


def _serve(server: socket.socket, parent_pid: int) -> None:
    room = socket.CMSG_SPACE(_FDS_PER_WORKER * array.array("i").itemsize)
    while True:
        label, ancillary, _flags, _address = server.recvmsg(MAX_LABEL, room)
        if not label:
            return  # the server closed its end
        fds: list[int] = []
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array("i")
                received.frombytes(data[: len(data) - len(data) % received.itemsize])
                fds.extend(received)
        try:
            pid = _fork_worker(server, fds, parent_pid) if len(fds) == _FDS_PER_WORKER else -1
        finally:
            for fd in fds:
                os.close(fd)  # the worker has its own copies now
        server.sendall(ANSWER.pack(pid))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="nereid-python-fork-server")
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent_pid)
    _prctl(_PR_SET_NAME, FORK_SERVER_NAME.encode())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when its workers stop, as for any worker
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.argv = [""]
    # What a worker imports before its model: paid once here instead of once per worker.
    import asyncio  # noqa: F401  (a model with `async def execute` runs on a loop)

    import numpy  # noqa: F401

    from nereid.backends.python import worker  # noqa: F401

    gc.collect()
    gc.freeze()
    server = socket.socket(fileno=args.socket_fd)
    server.sendall(READY)
    try:
        _serve(server, args.parent_pid)
    except OSError:
        pass  # the server is gone
    os._exit(0)


if __name__ == "__main__":
    main()
