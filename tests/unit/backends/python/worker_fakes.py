"""Fakes for the Python backend's worker side, in this process: the server's end of a worker's channel (a socket pair
and the two arenas, spoken as the server speaks them) and a model.py written into a version folder."""

from __future__ import annotations

import json
import select
import socket
import textwrap
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from nereid.backends.python.arena import read_array
from nereid.backends.python.channel import BlockingChannel
from nereid.backends.python.protocol import (
    CONSUMED,
    CONTROL_BYTES,
    REPLIES_TAKEN,
    Message,
    TensorMeta,
    WireRequest,
    encode,
    split_frames,
)
from tests.unit.backends.python.fakes import arenas

__all__ = ["ADD_SUB_CONFIG", "ServerEnd", "model_args", "write_model"]


class ServerEnd:
    """The server's end of one worker: the worker's BlockingChannel on one side of a socket pair, this on the other,
    and the arenas (inputs written here, outputs written by the worker)."""

    def __init__(self) -> None:
        worker_sock, self.sock = socket.socketpair()
        self.channel = BlockingChannel(worker_sock)
        self.inputs, self.outputs = arenas()
        self.inputs.head = CONTROL_BYTES
        self._buf = bytearray()
        self._pending: deque[Message] = deque()

    def send(self, message: Message) -> None:
        self.sock.sendall(encode(message))

    def read(self, timeout: float = 5.0) -> Message:
        """The next message the worker sent (fails the test after `timeout` seconds without one)."""
        while not self._pending:
            messages, used = split_frames(self._buf)
            del self._buf[:used]
            self._pending.extend(messages)
            if messages:
                break
            ready, _, _ = select.select([self.sock], [], [], timeout)
            assert ready, "the worker sent nothing"
            chunk = self.sock.recv(1 << 16)
            assert chunk, "the worker closed the channel"
            self._buf += chunk
        return self._pending.popleft()

    def nothing_sent(self, wait: float = 0.05) -> bool:
        ready, _, _ = select.select([self.sock], [], [], wait)
        return not ready and not self._buf and not self._pending

    def put(self, name: str, array: np.ndarray, datatype: str) -> TensorMeta:
        """Write a tensor into the input arena, as the server writes a request's inputs or a BLS response's outputs."""
        data = np.ascontiguousarray(array).tobytes()
        offset = self.inputs.alloc(len(data))
        self.inputs.mm[offset : offset + len(data)] = data
        return (name, datatype, tuple(array.shape), offset, len(data))

    def wire_request(
        self,
        rid: str,
        inputs: dict[str, np.ndarray],
        requested: tuple[str, ...] | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> WireRequest:
        metas = tuple(self.put(name, array, "FP32") for name, array in inputs.items())
        return (rid, 0, 0, 0, parameters or {}, requested, metas)

    def output(self, meta: TensorMeta) -> np.ndarray:
        """A tensor the worker wrote into the output arena."""
        _, dtype, shape, offset, nbytes = meta
        return read_array(self.outputs.mm, dtype, shape, offset, nbytes, copy=True)

    def consumed(self, oseq: int) -> None:
        """Tell the worker the server has read its messages up to `oseq` (their output space may be reused)."""
        CONSUMED.pack_into(self.inputs.mm, 0, oseq)

    def replies_taken(self) -> int:
        return int(REPLIES_TAKEN.unpack_from(self.outputs.mm, 0)[0])

    def close(self) -> None:
        self.sock.close()
        self.channel._sock.close()
        self.inputs.close()
        self.outputs.close()


ADD_SUB_CONFIG = {
    "name": "m",
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32"}, {"name": "INPUT1", "data_type": "TYPE_FP32"}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32"}, {"name": "OUTPUT1", "data_type": "TYPE_FP32"}],
}


def write_model(tmp_path: Path, source: str) -> tuple[str, str]:
    """A version folder holding `source` as its model.py; (model file, version folder)."""
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True, exist_ok=True)
    model_file = version / "model.py"
    model_file.write_text(textwrap.dedent(source))
    return str(model_file), str(version)


def model_args(config: dict[str, Any] | None = None, instance: str = "m_0") -> dict[str, str]:
    """The args a worker's initialize() gets (what the server's Init carries)."""
    return {
        "model_config": json.dumps(config or ADD_SUB_CONFIG),
        "model_instance_name": instance,
        "model_name": "m",
        "model_version": "1",
    }
