"""`nereid analyze`: search a model's configuration (max_batch_size, dynamic batching, instance count, ONNX
intra-op threads) on a v2 server in explicit model-control mode, what Triton's Model Analyzer does. It speaks
the protocol like any client and never imports the server's internals.

Python API::

    from nereid.tools.analyze import AnalyzeSettings, run_analyze
    result = run_analyze(AnalyzeSettings("simple", model_repository=Path("repo"), time_budget_s=60))
    result.best["max_throughput"].config_path, result.files["html"]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nereid.tools.common import lazy_exports

if TYPE_CHECKING:
    from nereid.tools.analyze.cli import main, parse_analyze_args
    from nereid.tools.analyze.objectives import Constraints
    from nereid.tools.analyze.report import CSV_COLUMNS
    from nereid.tools.analyze.results import AnalyzeResult, BestPick, LevelMeasurement, VariantOutcome
    from nereid.tools.analyze.runner import run_analyze
    from nereid.tools.analyze.search_space import SearchSpace, Variant
    from nereid.tools.analyze.settings import AnalyzeError, AnalyzeSettings

_EXPORTS = {
    "main": "cli",
    "parse_analyze_args": "cli",
    "Constraints": "objectives",
    "CSV_COLUMNS": "report",
    "AnalyzeResult": "results",
    "BestPick": "results",
    "LevelMeasurement": "results",
    "VariantOutcome": "results",
    "run_analyze": "runner",
    "SearchSpace": "search_space",
    "Variant": "search_space",
    "AnalyzeError": "settings",
    "AnalyzeSettings": "settings",
}

__all__ = [
    "CSV_COLUMNS",
    "AnalyzeError",
    "AnalyzeResult",
    "AnalyzeSettings",
    "BestPick",
    "Constraints",
    "LevelMeasurement",
    "SearchSpace",
    "Variant",
    "VariantOutcome",
    "main",
    "parse_analyze_args",
    "run_analyze",
]


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
