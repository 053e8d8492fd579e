"""`nereid analyze` outputs from synthetic results: the CSV, the charts, the HTML page and the output repository;
and the flag parsers."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from PIL import Image

from nereid.tools.analyze.cli import main, parse_analyze_args
from nereid.tools.analyze.export import write_best_config
from nereid.tools.analyze.objectives import Constraints, best_pick
from nereid.tools.analyze.report import CSV_COLUMNS, write_report
from nereid.tools.analyze.results import AnalyzeResult, LevelMeasurement, VariantOutcome
from nereid.tools.analyze.search_space import Variant
from nereid.tools.analyze.settings import AnalyzeError, parse_bool_list, parse_int_list


def _result(count: int = 3) -> AnalyzeResult:
    result = AnalyzeResult("m<odel>", "test server", "brute", ["max_throughput", "min_latency"], {"max_p99_latency_ms": 8.0}, "grid", "psutil")
    constraints = Constraints(max_p99_latency_ms=8)
    for i in range(count):
        variant = Variant(2**i, i > 0, 100 * i, (), 1 + i % 2, None)
        label = "baseline" if i == 0 else variant.name
        outcome = VariantOutcome(label, variant, f'name: "m"\nmax_batch_size: {2**i}\n', i + 1)
        for c in (1, 4):
            m = LevelMeasurement(label, c, 100.0 * (i + 1) * c, 1, 1.5, 1.8, 2.0 + i * c, 1.2, 5.0, 50.0, 20.0, 90.0, 100.0 + i, None, None, True)
            constraints.mark(m)
            outcome.measurements.append(m)
        result.outcomes.append(outcome)
    result.outcomes.append(VariantOutcome("mbs64_db_q0us_i1", Variant(64, True, 0, (), 1, None), "", count + 1, error="load failed: <boom>"))
    for objective in result.objectives:
        pick = best_pick(objective, result.outcomes)
        assert pick is not None
        result.best[objective] = pick
    return result


def test_report_files_csv_columns_pngs_and_html(tmp_path: Path) -> None:
    result = _result()
    files = write_report(result, tmp_path)
    rows = list(csv.DictReader(io.StringIO(files["csv"].read_text())))
    assert list(rows[0]) == CSV_COLUMNS
    assert len(rows) == 6 and {r["variant"] for r in rows} == {o.label for o in result.outcomes if o.measured}
    assert {r["meets_constraints"] for r in rows} == {"yes", "no"}
    for name in ("throughput_vs_latency", "memory_vs_latency"):
        with Image.open(files[name]) as image:
            assert image.format == "PNG" and image.size[0] >= 600 and image.size[1] >= 300
            assert sum(1 for n in image.convert("L").histogram() if n) > 10  # something was drawn
    page = files["html"].read_text()
    for outcome in result.outcomes:
        assert outcome.label in page
    assert "m&lt;odel&gt;" in page and "<odel>" not in page  # escaped
    assert "load failed: &lt;boom&gt;" in page
    assert page.count("data:image/png;base64,") == 2
    assert '<table id="summary">' in page
    assert files["json"].is_file()


def test_charts_with_many_configurations_grey_out_the_rest(tmp_path: Path) -> None:
    files = write_report(_result(14), tmp_path)
    with Image.open(files["throughput_vs_latency"]) as image:
        assert image.format == "PNG"


def test_best_config_is_written_next_to_linked_or_copied_version_folders(tmp_path: Path) -> None:
    model_dir = tmp_path / "repo" / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text("x = 1\n")
    (model_dir / "labels.txt").write_text("a\n")
    (model_dir / "config.pbtxt").write_text("old\n")
    pick = _result().best["max_throughput"]
    path = write_best_config(pick, "m", tmp_path / "out", model_dir, copy_files=False)
    assert path == tmp_path / "out" / "max_throughput" / "m" / "config.pbtxt"
    assert pick.outcome.config_text in path.read_text() and path.read_text().startswith("# Written by nereid analyze")
    assert (path.parent / "1").is_symlink() and (path.parent / "1" / "model.py").read_text() == "x = 1\n"
    assert (path.parent / "labels.txt").is_symlink()
    again = write_best_config(pick, "m", tmp_path / "out", model_dir, copy_files=True)  # replaces the earlier one
    assert not (again.parent / "1").is_symlink() and (again.parent / "1" / "model.py").is_file()
    assert (model_dir / "config.pbtxt").read_text() == "old\n"


def test_list_parsers() -> None:
    assert parse_int_list("--x", "8,2,4,2") == [2, 4, 8]
    assert parse_int_list("--x", "1:7:3") == [1, 4, 7]
    assert parse_int_list("--x", "0,100", 0) == [0, 100]
    assert parse_bool_list("both") == [False, True] and parse_bool_list("on") == [True]
    for bad in ("", "1,,2", "a", "0", "4:1", "1:4:0"):
        with pytest.raises(AnalyzeError, match="--x"):
            parse_int_list("--x", bad)


def test_flags_parse_into_settings() -> None:
    settings, quiet = parse_analyze_args(
        ["-m", "m", "--url", "h:1", "--objective", "latency", "--objective", "throughput", "--max-p99-latency-ms", "5",
         "--concurrency", "1:3", "--instance-counts", "1,2", "--mode", "brute", "-q", "--shape", "IN:4"]
    )
    assert quiet and settings.objectives == ["min_latency", "max_throughput"] and settings.max_p99_latency_ms == 5
    assert settings.concurrency == [1, 2, 3] and settings.instance_counts == [1, 2] and settings.mode == "brute"
    assert settings.shapes == {"IN": [4]} and settings.model_repository is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-m", "m"], "--model-repository is required unless --url"),
        (["-m", "m", "--url", "h:1", "--concurrency", "1:x"], "--concurrency"),
        (["-m", "m", "--url", "h:1", "--mode", "fast"], "--mode"),
        (["-m", "m", "--url", "h:1", "--max-p99-latency-ms", "-1"], "--max-p99-latency-ms"),
        (["-m", "m", "--url", "h:1", "--objective", "cheap"], "--objective"),
        (["-m", "m", "--url", "h:1", "--dynamic-batching", "maybe"], "--dynamic-batching"),
        (["-m", "m", "--url", "h:1", "--time-budget-s", "0"], "--time-budget-s"),
        (["-m", "m", "--url", "h:1", "--bogus"], "unknown flag"),
        (["-m", "m", "--model-repository", "/nonexistent/repo"], "is not a directory"),
        (["--url", "h:1"], "required"),
    ],
)
def test_bad_flags_get_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nereid analyze: error: ") and message in err
    assert "Traceback" not in err
