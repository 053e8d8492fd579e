"""Fakes for the Python backend's server side: model contexts and requests, a worker process that records what
happens to it, real arenas (memory files, no worker behind them), and frames read back from a fake transport."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from nereid.backends.base import InstanceSpec, ModelContext
from nereid.backends.python.arena import Arena, create_arena_fd
from nereid.backends.python.protocol import Message, split_frames
from nereid.config.model_config import parse_pbtxt
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor

__all__ = [
    "FakeProcess",
    "arenas",
    "context",
    "instance_spec",
    "recorded",
    "request",
    "sent_messages",
]


def context(tmp_path: Path, decoupled: bool = False, server: Any = None, name: str = "m") -> ModelContext:
    """A model version whose folder holds an (empty) model.py."""
    version = tmp_path / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text("")
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    config = parse_pbtxt(f'name: "{name}" backend: "python" max_batch_size: 8 {policy}', name)
    return ModelContext(name, 1, config, tmp_path / name, version, tmp_path, server=server)


def instance_spec(name: str = "m_0") -> InstanceSpec:
    return InstanceSpec(name, "m", "CPU", 0, 0)


def request(rid: str = "r", timeout_us: int = 0, parameters: dict[str, Any] | None = None) -> InferenceRequest:
    """A request of two FP32 [1, 4] inputs whose responses are kept in `request.responses` (see `recorded`)."""
    inputs = [
        InputTensor("INPUT0", "FP32", (1, 4), np.arange(4, dtype=np.float32).reshape(1, 4)),
        InputTensor("INPUT1", "FP32", (1, 4), np.full((1, 4), 2, dtype=np.float32)),
    ]
    made = InferenceRequest("m", "1", inputs, id=rid, timeout_us=timeout_us, parameters=parameters or {})
    return made


def recorded(req: InferenceRequest) -> list[InferenceResponse]:
    """Keep every response the request is answered with; the list to look at."""
    responses: list[InferenceResponse] = []
    req.respond = responses.append
    return responses


def arenas() -> tuple[Arena, Arena]:
    """A fresh input and output arena (1 MiB memory files)."""
    return Arena(create_arena_fd("test-in")), Arena(create_arena_fd("test-out"))


def sent_messages(transport: Any) -> list[Message]:
    """The messages written to a FakeTransport since the last call."""
    messages, used = split_frames(bytes(transport.written))
    assert used == len(transport.written)
    transport.written.clear()
    return messages


class FakeProcess:
    """A worker's process without a process: it 'exits' when killed or told to, and `on_kill` runs when killed
    (for example closing its end of the channel, as a real death would). pid 0 is never a real worker's, so
    `wait_exit` cannot open a pidfd for it and waits through `wait`."""

    def __init__(self) -> None:
        self.pid = 0
        self.returncode: int | None = None
        self.killed = 0
        self.on_kill: Any = None
        self._exited = threading.Event()

    def exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise TimeoutError("the fake process did not exit")
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        self.killed += 1
        self.exit(-9)
        if self.on_kill is not None:
            self.on_kill()
