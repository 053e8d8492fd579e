"""The output repository: for each objective, `<out>/<objective>/<model>/config.pbtxt` with the best variant's
config, next to the model's version folders (symbolic links, or copies with --copy-model-files), so that
`<out>/<objective>` can be served as a model repository as it is."""

from __future__ import annotations

import shutil
from pathlib import Path

from nereid.tools.analyze.results import BestPick

__all__ = ["write_best_config"]


def _clear(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def write_best_config(pick: BestPick, model: str, output_dir: Path, model_dir: Path | None, copy_files: bool) -> Path:
    """Write the pick's config.pbtxt (and the model's files beside it); returns the config's path."""
    target = output_dir / pick.objective / model
    if target.exists() or target.is_symlink():
        _clear(target)
    target.mkdir(parents=True)
    m = pick.measurement
    header = (
        f"Written by nereid analyze: best for {pick.objective} ({pick.outcome.label}: {pick.outcome.variant.describe()}).\n"
        f"Measured at concurrency {m.concurrency}: {m.throughput:,.1f} infer/s, p99 {m.p99_ms:.2f} ms."
    )
    text = pick.outcome.config_text
    config_path = target / "config.pbtxt"
    config_path.write_text("".join(f"# {line}\n" for line in header.splitlines()) + text)
    if model_dir is not None and model_dir.is_dir():
        for entry in sorted(model_dir.iterdir()):
            if entry.name in ("config.pbtxt", "configs") or entry.name.startswith("."):
                continue
            destination = target / entry.name
            if not copy_files:
                destination.symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
            elif entry.is_dir():
                shutil.copytree(entry, destination, symlinks=True)
            else:
                shutil.copy2(entry, destination)
    return config_path
