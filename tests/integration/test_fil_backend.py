"""The fil backend behind a real `nereid serve`: XGBoost (JSON, UBJSON, legacy binary), LightGBM, Treelite
checkpoints and scikit-learn forests configured as Triton's FIL backend configures them. Every answer is
compared with the framework called directly on the same rows, NaNs included.

Tolerances: XGBoost outputs are equal bit for bit (the backend runs XGBoost itself). LightGBM, Treelite and
scikit-learn compute in float64 and the server returns FP32, so they are compared after the same rounding
(rtol 1e-6). SHAP values come from the framework (or, for Treelite and scikit-learn, Nereid's own TreeSHAP)
and must sum to the model's margin within 1e-4 (FP32 sums over a few dozen terms).
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.framework_models import (
    fil_config,
    lightgbm_model,
    sklearn_model,
    tree_rows,
    treelite_checkpoint,
    xgboost_legacy,
    xgboost_model,
)
from tests.integration.onnx_builders import write
from tests.servers import RunningServer, start_nereid

F = 6  # features of the XGBoost and LightGBM models
SK_F = 5  # features of the scikit-learn models
SHAP_TOL = 1e-4
BATCHING = "dynamic_batching { max_queue_delay_microseconds: 20000 }\ninstance_group [{ count: 2 kind: KIND_CPU }]\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("fil_repo")
    m: dict[str, Any] = {}
    shap = ("treeshap_output", [F + 1])
    # XGBoost: binary (probabilities + SHAP, dynamic batching, two instances), class ids with a threshold,
    # regression, multi-class, categorical features, the legacy binary format.
    m["xgb_proba"] = xgboost_model(root / "xgb_proba" / "1" / "xgboost.json", "binary")
    write(root / "xgb_proba" / "config.pbtxt", fil_config("xgb_proba", F, [("output__0", [2]), shap], extra=BATCHING,
          model_type="xgboost_json", output_class="true", predict_proba="true"))
    m["xgb_threshold"] = xgboost_model(root / "xgb_threshold" / "1" / "xgboost.ubj", "binary")
    write(root / "xgb_threshold" / "config.pbtxt", fil_config("xgb_threshold", F, [("output__0", [1])],
          model_type="xgboost_ubj", is_classifier="true", threshold="0.3"))
    m["xgb_regression"] = xgboost_model(root / "xgb_regression" / "1" / "xgboost.json", "regression")
    write(root / "xgb_regression" / "config.pbtxt", fil_config("xgb_regression", F, [("output__0", [1]), shap],
          model_type="xgboost_json", output_class="false"))
    m["xgb_multiclass"] = xgboost_model(root / "xgb_multiclass" / "1" / "xgboost.json", "multiclass")
    write(root / "xgb_multiclass" / "config.pbtxt", fil_config("xgb_multiclass", F,
          [("output__0", [3]), ("treeshap_output", [3, F + 1])], extra=BATCHING,
          model_type="xgboost_json", output_class="true", predict_proba="true"))
    (root / "xgb_multiclass_ids").mkdir()
    (root / "xgb_multiclass_ids" / "1").symlink_to(root / "xgb_multiclass" / "1")
    write(root / "xgb_multiclass_ids" / "config.pbtxt", fil_config("xgb_multiclass_ids", F, [("output__0", [1])],
          model_type="xgboost_json", output_class="true"))
    m["xgb_categorical"] = xgboost_model(root / "xgb_categorical" / "1" / "xgboost.json", "binary", categorical=True)
    write(root / "xgb_categorical" / "config.pbtxt", fil_config("xgb_categorical", F, [("output__0", [1]), shap],
          model_type="xgboost_json"))
    m["xgb_legacy"] = xgboost_legacy(root / "xgb_legacy" / "1" / "xgboost.model")
    write(root / "xgb_legacy" / "config.pbtxt", fil_config("xgb_legacy", 4, [("output__0", [2]), ("treeshap_output", [5])],
          extra=BATCHING, model_type="xgboost", output_class="true", predict_proba="true"))
    # LightGBM: binary with SHAP and batching, multi-class ids, categorical regression.
    m["lgb_binary"] = lightgbm_model(root / "lgb_binary" / "1" / "model.txt", "binary")
    write(root / "lgb_binary" / "config.pbtxt", fil_config("lgb_binary", F, [("output__0", [2]), shap], extra=BATCHING,
          model_type="lightgbm", output_class="true", predict_proba="true"))
    m["lgb_multiclass"] = lightgbm_model(root / "lgb_multiclass" / "1" / "model.txt", "multiclass")
    write(root / "lgb_multiclass" / "config.pbtxt", fil_config("lgb_multiclass", F,
          [("output__0", [1]), ("treeshap_output", [3, F + 1])], model_type="lightgbm", output_class="true"))
    m["lgb_categorical"] = lightgbm_model(root / "lgb_categorical" / "1" / "model.txt", "regression", categorical=True)
    write(root / "lgb_categorical" / "config.pbtxt", fil_config("lgb_categorical", F, [("output__0", [1]), shap],
          model_type="lightgbm"))
    # scikit-learn through Treelite: a pickled random forest, and a gradient-boosting checkpoint.
    m["sk_forest"] = sklearn_model(root / "sk_forest" / "1" / "model.pkl", "random_forest_classifier")
    write(root / "sk_forest" / "config.pbtxt", fil_config("sk_forest", SK_F,
          [("output__0", [3]), ("treeshap_output", [3, SK_F + 1])], extra=BATCHING,
          model_type="sklearn", output_class="true", predict_proba="true"))
    gbr = sklearn_model(root / "unused.pkl", "gradient_boosting_regressor")
    m["tl_gbr"] = (gbr, treelite_checkpoint(root / "tl_gbr" / "1" / "checkpoint.tl", gbr))
    write(root / "tl_gbr" / "config.pbtxt", fil_config("tl_gbr", SK_F, [("output__0", [1]), ("treeshap_output", [SK_F + 1])],
          model_type="treelite_checkpoint"))
    m["sk_extra_trees"] = sklearn_model(root / "sk_extra_trees" / "1" / "model.pkl", "extra_trees_regressor")
    write(root / "sk_extra_trees" / "config.pbtxt", fil_config("sk_extra_trees", SK_F,
          [("output__0", [1]), ("treeshap_output", [SK_F + 1])], model_type="sklearn"))
    m["sk_isolation"] = sklearn_model(root / "sk_isolation" / "1" / "model.pkl", "isolation_forest")
    write(root / "sk_isolation" / "config.pbtxt", fil_config("sk_isolation", SK_F, [("output__0", [1])], model_type="sklearn"))
    # Auto-complete: no config at all, and a config that names only the backend and its parameters.
    m["auto_xgb"] = xgboost_model(root / "auto_xgb" / "1" / "xgboost.json", "multiclass", features=7, classes=4)
    m["partial_lgb"] = lightgbm_model(root / "partial_lgb" / "1" / "model.txt", "multiclass", classes=3)
    write(root / "partial_lgb" / "config.pbtxt", 'backend: "fil"\nmax_batch_size: 32\n'
          'output [{ name: "output__0" }, { name: "treeshap_output" }]\n'
          'parameters { key: "model_type" value { string_value: "lightgbm" } }\n'
          'parameters { key: "output_class" value { string_value: "true" } }\n'
          'parameters { key: "predict_proba" value { string_value: "true" } }\n')
    # FIL's other parameters: old GPU knobs are accepted; unknown JSON fields need xgboost_allow_unknown_field.
    xgboost_model(root / "legacy_knobs" / "1" / "xgboost.json", "binary")
    write(root / "legacy_knobs" / "config.pbtxt", fil_config("legacy_knobs", F, [("output__0", [1])], model_type="xgboost_json",
          storage_type="SPARSE", algo="NAIVE", threads_per_tree="4", use_experimental_optimizations="true", blocks_per_sm="2",
          not_a_fil_parameter="1"))
    for name, allow in (("unknown_field_refused", "false"), ("unknown_field_allowed", "true")):
        path = root / name / "1" / "xgboost.json"
        xgboost_model(path, "binary")
        document = json.loads(path.read_text())
        document["learner"]["field_from_the_future"] = 1
        path.write_text(json.dumps(document))
        write(root / name / "config.pbtxt", fil_config(name, F, [("output__0", [1])], model_type="xgboost_json",
              xgboost_allow_unknown_field=allow))
    # Configs that contradict the model.
    xgboost_model(root / "wrong_features" / "1" / "xgboost.json", "binary")
    write(root / "wrong_features" / "config.pbtxt", fil_config("wrong_features", F + 1, [("output__0", [1])], model_type="xgboost_json"))
    xgboost_model(root / "wrong_classes" / "1" / "xgboost.json", "multiclass")
    write(root / "wrong_classes" / "config.pbtxt", fil_config("wrong_classes", F, [("output__0", [2])], model_type="xgboost_json",
          output_class="true", predict_proba="true"))
    write(root / "bad_model_type" / "1" / "xgboost.json", "{}")
    write(root / "bad_model_type" / "config.pbtxt", fil_config("bad_model_type", F, [("output__0", [1])], model_type="catboost"))
    return root, m


@pytest.fixture(scope="module")
def server(models: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_nereid(models[0], "--exit-on-error=false", "--strict-readiness=false", "--log-verbose=1",
                           log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="module")
def http(server: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url)


@pytest.fixture(scope="module")
def trained(models: tuple[Path, dict[str, Any]]) -> dict[str, Any]:
    return models[1]


def infer(http: httpclient.InferenceServerClient, model: str, rows: np.ndarray, outputs: tuple[str, ...] = ("output__0",)) -> dict[str, np.ndarray]:
    inp = httpclient.InferInput("input__0", list(rows.shape), "FP32")
    inp.set_data_from_numpy(rows)
    requested = [httpclient.InferRequestedOutput(name) for name in outputs]
    result = http.infer(model, [inp], outputs=requested)
    return {name: result.as_numpy(name) for name in outputs}


def _reason(http: httpclient.InferenceServerClient, model: str) -> str:
    entries = [e for e in http.get_model_repository_index() if e["name"] == model]
    assert entries and all(e["state"] == "UNAVAILABLE" for e in entries), entries
    return " ".join(e.get("reason", "") for e in entries)


def _xgb_margin(booster: Any, rows: np.ndarray) -> np.ndarray:
    return booster.inplace_predict(rows, predict_type="margin")


# ================================================ XGBoost ================================================
def test_xgboost_binary_probabilities_and_shap_match_xgboost(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    booster = trained["xgb_proba"]
    rows = tree_rows(40, F, seed=11)
    assert np.isnan(rows).any()  # NaN means "missing" and takes each split's default branch
    out = infer(http, "xgb_proba", rows, ("output__0", "treeshap_output"))
    p = booster.inplace_predict(rows)
    np.testing.assert_array_equal(out["output__0"], np.stack([1 - p, p], axis=1))
    import xgboost as xgb

    np.testing.assert_array_equal(out["treeshap_output"], booster.predict(xgb.DMatrix(rows), pred_contribs=True))
    assert out["treeshap_output"].shape == (40, F + 1)
    np.testing.assert_allclose(out["treeshap_output"].sum(axis=1), _xgb_margin(booster, rows), atol=SHAP_TOL)


def test_xgboost_threshold_turns_probabilities_into_class_ids(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    booster = trained["xgb_threshold"]
    rows = tree_rows(60, F, seed=12)
    p = booster.inplace_predict(rows)
    ids = infer(http, "xgb_threshold", rows)["output__0"]
    assert ids.shape == (60, 1)
    np.testing.assert_array_equal(ids[:, 0], (p > 0.3).astype(np.float32))
    assert ((p > 0.3) != (p > 0.5)).any()  # the threshold really moved some decisions


def test_xgboost_regression_and_its_shap_values(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    booster = trained["xgb_regression"]
    rows = tree_rows(25, F, seed=13)
    out = infer(http, "xgb_regression", rows, ("output__0", "treeshap_output"))
    np.testing.assert_array_equal(out["output__0"][:, 0], booster.inplace_predict(rows))
    np.testing.assert_allclose(out["treeshap_output"].sum(axis=1), _xgb_margin(booster, rows), atol=SHAP_TOL)


def test_xgboost_multiclass_probabilities_class_ids_and_per_class_shap(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    booster = trained["xgb_multiclass"]
    rows = tree_rows(30, F, seed=14)
    out = infer(http, "xgb_multiclass", rows, ("output__0", "treeshap_output"))
    proba = booster.inplace_predict(rows)
    np.testing.assert_array_equal(out["output__0"], proba)
    assert out["treeshap_output"].shape == (30, 3, F + 1)
    np.testing.assert_allclose(out["treeshap_output"].sum(axis=2), _xgb_margin(booster, rows), atol=SHAP_TOL)
    ids = infer(http, "xgb_multiclass_ids", rows)["output__0"]
    np.testing.assert_array_equal(ids[:, 0], np.argmax(proba, axis=1))


def test_xgboost_categorical_features(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    booster = trained["xgb_categorical"]
    assert booster.feature_types[-1] == "c"
    rows = tree_rows(40, F, seed=15, categories=4)
    out = infer(http, "xgb_categorical", rows, ("output__0", "treeshap_output"))
    np.testing.assert_array_equal(out["output__0"][:, 0], booster.inplace_predict(rows))
    np.testing.assert_allclose(out["treeshap_output"].sum(axis=1), _xgb_margin(booster, rows), atol=SHAP_TOL)
    # Changing only the category changes the answer: the categorical split is honoured.
    flipped = rows.copy()
    flipped[:, -1] = 2
    assert not np.array_equal(infer(http, "xgb_categorical", flipped)["output__0"], out["output__0"])


def test_xgboost_legacy_binary_format_loads_through_treelite(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    reference = trained["xgb_legacy"]  # the same model, read from its JSON twin
    rows = tree_rows(20, 4, seed=16)
    out = infer(http, "xgb_legacy", rows, ("output__0", "treeshap_output"))
    p = reference.inplace_predict(rows)
    np.testing.assert_allclose(out["output__0"], np.stack([1 - p, p], axis=1), rtol=1e-6, atol=1e-7)
    import xgboost as xgb

    np.testing.assert_allclose(out["treeshap_output"], reference.predict(xgb.DMatrix(rows), pred_contribs=True), atol=SHAP_TOL)


# ================================================ LightGBM ===============================================
def test_lightgbm_binary_probabilities_and_shap(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    booster = trained["lgb_binary"]
    rows = tree_rows(40, F, seed=21)
    out = infer(http, "lgb_binary", rows, ("output__0", "treeshap_output"))
    p = booster.predict(rows).astype(np.float32)
    np.testing.assert_allclose(out["output__0"], np.stack([1 - p, p], axis=1), rtol=1e-6)
    np.testing.assert_allclose(out["treeshap_output"], booster.predict(rows, pred_contrib=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["treeshap_output"].sum(axis=1), booster.predict(rows, raw_score=True), atol=SHAP_TOL)


def test_lightgbm_multiclass_class_ids_and_shap(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    booster = trained["lgb_multiclass"]
    rows = tree_rows(30, F, seed=22)
    out = infer(http, "lgb_multiclass", rows, ("output__0", "treeshap_output"))
    np.testing.assert_array_equal(out["output__0"][:, 0], np.argmax(booster.predict(rows), axis=1))
    assert out["treeshap_output"].shape == (30, 3, F + 1)
    np.testing.assert_allclose(out["treeshap_output"].sum(axis=2), booster.predict(rows, raw_score=True), atol=SHAP_TOL)


def test_lightgbm_categorical_regression(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    booster = trained["lgb_categorical"]
    rows = tree_rows(40, F, seed=23, categories=4)
    out = infer(http, "lgb_categorical", rows, ("output__0", "treeshap_output"))
    np.testing.assert_allclose(out["output__0"][:, 0], booster.predict(rows).astype(np.float32), rtol=1e-6)
    np.testing.assert_allclose(out["treeshap_output"].sum(axis=1), booster.predict(rows, raw_score=True), atol=SHAP_TOL)


# ======================================== scikit-learn and Treelite ======================================
def test_sklearn_random_forest_probabilities_and_treeshap(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    forest = trained["sk_forest"]
    rows = tree_rows(20, SK_F, seed=31, missing=0.0)
    out = infer(http, "sk_forest", rows, ("output__0", "treeshap_output"))
    np.testing.assert_allclose(out["output__0"], forest.predict_proba(rows), rtol=1e-6, atol=1e-7)
    assert out["treeshap_output"].shape == (20, 3, SK_F + 1)
    # A random forest's margin is its averaged probability: the SHAP values add up to predict_proba.
    np.testing.assert_allclose(out["treeshap_output"].sum(axis=2), forest.predict_proba(rows), atol=SHAP_TOL)


def test_treelite_checkpoint_of_gradient_boosting(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    gbr, _ = trained["tl_gbr"]
    rows = tree_rows(20, SK_F, seed=32, missing=0.0)
    out = infer(http, "tl_gbr", rows, ("output__0", "treeshap_output"))
    np.testing.assert_allclose(out["output__0"][:, 0], gbr.predict(rows), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["treeshap_output"].sum(axis=1), gbr.predict(rows), atol=SHAP_TOL)


def test_sklearn_extra_trees_regression_and_treeshap(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    forest = trained["sk_extra_trees"]
    rows = tree_rows(15, SK_F, seed=34, missing=0.0)
    out = infer(http, "sk_extra_trees", rows, ("output__0", "treeshap_output"))
    np.testing.assert_allclose(out["output__0"][:, 0], forest.predict(rows), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["treeshap_output"].sum(axis=1), forest.predict(rows), atol=SHAP_TOL)


def test_sklearn_isolation_forest_scores(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    forest = trained["sk_isolation"]
    rows = tree_rows(20, SK_F, seed=33, missing=0.0)
    # Treelite gives IsolationForest's anomaly score, which sklearn's score_samples reports negated.
    np.testing.assert_allclose(infer(http, "sk_isolation", rows)["output__0"][:, 0], -forest.score_samples(rows), rtol=1e-5)


# ====================================== batching, instances, protocols ===================================
@pytest.mark.parametrize("model", ["xgb_proba", "lgb_binary", "sk_forest", "xgb_multiclass"])
def test_concurrent_requests_are_batched_across_two_instances_and_answered_row_for_row(
    server: RunningServer, http: httpclient.InferenceServerClient, model: str
) -> None:
    config = http.get_model_config(model)
    assert config["instance_group"][0]["count"] == 2 and "dynamic_batching" in config
    features = config["input"][0]["dims"][0]
    rows = tree_rows(48, features, seed=41, missing=0.0 if model.startswith("sk") else 0.1)
    expected = infer(http, model, rows)["output__0"]
    before = http.get_inference_statistics(model)["model_stats"][0]
    clients = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(12)]

    def one(i: int) -> np.ndarray:
        inp = grpcclient.InferInput("input__0", [2, features], "FP32")
        inp.set_data_from_numpy(rows[2 * i : 2 * i + 2])
        return clients[i % len(clients)].infer(model, [inp]).as_numpy("output__0")

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(one, range(24)))
    np.testing.assert_array_equal(np.concatenate(answers), expected)
    after = http.get_inference_statistics(model)["model_stats"][0]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 48
    assert executions < 24, "requests were never batched together"


# ============================================= auto-complete =============================================
def test_model_without_config_is_completed_from_the_xgboost_file(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    config = http.get_model_config("auto_xgb")
    assert config["backend"] == "fil"
    assert config["parameters"]["model_type"]["string_value"] == "xgboost_json"
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("input__0", "TYPE_FP32", [7])]
    # Without output_class the output is the model's own (probability) output, one per class.
    assert [(o["name"], o["dims"]) for o in config["output"]] == [("output__0", [4])]
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    rows = tree_rows(3, 7, seed=51)
    np.testing.assert_array_equal(infer(http, "auto_xgb", rows)["output__0"], trained["auto_xgb"].inplace_predict(rows))


def test_partial_config_gets_feature_and_class_counts(http: httpclient.InferenceServerClient, trained: dict[str, Any]) -> None:
    config = http.get_model_config("partial_lgb")
    assert config["max_batch_size"] == 32
    assert [(i["name"], i["dims"]) for i in config["input"]] == [("input__0", [F])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("output__0", "TYPE_FP32", [3]),
        ("treeshap_output", "TYPE_FP32", [3, F + 1]),
    ]
    rows = tree_rows(5, F, seed=52)
    np.testing.assert_allclose(infer(http, "partial_lgb", rows)["output__0"], trained["partial_lgb"].predict(rows), rtol=1e-6)


# ============================================ parameters, errors =========================================
def test_old_gpu_knobs_are_accepted_and_logged(http: httpclient.InferenceServerClient, server: RunningServer) -> None:
    assert http.is_model_ready("legacy_knobs")
    log = server.log()
    for knob in ("storage_type", "algo", "threads_per_tree", "use_experimental_optimizations"):
        assert f"fil parameter '{knob}'" in log
    assert "unknown fil parameter 'not_a_fil_parameter'" in log


def test_unknown_xgboost_json_fields_need_xgboost_allow_unknown_field(http: httpclient.InferenceServerClient) -> None:
    assert "xgboost_allow_unknown_field" in _reason(http, "unknown_field_refused")
    assert http.is_model_ready("unknown_field_allowed")
    assert infer(http, "unknown_field_allowed", tree_rows(2, F))["output__0"].shape == (2, 1)


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("wrong_features", ["input__0", f"[{F + 1}]", f"[{F}]"]),
        ("wrong_classes", ["output__0", "[2]", "[3]", "predict_proba"]),
        ("bad_model_type", ["catboost", "xgboost_json"]),
    ],
)
def test_config_that_contradicts_the_model_is_unavailable_with_the_reason(
    http: httpclient.InferenceServerClient, model: str, words: list[str]
) -> None:
    reason = _reason(http, model)
    for word in words:
        assert word in reason, reason


def test_missing_framework_makes_the_model_unavailable_naming_the_extra(
    models: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose Python cannot import lightgbm (a stand-in package that fails to import comes first on
    PYTHONPATH) serves no fil model and says which extra to install."""
    shadow = tmp_path / "shadow"
    write(shadow / "lightgbm" / "__init__.py", "raise ImportError(\"No module named 'lightgbm'\")\n")
    repo = tmp_path / "repo"
    (repo / "xgb_regression").mkdir(parents=True)
    for item in ("1", "config.pbtxt"):
        (repo / "xgb_regression" / item).symlink_to(models[0] / "xgb_regression" / item)
    monkeypatch.setenv("PYTHONPATH", f"{shadow}:{Path(__file__).resolve().parents[2] / 'src'}")
    running = start_nereid(repo, "--exit-on-error=false", "--strict-readiness=false", log_dir=tmp_path)
    try:
        http = httpclient.InferenceServerClient(running.http_url)
        reason = _reason(http, "xgb_regression")
        assert "pip install nereid[fil]" in reason and "lightgbm" in reason, reason
    finally:
        assert running.stop() == 0, running.log()


def test_get_backend_names_the_extra_when_the_import_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from nereid.backends.base import get_backend
    from nereid.core.errors import NereidError

    for name in [m for m in sys.modules if m.startswith("nereid.backends.fil")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "treelite", None)  # `import treelite` now raises ImportError
    with pytest.raises(NereidError) as caught:
        get_backend("fil")
    assert caught.value.status.name == "UNAVAILABLE"
    assert "pip install nereid[fil]" in caught.value.message
