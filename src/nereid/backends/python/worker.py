"""The Python-backend worker process: one per model instance, running a Triton `model.py` unmodified.

Started by the server as `python -m nereid.backends.python.worker --socket-fd N ...` with one end of a socket pair
and two shared-memory arenas (inputs written by the server, outputs written here). It installs `pb_utils` as
`triton_python_backend_utils`, answers one AutoComplete or Init message, then hands the channel to `ModelWorker`
until the server closes it. It dies with the server: PR_SET_PDEATHSIG, end-of-file on the socket, and a parent-pid
watchdog. This module is the entry point only: serving batches is `model_worker`'s job.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time
from functools import partial

from nereid.backends.python import pb_utils
from nereid.backends.python.arena import Arena
from nereid.backends.python.bls_client import exec_async, exec_blocking
from nereid.backends.python.channel import BlockingChannel
from nereid.backends.python.model_worker import ModelWorker, exit_now, format_exception, import_model, model_class
from nereid.backends.python.protocol import INTERNAL_CODE, AutoComplete, Completed, Init, Ready
from nereid.backends.python.worker_runtime import ModelWorkerHooks, Runtime

__all__ = ["main", "run"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """Exit when the server exits, however it exits (even SIGKILL)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the watchdog below and end-of-file on the socket still apply
    if os.getppid() != parent_pid:
        os._exit(0)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="nereid-parent-watchdog", daemon=True).start()



def _auto_complete(channel: BlockingChannel, message: AutoComplete) -> None:
    config_json, model_file, version_dir = message
    try:
        cls = model_class(import_model(model_file, version_dir), model_file)
        hook = getattr(cls, "auto_complete_config", None)
        if hook is None:
            channel.send(Completed(None, config_json))
            return
        config = pb_utils.ModelConfig(config_json)
        completed = hook(config)
        if completed is None:
            completed = config
        channel.send(Completed(None, json.dumps(completed.as_dict())))
    except Exception as exc:
        channel.send(Completed((INTERNAL_CODE, format_exception(exc)), ""))



def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="nereid-python-worker")
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--in-fd", type=int, default=-1)
    parser.add_argument("--out-fd", type=int, default=-1)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    run(args.socket_fd, args.in_fd, args.out_fd, args.parent_pid)


def run(socket_fd: int, in_fd: int, out_fd: int, parent_pid: int) -> None:
    """Be a worker on these descriptors until the server closes the channel (a started or a forked worker alike)."""
    _die_with_parent(parent_pid)
    # The server decides when a worker stops: Ctrl-C or a SIGTERM to the process group must not cut a batch short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.argv = [""]
    sys.modules["triton_python_backend_utils"] = pb_utils
    channel = BlockingChannel(socket.socket(fileno=socket_fd))
    first = channel.recv()
    if first is None:
        exit_now(0)
        return
    if isinstance(first, AutoComplete):
        pb_utils._bind(Runtime(channel, first.version_dir))
        _auto_complete(channel, first)
        exit_now(0)
        return
    if not isinstance(first, Init):
        exit_now(2)
        return
    init_args, model_file, version_dir = first
    runtime = Runtime(channel, version_dir)
    pb_utils._bind(runtime)
    worker = ModelWorker(channel, runtime, Arena(in_fd), Arena(out_fd))
    runtime.attach(
        ModelWorkerHooks(
            instance_name=init_args["model_instance_name"],
            bls=partial(exec_blocking, worker),
            bls_async=partial(exec_async, worker),
            send_response=worker.send_response,
        )
    )
    try:
        worker.initialize(init_args, model_file, version_dir)
    except Exception as exc:
        runtime.flush_ops()
        channel.send(Ready((INTERNAL_CODE, format_exception(exc)), os.getpid(), False, False))
        exit_now(0)
        return
    runtime.flush_ops()
    has_is_ready = callable(getattr(worker.model, "is_ready", None))
    channel.send(Ready(None, os.getpid(), has_is_ready, not (worker.async_execute or worker.decoupled)))
    worker.serve()


if __name__ == "__main__":
    main()
