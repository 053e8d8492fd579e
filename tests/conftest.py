"""Shared fixtures: the example repository served by a real `nereid serve` process, once per session; the real
Triton reference for differential tests (marked `differential`, counted in the summary line); and the first-use
installs of the reference tools done once, before pytest-xdist's workers start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import reference_triton as reference
from tests.servers import ROOT, RunningServer, start_nereid

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


@pytest.fixture(scope="session")
def reference_triton() -> reference.ReferenceTriton:
    """The real Triton reference, set up on first use; a test that uses it is a differential test."""
    return reference.require()


# The summary line's entry for the differential tests that ran (passed or failed) against real Triton.
_DIFFERENTIAL_RAN = "differential ran"


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`-n N`), install the tools that tests install on first use once, in the controller,
    before any worker starts: perf_analyzer and helm are each written by whichever test needs them first, and two
    workers doing that at once would race on the same cache folder (real Triton's setup takes a lock of its own)."""
    config.addinivalue_line("markers", "differential: asks real Triton the same question (tests/reference_triton.py)")
    distributing = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")
    if not distributing:
        return
    from tests.perf_analyzer import PerfAnalyzerUnavailable, install_perf_analyzer

    try:
        install_perf_analyzer()
    except PerfAnalyzerUnavailable:
        pass  # its tests skip with the reason, as they do without xdist
    from tests.helm_tool import fetch_helm

    fetch_helm()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "reference_triton" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.differential)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A differential test runs against the reference, or fails saying why it cannot be set up; it skips only
    under the documented opt-out (NEREID_SKIP_DIFFERENTIAL=1)."""
    if item.get_closest_marker("differential") is not None:
        reference.require()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count each differential test that ran into the summary line ("N differential ran")."""
    ran = report.when == "call" and (report.passed or report.failed)
    if ran and "differential" in report.keywords and _SESSION:
        reporter = _SESSION[-1].config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            # A tally mark, not the report: the durations and other summaries read every report in `stats`.
            reporter.stats.setdefault(_DIFFERENTIAL_RAN, []).append(_RAN)


_SESSION: list[pytest.Session] = []


class _Tally:
    """One differential test that ran, counted in the summary line; other summaries pass over it."""


_RAN = _Tally()


def pytest_sessionstart(session: pytest.Session) -> None:
    _SESSION.append(session)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    ran = len(terminalreporter.stats.get(_DIFFERENTIAL_RAN, []))
    if reference.opted_out():
        terminalreporter.write_line(f"{reference.OPT_OUT}=1: differential tests skipped by choice ({ran} ran)")
    elif ran:
        terminalreporter.write_line(f"{ran} differential test cases ran against real Triton 2.51")
