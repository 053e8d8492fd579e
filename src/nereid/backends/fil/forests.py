"""Tree models loaded into the engine that runs them fastest here, behind one small interface.

Measured in benchmarks/results/fil_engines.md: XGBoost models run on XGBoost's own `inplace_predict` (its
blocked predictor is the fastest from a handful of rows up), LightGBM models on LightGBM, and Treelite
checkpoints and scikit-learn forests on Treelite's GTIL. Every engine is called with NaN as "missing".
"""

from __future__ import annotations

import json
import logging
import pickle
import threading
from pathlib import Path
from typing import Any, Protocol

import lightgbm
import numpy as np
import treelite
import xgboost

from nereid.backends.fil.parallel import in_parts
from nereid.backends.fil.params import FilParams
from nereid.backends.fil.treeshap import TreeShap
from nereid.backends.fil.xgboost_capi import DensePredictor
from nereid.core.errors import NereidError

__all__ = ["Forest", "load_forest"]

log = logging.getLogger("nereid.fil")

# Models load in parallel worker threads; Treelite's importers are not documented as thread-safe, so model
# construction through Treelite happens one at a time (loading is rare; prediction is not serialised).
_TREELITE_LOCK = threading.Lock()

# One OpenMP thread per engine call: an OpenMP pool per call loses on a busy machine (2 OpenMP threads take ~24 ms
# for any batch while another process holds a core, against 0.4-8.7 ms on one thread;
# benchmarks/results/fil_engines.md). Large batches use the other cores through parallel.in_parts instead.
_THREADS = 1


class Forest(Protocol):
    """A loaded tree model. `predict` gives the model's transformed output, one column per output
    (1 for regression and binary classifiers, k for k classes); `shap` gives margin-space SHAP values
    [rows, outputs, features + 1] with the bias last."""

    engine: str
    n_features: int
    n_outputs: int

    def predict(self, rows: np.ndarray) -> np.ndarray: ...

    def shap(self, rows: np.ndarray) -> np.ndarray: ...


class XGBoostForest:
    engine = "xgboost inplace_predict"

    def __init__(self, booster: Any) -> None:
        learner = json.loads(booster.save_config())["learner"]
        model_param = learner["learner_model_param"]
        self._objective = learner["objective"]["name"]
        self.n_features = booster.num_features()
        num_class = int(model_param.get("num_class", "0"))
        num_target = int(model_param.get("num_target", "1") or 1)
        self.n_outputs = num_class if num_class > 1 else max(num_target, 1)
        booster.set_param({"nthread": _THREADS})
        self._booster = booster
        # softmax gives class ids; the probabilities are the softmax of the margins.
        self._margin = self._objective == "multi:softmax"
        self._dense = DensePredictor.create(booster, self._margin)

    def _call(self, rows: np.ndarray) -> np.ndarray:
        if self._dense is not None:
            return self._dense.predict(rows)
        return np.asarray(self._booster.inplace_predict(rows, predict_type="margin" if self._margin else "value",
                                                        validate_features=False)).reshape(-1)

    def predict(self, rows: np.ndarray) -> np.ndarray:
        # XGBoost refuses rows that are not aligned to 4 bytes (a binary HTTP body can start anywhere).
        rows = np.require(rows, np.float32, ("C", "A"))
        values = in_parts(self._call, rows).reshape(len(rows), -1)
        if self._margin:
            margin = values.astype(np.float64)
            margin -= margin.max(axis=1, keepdims=True)
            exp = np.exp(margin)
            return (exp / exp.sum(axis=1, keepdims=True)).astype(np.float32)
        return values

    def shap(self, rows: np.ndarray) -> np.ndarray:
        matrix = xgboost.DMatrix(rows, missing=np.nan, nthread=_THREADS)
        values = self._booster.predict(matrix, pred_contribs=True)
        return np.asarray(values).reshape(len(rows), self.n_outputs, self.n_features + 1)


class LightGBMForest:
    engine = "lightgbm predict"

    def __init__(self, booster: Any) -> None:
        self._booster = booster
        self.n_features = booster.num_feature()
        self.n_outputs = booster.num_model_per_iteration()

    def _call(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self._booster.predict(rows, num_threads=_THREADS))

    def predict(self, rows: np.ndarray) -> np.ndarray:
        return in_parts(self._call, rows).reshape(len(rows), -1)

    def shap(self, rows: np.ndarray) -> np.ndarray:
        values = self._booster.predict(rows, pred_contrib=True, num_threads=_THREADS)
        return np.asarray(values).reshape(len(rows), self.n_outputs, self.n_features + 1)


class TreeliteForest:
    engine = "treelite GTIL"

    def __init__(self, model: Any) -> None:
        self._model = model
        header = model.get_header_accessor()
        self.n_features = int(model.num_feature)
        num_class = [int(c) for c in np.asarray(header.get_field("num_class")).reshape(-1)]
        num_target = int(np.asarray(header.get_field("num_target")).reshape(-1)[0])
        self.n_outputs = num_target * (max(num_class) if num_class else 1)
        self._dtype = np.float32 if str(model.input_type) == "float32" else np.float64
        self._explainer: TreeShap | None = None

    def _call(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(treelite.gtil.predict(self._model, rows, nthread=_THREADS))

    def predict(self, rows: np.ndarray) -> np.ndarray:
        return in_parts(self._call, rows.astype(self._dtype, copy=False)).reshape(len(rows), -1)

    def shap(self, rows: np.ndarray) -> np.ndarray:
        if self._explainer is None:
            self._explainer = TreeShap(self._model)
        return self._explainer.shap_values(rows)


def _strict_xgboost_json(path: Path, allow_unknown_field: bool) -> None:
    """FIL reads XGBoost JSON through Treelite, which refuses unknown fields unless
    xgboost_allow_unknown_field is set; XGBoost itself ignores them. Keep FIL's answer."""
    if allow_unknown_field:
        return
    try:
        treelite.frontend.load_xgboost_model(str(path), allow_unknown_field=False)
    except treelite.TreeliteError as exc:
        raise NereidError.invalid(
            f"'{path.name}' is not an XGBoost JSON model that FIL accepts ({exc}); set the parameter "
            f"xgboost_allow_unknown_field to \"true\" to ignore fields it does not know"
        ) from None


def load_forest(path: Path, params: FilParams) -> Forest:
    """Load `path` as `params.model_type`; raises NereidError with the file and the framework's reason."""
    model_type = params.model_type
    try:
        with _TREELITE_LOCK:
            return _load(path, params)
    except NereidError:
        raise
    except ImportError as exc:
        raise NereidError.unavailable(f"cannot load '{path.name}': {exc}; install it with `pip install nereid[fil]`") from None
    except Exception as exc:  # each framework raises its own error types for a bad file
        raise NereidError.invalid(f"cannot load '{path.name}' as a {model_type} model: {exc}") from None


def _load(path: Path, params: FilParams) -> Forest:
    model_type = params.model_type
    if model_type in ("xgboost_json", "xgboost_ubj"):
        if model_type == "xgboost_json":
            _strict_xgboost_json(path, params.allow_unknown_field)
        return XGBoostForest(xgboost.Booster(model_file=str(path)))
    if model_type == "xgboost":
        try:
            return XGBoostForest(xgboost.Booster(model_file=str(path)))
        except xgboost.core.XGBoostError:
            # XGBoost 3 reads only JSON/UBJSON; Treelite still reads the legacy binary format.
            log.info("'%s': XGBoost cannot read this legacy binary model; loading it through Treelite", path)
            return TreeliteForest(treelite.frontend.load_xgboost_model_legacy_binary(str(path)))
    if model_type == "lightgbm":
        return LightGBMForest(lightgbm.Booster(model_file=str(path)))
    if model_type == "treelite_checkpoint":
        return TreeliteForest(treelite.Model.deserialize(str(path)))
    if model_type == "sklearn":
        with open(path, "rb") as handle:
            estimator = pickle.load(handle)  # noqa: S301 - the model repository is trusted, as Python models are
        return TreeliteForest(treelite.sklearn.import_model(estimator))
    raise NereidError.invalid(f"unknown fil model_type '{model_type}'")
