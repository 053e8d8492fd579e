"""Azurite, Microsoft's Azure Storage emulator, for the as:// repository tests: fetched once from its npm package into
a cache folder (beside helm's), then run with Node.js."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["AZURITE_VERSION", "fetch_azurite"]

AZURITE_VERSION = "3.37.0"


def fetch_azurite() -> Path | None:
    """The azurite-blob launcher, installed on first use (about 20 s); None when npm or node is missing and nothing
    is cached. A failed install raises, naming npm's complaint."""
    cache = Path(os.environ.get("NEREID_TOOLS_CACHE") or Path.home() / ".cache" / "nereid-tools")
    folder = cache / f"azurite-{AZURITE_VERSION}"
    launcher = folder / "node_modules" / ".bin" / "azurite-blob"
    if launcher.exists():
        return launcher if shutil.which("node") else None
    if shutil.which("npm") is None or shutil.which("node") is None:
        return None
    cache.mkdir(parents=True, exist_ok=True)
    # Installed beside the cache and renamed into place, so an interrupted install never looks like a finished one.
    work = Path(tempfile.mkdtemp(prefix="azurite.", dir=cache))
    try:
        result = subprocess.run(
            ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(work), f"azurite@{AZURITE_VERSION}"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"npm could not install azurite@{AZURITE_VERSION}:\n{result.stderr[-2000:]}")
        try:
            work.rename(folder)
        except OSError:
            if not launcher.exists():  # not another process's finished install
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return launcher
