"""The fil backend's config parameters, read the way Triton's FIL backend names them.

Only parsing and checking lives here; nothing loads a model or imports a tree framework.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from nereid.core.errors import NereidError

__all__ = ["FilParams", "MODEL_TYPES", "DEFAULT_FILENAMES", "model_type_from_files", "read_params"]

log = logging.getLogger("nereid.fil")

# model_type -> the file Triton's FIL backend looks for when default_model_filename is not set.
DEFAULT_FILENAMES = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
    # Nereid's addition: a pickled scikit-learn forest, converted through Treelite at load.
    "sklearn": "model.pkl",
}
MODEL_TYPES = tuple(DEFAULT_FILENAMES)
# GPU tuning knobs of FIL: accepted so that Triton configs load unchanged, and logged (they change nothing here).
_LEGACY = ("storage_type", "algo", "threads_per_tree", "blocks_per_sm", "use_experimental_optimizations", "transfer_threshold")
_KNOWN = {"model_type", "output_class", "is_classifier", "predict_proba", "threshold", "xgboost_allow_unknown_field", *_LEGACY}


@dataclass(slots=True, frozen=True)
class FilParams:
    model_type: str
    is_classifier: bool
    predict_proba: bool
    threshold: float
    allow_unknown_field: bool

    @property
    def default_filename(self) -> str:
        return DEFAULT_FILENAMES[self.model_type]


def _bool(model: str, key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no", ""):
        return False
    raise NereidError.invalid(f"model '{model}': fil parameter '{key}' must be true or false, got '{value}'")


def model_type_from_files(names: set[str]) -> str | None:
    """The model_type a version folder's files suggest (used when the config names none)."""
    for model_type, filename in DEFAULT_FILENAMES.items():
        if filename in names:
            return model_type
    return None


def read_params(model: str, parameters: Any, fallback_model_type: str | None = None, report: bool = False) -> FilParams:
    """Parse `parameters` (the config's map of key -> ModelParameter) into FilParams; with `report`, log the
    parameters that change nothing here."""
    values = {key: value.string_value for key, value in parameters.items()}
    for key in values if report else ():
        if key in _LEGACY:
            log.info("model '%s': fil parameter '%s' = '%s' tunes FIL's GPU engine; it has no effect here", model, key, values[key])
        elif key not in _KNOWN:
            log.warning("model '%s': unknown fil parameter '%s' ignored", model, key)
    model_type = values.get("model_type", "").strip() or fallback_model_type or "xgboost"
    if model_type not in MODEL_TYPES:
        raise NereidError.invalid(
            f"model '{model}': unknown fil model_type '{model_type}'; expected one of {', '.join(MODEL_TYPES)}"
        )
    # `is_classifier` is the newer name of `output_class`; either one turns classification on.
    is_classifier = _bool(model, "output_class", values.get("output_class", "false")) or _bool(
        model, "is_classifier", values.get("is_classifier", "false")
    )
    try:
        threshold = float(values.get("threshold", "0.5") or "0.5")
    except ValueError:
        raise NereidError.invalid(
            f"model '{model}': fil parameter 'threshold' must be a number, got '{values['threshold']}'"
        ) from None
    return FilParams(
        model_type=model_type,
        is_classifier=is_classifier,
        predict_proba=_bool(model, "predict_proba", values.get("predict_proba", "false")),
        threshold=threshold,
        allow_unknown_field=_bool(model, "xgboost_allow_unknown_field", values.get("xgboost_allow_unknown_field", "false")),
    )
