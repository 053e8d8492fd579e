"""A model's static auto_complete_config, run in a short-lived worker so that model code never runs in the server.

The worker gets one AutoComplete message and answers with Completed; its log records reach the server's log, and
calls into the server are refused (nothing is loaded yet). This module only runs the hook: parsing the result into
the model's config is the backend's job.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from nereid.backends.base import ModelContext
from nereid.backends.python.channel import BlockingChannel
from nereid.backends.python.execution_env import execution_env_of
from nereid.backends.python.process import EXIT_TIMEOUT_S, describe_exit
from nereid.backends.python.protocol import AutoComplete, Call, CallReply, Completed, Log
from nereid.backends.python.worker_launch import worker_command, worker_interpreter
from nereid.backends.python.worker_process import log_model_record
from nereid.core.errors import NereidError

__all__ = ["may_auto_complete", "run_auto_complete"]

_HOOK = "auto_complete_config"
_AUTO_COMPLETE_TIMEOUT_S = 120.0
_UNAVAILABLE_CODE = 4


def may_auto_complete(version_path: Path, model_file: Path) -> bool:
    """Whether the model's code mentions auto_complete_config: starting a worker to find out costs a process."""
    files = [model_file, *version_path.glob("*.py")]
    for path in files:
        try:
            if _HOOK in path.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def run_auto_complete(context: ModelContext, config_json: str) -> str:
    """Run the model's auto_complete_config in a short-lived worker; returns the completed config as JSON."""
    model_file = context.model_file("model.py")
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # A worker without arenas: it never executes.
        python, variables = worker_interpreter(execution_env_of(context))
        process = subprocess.Popen(
            worker_command(child_sock.fileno(), python=python), pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL,
            env=variables,
        )  # fmt: skip
    finally:
        child_sock.close()
    parent_sock.settimeout(_AUTO_COMPLETE_TIMEOUT_S)
    channel = BlockingChannel(parent_sock)
    prefix = f"model '{context.name}': auto_complete_config"
    try:
        channel.send(AutoComplete(config_json, str(model_file), str(context.version_path)))
        while True:
            try:
                message = channel.recv()
            except TimeoutError:
                raise NereidError.unavailable(f"{prefix} did not finish in {_AUTO_COMPLETE_TIMEOUT_S:.0f}s") from None
            if message is None:
                code = process.wait(EXIT_TIMEOUT_S)
                raise NereidError.unavailable(f"{prefix}: the Python backend worker {describe_exit(code)}")
            if isinstance(message, Log):
                log_model_record(message)
            elif isinstance(message, Call):
                channel.send(
                    CallReply(message.call_id, (_UNAVAILABLE_CODE, "not available while the configuration is auto-completed"), None)
                )
            elif isinstance(message, Completed):
                break
        if message.error is not None:
            raise NereidError.invalid(f"{prefix} failed: {message.error[1]}")
        return str(message.config_json)
    finally:
        channel.close()
        try:
            process.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
