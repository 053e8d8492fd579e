"""Small models of the PyTorch, tree (XGBoost, LightGBM, scikit-learn, Treelite) and OpenVINO frameworks that
the integration tests build into temporary repositories. Each builder writes the model file and returns the
framework's own object, so a test can compare the server's answer with the framework called directly.

Frameworks are imported inside the builders: a test module pays only for the frameworks it uses.
"""

from __future__ import annotations

import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DATA",
    "tree_rows",
    "xgboost_model",
    "lightgbm_model",
    "sklearn_model",
    "treelite_checkpoint",
    "xgboost_legacy",
    "torch_linear",
    "torch_named_args",
    "torch_dict_output",
    "torch_tuple_output",
    "torch_exported",
    "torch_strings",
    "openvino_ir",
    "fil_config",
]

DATA = Path(__file__).resolve().parent / "data"


def _save_path(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def tree_rows(count: int, features: int, seed: int = 0, missing: float = 0.1, categories: int = 0) -> np.ndarray:
    """FP32 rows with about `missing` of the values NaN; with `categories`, the last column holds category
    codes 0..categories-1."""
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((count, features)).astype(np.float32)
    if categories:
        rows[:, -1] = rng.integers(0, categories, count)
    if missing:
        mask = rng.random(rows.shape) < missing
        rows[mask] = np.nan
    return rows


def _labels(rows: np.ndarray, task: str, classes: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 1)
    filled = np.nan_to_num(rows, nan=0.0)
    signal = filled[:, 0] + 0.5 * filled[:, 1] * filled[:, 2] + 0.3 * rng.standard_normal(len(rows))
    if filled.shape[1] > 4:
        signal += np.where(filled[:, -1] == 2, 1.5, 0.0)
    if task == "regression":
        return signal.astype(np.float32)
    if task == "binary":
        return (signal > 0).astype(np.float32)
    return np.digitize(signal, np.quantile(signal, np.linspace(0, 1, classes + 1)[1:-1])).astype(np.float32)


def xgboost_model(path: Path, task: str, features: int = 6, classes: int = 3, trees: int = 12, depth: int = 4,
                  categorical: bool = False, seed: int = 0) -> Any:
    """An XGBoost Booster trained on rows with NaNs, saved to `path` (the suffix picks JSON, UBJSON)."""
    import xgboost as xgb

    rows = tree_rows(600, features, seed, categories=4 if categorical else 0)
    labels = _labels(rows, task, classes, seed)
    objective = {"regression": "reg:squarederror", "binary": "binary:logistic", "multiclass": "multi:softprob"}[task]
    params: dict[str, Any] = {"objective": objective, "max_depth": depth, "eta": 0.3, "nthread": 1, "seed": seed}
    if task == "multiclass":
        params["num_class"] = classes
    feature_types = ["q"] * (features - 1) + ["c"] if categorical else None
    if categorical:
        params.update(tree_method="hist", max_cat_to_onehot=1)
    matrix = xgb.DMatrix(rows, label=labels, feature_types=feature_types, enable_categorical=categorical)
    booster = xgb.train(params, matrix, num_boost_round=trees)
    booster.save_model(str(_save_path(path)))
    return booster


def lightgbm_model(path: Path, task: str, features: int = 6, classes: int = 3, trees: int = 12,
                   categorical: bool = False, seed: int = 0) -> Any:
    """A LightGBM Booster in its text format at `path`."""
    import lightgbm as lgb

    rows = tree_rows(600, features, seed, categories=4 if categorical else 0)
    labels = _labels(rows, task, classes, seed)
    objective = {"regression": "regression", "binary": "binary", "multiclass": "multiclass"}[task]
    params: dict[str, Any] = {"objective": objective, "num_leaves": 15, "verbose": -1, "num_threads": 1, "seed": seed,
                              "min_data_per_group": 5, "cat_smooth": 1}
    if task == "multiclass":
        params["num_class"] = classes
    dataset = lgb.Dataset(rows, label=labels, categorical_feature=[features - 1] if categorical else "auto")
    booster = lgb.train(params, dataset, num_boost_round=trees)
    booster.save_model(str(_save_path(path)))
    return booster


def sklearn_model(path: Path, kind: str, features: int = 5, seed: int = 0) -> Any:
    """A fitted scikit-learn forest pickled at `path`: random_forest_classifier (3 classes),
    gradient_boosting_regressor, extra_trees_regressor or isolation_forest. No NaNs (sklearn's forests
    route missing values their own way)."""
    from sklearn.ensemble import (
        ExtraTreesRegressor,
        GradientBoostingRegressor,
        IsolationForest,
        RandomForestClassifier,
    )

    rows = tree_rows(400, features, seed, missing=0.0)
    estimator: Any
    if kind == "random_forest_classifier":
        estimator = RandomForestClassifier(n_estimators=6, max_depth=4, random_state=seed).fit(rows, _labels(rows, "multiclass", 3, seed))
    elif kind == "gradient_boosting_regressor":
        estimator = GradientBoostingRegressor(n_estimators=8, max_depth=3, random_state=seed).fit(rows, _labels(rows, "regression", 1, seed))
    elif kind == "extra_trees_regressor":
        estimator = ExtraTreesRegressor(n_estimators=5, max_depth=4, random_state=seed).fit(rows, _labels(rows, "regression", 1, seed))
    elif kind == "isolation_forest":
        estimator = IsolationForest(n_estimators=5, random_state=seed).fit(rows)
    else:
        raise ValueError(kind)
    with open(_save_path(path), "wb") as handle:
        pickle.dump(estimator, handle)
    return estimator


def treelite_checkpoint(path: Path, estimator: Any) -> Any:
    """Convert a scikit-learn forest with Treelite and write the checkpoint; returns the treelite.Model."""
    import treelite

    model = treelite.sklearn.import_model(estimator)
    model.serialize(str(_save_path(path)))
    return model


def xgboost_legacy(path: Path) -> Any:
    """Copy the committed XGBoost legacy-binary model (written by XGBoost 1.7, which still wrote the format;
    4 features, binary:logistic) to `path`, and return the same model read from its JSON twin."""
    import xgboost as xgb

    shutil.copy(DATA / "xgboost_legacy.model", _save_path(path))
    return xgb.Booster(model_file=str(DATA / "xgboost_legacy.json"))


def fil_config(name: str, features: int, outputs: list[tuple[str, list[int]]], max_batch_size: int = 64,
               extra: str = "", **parameters: str) -> str:
    """A config.pbtxt as Triton's FIL backend documents it."""
    lines = [f'name: "{name}"', 'backend: "fil"', f"max_batch_size: {max_batch_size}",
             f'input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ {features} ] }}]', "output ["]
    lines.append(",\n".join(f'  {{ name: "{o}" data_type: TYPE_FP32 dims: [ {", ".join(map(str, d))} ] }}' for o, d in outputs))
    lines.append("]")
    for key, value in parameters.items():
        lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
    return "\n".join(lines) + "\n" + extra


# ------------------------------------------------------------------ PyTorch ------------------------------------------------------------------
def _torch_seed() -> None:
    import torch

    torch.manual_seed(0)


def _script(module: Any) -> Any:
    """torch.jit.script without its deprecation warning: TorchScript is what Triton's PyTorch backend serves."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(module.eval())


def torch_linear(path: Path, features: int = 8, outputs: int = 3) -> Any:
    """TorchScript: one tensor in, one out (Triton's INPUT__0 -> OUTPUT__0 by position)."""
    import torch

    _torch_seed()

    class Linear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(features, outputs)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.layer(x))

    module = _script(Linear())
    module.save(str(_save_path(path)))
    return module


def torch_named_args(path: Path) -> Any:
    """TorchScript whose forward(values, scale) arguments name its inputs; two outputs (a tuple)."""
    import torch

    class Scale(torch.nn.Module):
        def forward(self, values: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return values * scale, values.sum(dim=1, keepdim=True)

    module = _script(Scale())
    module.save(str(_save_path(path)))
    return module


def torch_dict_output(path: Path, features: int = 4) -> Any:
    """TorchScript returning a dict of tensors (output names are the dict keys)."""
    import torch

    class Heads(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"doubled": x * 2.0, "total": x.sum(dim=1, keepdim=True)}

    module = _script(Heads())
    module.save(str(_save_path(path)))
    return module


def torch_tuple_output(path: Path, features: int = 4) -> Any:
    """TorchScript returning a list of two INT64 / FP32 tensors (OUTPUT__0, OUTPUT__1 by position)."""
    import torch

    class Split(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            return [torch.argmax(x, dim=1, keepdim=True), torch.softmax(x, dim=1)]

    module = _script(Split())
    module.save(str(_save_path(path)))
    return module


def torch_strings(path: Path) -> Any:
    """TorchScript over a List[str] (Triton passes 1-D BYTES tensors to TorchScript as lists of strings)."""
    import torch

    class Shout(torch.nn.Module):
        def forward(self, words: list[str]) -> list[str]:
            return [w.upper() + "!" for w in words]

    module = _script(Shout())
    module.save(str(_save_path(path)))
    return module


def torch_exported(path: Path, features: int = 8, outputs: int = 3) -> Any:
    """A torch.export program (model.pt2) with a dynamic batch dimension; returns the eager module."""
    import torch

    _torch_seed()

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = torch.nn.Linear(features, 16)
            self.out = torch.nn.Linear(16, outputs)

        def forward(self, features_in: torch.Tensor) -> torch.Tensor:
            return self.out(torch.relu(self.hidden(features_in)))

    module = Mlp().eval()
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(module, (torch.zeros(2, features),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(_save_path(path)))
    return module


# ------------------------------------------------------------------ OpenVINO -----------------------------------------------------------------
def openvino_ir(path: Path, features: int = 8, outputs: int = 4, batch: int = -1) -> Any:
    """An OpenVINO IR (model.xml + model.bin) of scores = relu(features @ W + b), batch dimension `batch`
    (-1: dynamic); returns the ov.Model."""
    import openvino as ov
    import openvino.opset13 as ops

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((features, outputs)).astype(np.float32)
    bias = rng.standard_normal(outputs).astype(np.float32)
    x = ops.parameter([batch, features], np.float32, name="features")
    y = ops.relu(ops.add(ops.matmul(x, ops.constant(weight), False, False), ops.constant(bias)))
    y.output(0).get_tensor().set_names({"scores"})
    model = ov.Model([y], [x], "linear_relu")
    ov.save_model(model, str(_save_path(path)), compress_to_fp16=False)
    return model
