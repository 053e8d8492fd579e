"""The payload log: JSON lines in the documented schema, rotation, and records dropped (never a failure) when the
disk fails."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from nereid.monitoring.payload_log import PayloadLog, TensorLog, payload_record


def _record(i: int) -> dict[str, object]:
    x = np.array([[1.0, np.nan]], np.float32)
    s = np.array([b"ok"], dtype=np.object_)
    big = TensorLog((10_000,), np.zeros(4096, np.float32))  # only its first values were kept
    return payload_record(1.5, "m", "2", f"r{i}", 3.25, "", {"X": TensorLog(x.shape, x)}, {"S": TensorLog(s.shape, s), "BIG": big})


def test_records_are_json_lines_with_the_documented_fields(tmp_path: Path) -> None:
    log = PayloadLog(str(tmp_path))
    log.write(_record(0))
    log.close()
    (line,) = (tmp_path / "payload.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["model"] == "m" and record["version"] == "2" and record["id"] == "r0" and record["latency_ms"] == 3.25
    assert record["inputs"]["X"] == {"shape": [1, 2], "dtype": "float32", "data": [1.0, None]}
    assert record["outputs"]["S"]["data"] == ["ok"]
    assert record["outputs"]["BIG"] == {"shape": [10000], "dtype": "float32", "truncated": True}


def test_the_log_rotates_at_its_size_and_keeps_its_backups(tmp_path: Path) -> None:
    log = PayloadLog(str(tmp_path), max_bytes=2000, backups=2)
    for i in range(40):
        log.write(_record(i))
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["payload.jsonl", "payload.jsonl.1", "payload.jsonl.2"]
    assert all(p.stat().st_size <= 2000 for p in tmp_path.iterdir())
    assert log.written == 40 and log.dropped == 0


def test_a_failing_disk_drops_records_and_counts_them(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    log = PayloadLog(str(blocker / "payloads"))
    for i in range(3):
        log.write(_record(i))
    assert log.dropped == 3 and log.written == 0
