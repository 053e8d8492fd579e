"""qa/L0_backend_python's subtests (each a folder with its own test.sh)."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.triton_qa.runner import Run, Unit, copy_python_model, edit_config

__all__ = ["UNITS"]


def _lifecycle_models(unit: Path, qa: Path) -> None:
    models = unit / "models"
    shutil.rmtree(models, ignore_errors=True)
    for name in ("error_code", "execute_cancel", "decoupled_grpc_error", "execute_return_error"):
        copy_python_model(qa, models, name)
    edit_config(copy_python_model(qa, models, "execute_error"), "execute_error", 8,
                 "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 12000000 }\n")  # fmt: skip
    edit_config(copy_python_model(qa, models, "execute_grpc_error"), "execute_grpc_error", 8,
                 "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 1200000 }\n")  # fmt: skip
    edit_config(copy_python_model(qa, models, "wrong_model"), "wrong_model", replace=("TYPE_FP32", "TYPE_UINT32"))


UNITS = {
    "L0_backend_python/lifecycle": Unit(
        "L0_backend_python/lifecycle",
        _lifecycle_models,
        [
            Run(
                name="lifecycle",
                server_args=["--model-repository=models", "--log-verbose=1"],
                tests=["lifecycle_test.py"],
                server_log="lifecycle_server.log",
                # The unit's shared-memory leak probe watches Triton's own shm region files and needs Triton's
                # compiled triton_shm_monitor module; Jetson runs skip it, and so does this.
                env={"TEST_JETSON": "1"},
            )
        ],
        note="test.sh's later starts (models whose initialize() or finalize() raise) are not run",
    ),
}
