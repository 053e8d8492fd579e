"""How a benchmark hands over its table: printed, and written to its results file."""

from __future__ import annotations

from pathlib import Path


def publish(lines: list[str], path: Path) -> None:
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
