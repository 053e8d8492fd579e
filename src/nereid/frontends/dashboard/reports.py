"""The `nereid analyze` reports under --dashboard-reports-dir: finding them, and reading one of their files for
the page. It reads only files inside that folder (no symlink or `..` leads out) and writes nothing."""

from __future__ import annotations

import json
import mimetypes
from pathlib import Path
from typing import Any

from nereid.core.errors import NereidError

__all__ = ["find_reports", "report_file"]

_MAX_REPORTS = 200  # the newest ones; a folder of thousands would make a page nobody reads
_MAX_DEPTH = 3  # reports-dir/<run>/report.html, or one folder deeper
_SERVED = {".html", ".png", ".svg", ".json", ".csv", ".txt"}


def _summary(results: Path) -> dict[str, Any]:
    """The model and best configurations a results.json records, for the list; {} when it is unreadable."""
    try:
        data = json.loads(results.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    best = data.get("best")
    out: dict[str, Any] = {"model": data.get("model", "")}
    if isinstance(best, dict):
        out["best"] = {str(k): str(v.get("variant", "")) if isinstance(v, dict) else str(v) for k, v in best.items()}
    return out


def find_reports(folder: str) -> list[dict[str, Any]]:
    """Each folder under `folder` holding a report.html: its path relative to `folder`, time, charts and summary,
    newest first."""
    if not folder:
        return []
    root = Path(folder).resolve()
    if not root.is_dir():
        return []
    found: list[dict[str, Any]] = []
    for html in root.glob("**/report.html"):
        if len(html.relative_to(root).parts) > _MAX_DEPTH + 1:
            continue
        resolved = html.resolve()
        if not resolved.is_relative_to(root):
            continue
        run = html.parent
        relative = run.relative_to(root).as_posix()
        prefix = "" if relative == "." else relative + "/"
        charts = sorted(prefix + p.name for p in run.glob("*.png") if p.is_file())
        entry = {
            "name": relative if relative != "." else root.name,
            "html": prefix + "report.html",
            "charts": charts,
            "modified": resolved.stat().st_mtime,
        }
        if (run / "results.json").is_file():
            entry["json"] = prefix + "results.json"
            entry |= _summary(run / "results.json")
        found.append(entry)
    found.sort(key=lambda entry: entry["modified"], reverse=True)
    return found[:_MAX_REPORTS]


def report_file(folder: str, relative: str) -> tuple[bytes, str]:
    """A report's file and its content type; NOT_FOUND for anything outside the folder or of another kind."""
    if not folder:
        raise NereidError.not_found("no reports folder is configured (--dashboard-reports-dir)")
    root = Path(folder).resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root) or path.suffix.lower() not in _SERVED or not path.is_file():
        raise NereidError.not_found(f"report file '{relative}' not found")
    kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if kind.startswith("text/") or kind == "application/json":
        kind += "; charset=utf-8"
    return path.read_bytes(), kind
