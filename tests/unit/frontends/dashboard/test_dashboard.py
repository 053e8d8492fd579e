"""The dashboard without a browser: its committed bundle matches its sources, the reports folder cannot be
left, states shown for the index's rows, its restricted-API category and its flags."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from nereid.core.errors import NereidError
from nereid.frontends.dashboard.reports import find_reports, report_file
from nereid.frontends.dashboard.snapshot import _Gpus, display_state
from nereid.frontends.http.access import api_category
from nereid.serve_flags import parse_serve_args

ROOT = Path(__file__).resolve().parents[4]
SOURCES = ROOT / "dashboard"
STATIC = ROOT / "src" / "nereid" / "frontends" / "dashboard" / "static"


def _source_hash() -> str:
    """The hash dashboard/build.mjs records: every file under src/ and the build's own files, sorted by path."""
    files = [p for p in (SOURCES / "src").rglob("*") if p.is_file()]
    files += [SOURCES / name for name in ("index.html", "package.json", "package-lock.json", "build.mjs")]
    digest = hashlib.sha256()
    for name in sorted(p.relative_to(SOURCES).as_posix() for p in files):
        digest.update(name.encode() + b"\0")
        digest.update((SOURCES / name).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def test_committed_dashboard_bundle_is_built_from_the_current_sources() -> None:
    info = json.loads((STATIC / "build-info.json").read_text())
    assert info["sources_sha256"] == _source_hash(), "the dashboard's sources changed: run `make dashboard` and commit"
    for name in ("index.html", "dashboard.js", "dashboard.css"):
        assert (STATIC / name).stat().st_size > 0
    assert (STATIC / "index.html").read_bytes() == (SOURCES / "index.html").read_bytes()


def test_dashboard_bundle_is_package_data() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert '"nereid.frontends.dashboard" = ["static/*"]' in text


def test_display_state_names_evicted_models_and_never_loaded_ones() -> None:
    assert display_state({"name": "m", "version": "1", "state": "READY"}) == "READY"
    assert display_state({"name": "m", "state": "LOADING"}) == "LOADING"
    assert display_state({"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "evicted: budget"}) == "EVICTED"
    assert display_state({"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}) == "UNAVAILABLE"
    assert display_state({"name": "m"}) == "UNAVAILABLE"


def test_dashboard_paths_are_their_own_restricted_api_category() -> None:
    for path in ("/dashboard", "/dashboard/", "/dashboard/api/live", "/dashboard/assets/dashboard.js"):
        assert api_category(path) == "dashboard"
    assert api_category("/dashboards") is None
    assert api_category("/v2/repository/models/m/load") == "model-repository"


def test_dashboard_flags() -> None:
    settings = parse_serve_args(["--model-repository", "/tmp", "--dashboard-reports-dir", "/srv/reports", "--http-restricted-api", "dashboard,model-repository:admin=1"])
    assert settings.allow_dashboard and settings.dashboard_reports_dir == "/srv/reports"
    assert settings.http_restricted_apis[0].apis == frozenset({"dashboard", "model-repository"})
    assert not parse_serve_args(["--model-repository", "/tmp", "--allow-dashboard=false"]).allow_dashboard


def _report(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "report.html").write_text("<html><body>report</body></html>")
    (folder / "throughput_latency.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (folder / "results.json").write_text(json.dumps({"model": "simple", "best": {"throughput": {"variant": "v3"}}}))


def test_reports_are_found_with_their_charts_and_summary(tmp_path: Path) -> None:
    _report(tmp_path / "run1")
    (tmp_path / "empty").mkdir()
    [report] = find_reports(str(tmp_path))
    assert report["name"] == "run1" and report["html"] == "run1/report.html"
    assert report["charts"] == ["run1/throughput_latency.png"]
    assert report["model"] == "simple" and report["best"] == {"throughput": "v3"}
    body, kind = report_file(str(tmp_path), "run1/throughput_latency.png")
    assert body.startswith(b"\x89PNG") and kind == "image/png"
    assert find_reports("") == [] and find_reports(str(tmp_path / "missing")) == []


@pytest.mark.parametrize("path", ["../secret.txt", "run1/../../secret.txt", "/etc/passwd", "run1/link.html", "run1/model.py"])
def test_report_files_outside_the_folder_or_of_other_kinds_are_not_served(tmp_path: Path, path: str) -> None:
    reports = tmp_path / "reports"
    _report(reports / "run1")
    (tmp_path / "secret.txt").write_text("secret")
    (reports / "run1" / "model.py").write_text("print('hi')")
    (reports / "run1" / "link.html").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(NereidError) as caught:
        report_file(str(reports), path)
    assert "not found" in caught.value.message


class _FakeNvml:
    """pynvml's calls that the live view makes, for two devices; the second fails its reads."""

    class _Memory:
        used, total = 3 * 1024**3, 80 * 1024**3

    class _Rates:
        gpu = 42

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:  # noqa: N802
        if handle == 1:
            raise RuntimeError("GPU is lost")
        return self._Memory()

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:  # noqa: N802
        return self._Rates()


def test_gpu_figures_come_from_nvml_where_present_and_are_absent_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    assert _Gpus().read() == [{"index": 0, "utilization": 0.42, "used_bytes": 3 * 1024**3, "total_bytes": 80 * 1024**3}]
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no package (or, alike, no driver): no GPU row at all
    assert _Gpus().read() == []
