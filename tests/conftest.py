"""Shared fixtures: the example repository served by a real `nereid serve` process, once per session; and the
first-use installs of the reference tools done once, before pytest-xdist's workers start."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import REAL_TRITON, ROOT, RunningServer, start_nereid

EXAMPLES = ROOT / "examples" / "model_repository"


def without_llm(*repositories: Path) -> list[str]:
    """Flags that load the example models but the tiny LLM, and every model of `repositories`, explicitly: for
    servers that never ask the LLM, whose load (torch and transformers imported) is most of a start-up's time."""
    names = [p.name for p in sorted(EXAMPLES.iterdir()) if p.is_dir() and p.name != "tiny_llm"]
    names += [p.name for repository in repositories for p in sorted(Path(repository).iterdir()) if p.is_dir()]
    return ["--model-control-mode=explicit", *(f"--load-model={name}" for name in names)]


WITHOUT_LLM = without_llm()


@pytest.fixture(scope="session")
def example_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_nereid(EXAMPLES, "--allow-client-shm=true", log_dir=tmp_path_factory.mktemp("logs"))
    yield server
    assert server.stop() == 0, server.log()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`-n N`), install the tools that tests install on first use once, in the controller,
    before any worker starts: real Triton's cache venv, perf_analyzer and helm are each written by whichever test
    needs them first, and two workers doing that at once would race on the same cache folder."""
    distributing = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")
    if not distributing:
        return
    if REAL_TRITON.exists():
        subprocess.run([str(REAL_TRITON), "--print-env"], capture_output=True, check=False, timeout=900)
    from tests.perf_analyzer import PerfAnalyzerUnavailable, install_perf_analyzer

    try:
        install_perf_analyzer()
    except PerfAnalyzerUnavailable:
        pass  # its tests skip with the reason, as they do without xdist
    from tests.helm_tool import fetch_helm

    fetch_helm()
