"""Every unit the runner knows, by the folder name under qa/ (one module per group of units)."""

from __future__ import annotations

from benchmarks.triton_qa import backend_python, infer, model_update, protocols, sequence_batcher
from benchmarks.triton_qa.runner import Unit

__all__ = ["UNITS"]

UNITS: dict[str, Unit] = {**model_update.UNITS, **backend_python.UNITS, **protocols.UNITS, **sequence_batcher.UNITS, **infer.UNITS}
