"""What pb_utils talks to: `current` is the worker's runtime once the worker binds it, and before that a stand-in
that refuses what needs a server (a model file imported in a test). Runs in the worker: no server imports."""

from __future__ import annotations

import sys
from typing import Any

from nereid.backends.python.channel import CallError
from nereid.backends.python.pb_errors import TritonModelException

__all__ = ["current", "bind", "call"]


class _Detached:
    """What this module talks to before a worker binds it (for example when a model file is imported in a test)."""

    version_dir = ""
    in_execute = False

    def log(self, level: int, message: str, filename: str, lineno: int) -> None:
        sys.stderr.write(f"{filename}:{lineno}] {message}\n")

    def metric_op(self, op: tuple[Any, ...]) -> None:
        raise TritonModelException("custom metrics work only inside a model served by the Python backend")

    def call(self, kind: str, payload: Any) -> Any:
        raise TritonModelException("this call works only inside a model served by the Python backend")

    def send_response(self, request: Any, response: Any, flags: int) -> None:
        raise TritonModelException("response senders work only inside a model served by the Python backend")

    def is_cancelled(self, request: Any) -> bool:
        return False

    def repository_call(self, kind: str, payload: Any, action: str) -> Any:
        raise TritonModelException(f"{action}_model works only inside a model served by the Python backend")

    def bls(self, request: Any, decoupled: bool) -> Any:
        raise TritonModelException("BLS requests work only inside a model served by the Python backend")

    def bls_async(self, request: Any, decoupled: bool) -> Any:
        raise TritonModelException("BLS requests work only inside a model served by the Python backend")


current: Any = _Detached()


def bind(runtime: Any) -> None:
    """Plug in the worker's runtime (worker_runtime.Runtime): from now on pb_utils talks to the server."""
    global current
    current = runtime


def call(kind: str, payload: Any, what: str) -> Any:
    """A call to the server; its error raised as TritonModelException("<what>: <the server's message>")."""
    try:
        return current.call(kind, payload)
    except CallError as exc:
        raise TritonModelException(f"{what}: {exc.message}") from None
