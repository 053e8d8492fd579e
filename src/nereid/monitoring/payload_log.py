"""A sampled, bounded log of requests and responses for offline analysis, in rotating JSON-lines files: one object
per request with its time, model, version, latency, error, inputs and outputs (docs/monitoring.md has the schema).
Written by the monitor's thread; a slow or full disk drops records (counted), it never delays a request."""

from __future__ import annotations

import base64
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PayloadLog", "TensorLog", "payload_record"]

log = logging.getLogger("nereid.monitoring")

@dataclass(frozen=True, slots=True)
class TensorLog:
    """A tensor as served (`shape`) and the values kept of it (`values`: all of them, or its first rows)."""

    shape: tuple[int, ...]
    values: np.ndarray


def _tensor(tensor: TensorLog) -> dict[str, Any]:
    array = tensor.values
    entry: dict[str, Any] = {"shape": list(tensor.shape), "dtype": str(array.dtype)}
    if array.size < int(np.prod(tensor.shape)):  # only its first rows were kept: logged by shape and dtype
        entry["truncated"] = True
        return entry
    if array.dtype.kind in "OSU":
        entry["data"] = [
            v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v) for v in array.ravel().tolist()
        ]
    elif array.dtype.kind == "f":
        entry["data"] = [None if not np.isfinite(v) else v for v in array.ravel().tolist()]
    else:
        entry["data"] = array.ravel().tolist()
    return entry


def payload_record(
    at: float, model: str, version: str, request_id: str, latency_ms: float, error: str,
    inputs: dict[str, TensorLog], outputs: dict[str, TensorLog],
) -> dict[str, Any]:  # fmt: skip
    return {
        "time": at,
        "model": model,
        "version": version,
        "id": request_id,
        "latency_ms": round(latency_ms, 3),
        "error": error,
        "inputs": {name: _tensor(array) for name, array in inputs.items()},
        "outputs": {name: _tensor(array) for name, array in outputs.items()},
    }


class PayloadLog:
    """`payload.jsonl` in `folder`, rotated at `max_bytes` into payload.jsonl.1 ... .N (`backups`)."""

    def __init__(self, folder: str, max_bytes: int = 64 << 20, backups: int = 5) -> None:
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self.backups = backups
        self.written = 0
        self.dropped = 0
        self._file: Any = None
        self._size = 0

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, separators=(",", ":"), default=_base64) + "\n").encode()
        try:
            if self._file is None:
                self.folder.mkdir(parents=True, exist_ok=True)
                path = self.folder / "payload.jsonl"
                self._file = open(path, "ab")  # noqa: SIM115 (held open across writes, closed by close())
                self._size = path.stat().st_size
            if self._size + len(line) > self.max_bytes and self._size:
                self._rotate()
            self._file.write(line)
            self._file.flush()
            self._size += len(line)
            self.written += 1
        except OSError as exc:  # a full or failing disk loses the record, never the request
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("payload log in '%s' dropped %d records: %s", self.folder, self.dropped, exc)

    def _rotate(self) -> None:
        self._file.close()
        self._file = None
        base = self.folder / "payload.jsonl"
        for index in range(self.backups - 1, 0, -1):
            older = base.with_name(f"payload.jsonl.{index}")
            if older.exists():
                os.replace(older, base.with_name(f"payload.jsonl.{index + 1}"))
        if self.backups:
            os.replace(base, base.with_name("payload.jsonl.1"))
        else:
            base.unlink()
        self._file = open(base, "ab")  # noqa: SIM115
        self._size = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _base64(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    return str(value)
