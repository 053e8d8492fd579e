"""qa/L0_model_update: instance_update_test.py in the three rate-limit modes test.sh runs it in."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.triton_qa.runner import Run, Unit

__all__ = ["UNITS"]


def _model_update_models(unit: Path, qa: Path) -> None:
    models = unit / "models"
    shutil.rmtree(models, ignore_errors=True)
    shutil.copytree(qa / "python_models" / "model_init_del", models / "model_init_del")
    (models / "model_init_del" / "1").mkdir()
    (models / "model_init_del" / "model.py").rename(models / "model_init_del" / "1" / "model.py")


def _model_update_runs() -> list[Run]:
    runs = []
    for mode in ("off", "execution_count", "execution_count_with_explicit_resource"):
        limit = ["--rate-limit=execution_count", "--rate-limit-resource=R1:10"] if mode.endswith("resource") else [f"--rate-limit={mode}"]
        runs.append(
            Run(
                name=f"rate limit {mode}",
                server_args=["--model-repository=models", "--model-control-mode=explicit", *limit, "--log-verbose=2"],
                tests=["instance_update_test.py"],
                server_log=f"instance_update_test.rate_limit_{mode}.server.log",
                env={"RATE_LIMIT_MODE": mode},
                absent_from_log=["Should not print this"],
            )
        )
    return runs


UNITS = {"L0_model_update": Unit("L0_model_update", _model_update_models, _model_update_runs())}
