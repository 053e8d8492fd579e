"""The repository index (Triton's RepositoryIndex): one row per known model version with its state and reason,
and, where the residency policy measured one, its footprint. Read-only over the records."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from nereid.repository.records import ModelRecord

__all__ = ["index_rows"]


def index_rows(
    records: dict[str, ModelRecord],
    repository_names: Iterable[str],
    ready_only: bool = False,
    footprint: Callable[[str], int | None] | None = None,
) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for name in sorted(set(records) | set(repository_names)):
        record = records.get(name)
        rows: list[dict[str, Any]] = []
        if record is not None:
            versions: dict[int, dict[str, Any]] = {}
            for number, retired in record.retired.items():
                if isinstance(retired, str):
                    versions[number] = {"name": name, "version": str(number), "state": "UNAVAILABLE", "reason": retired}
                else:
                    versions[number] = retired.index_entry()
            for number, mv in record.serving.items():
                versions[number] = mv.index_entry()
            rows = [versions[v] for v in sorted(versions)]
            if record.loading and not any(r.get("state") == "READY" for r in rows):
                rows = [{"name": name, "state": "LOADING"}]
            if not rows and record.reason:
                rows = [{"name": name, "state": "UNAVAILABLE", "reason": record.reason}]
        size = footprint(name) if footprint is not None else None
        if size is not None:
            for row in rows:
                row["footprint_bytes"] = size
        if ready_only:
            entries.extend(r for r in rows if r.get("state") == "READY")
        else:
            entries.extend(rows or [{"name": name}])
    return entries
