"""The fil backend's fast paths give the framework's numbers bit for bit: XGBoost's C API called directly, and
large batches split by rows across threads; an instance handed two batches at once answers each."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

xgboost = pytest.importorskip("xgboost")

from nereid.backends.base import InstanceSpec, ModelContext  # noqa: E402
from nereid.backends.fil.backend import FilBackend  # noqa: E402
from nereid.backends.fil.parallel import MIN_ROWS_PER_PART, in_parts  # noqa: E402
from nereid.backends.fil.xgboost_capi import DensePredictor  # noqa: E402
from nereid.config.model_config import parse_pbtxt  # noqa: E402
from nereid.core.capabilities import PipelinedInstance  # noqa: E402
from nereid.core.types import InferenceRequest, InputTensor  # noqa: E402


def _booster(objective: str, categorical: bool = False, **params: Any) -> Any:
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((600, 8)).astype(np.float32)
    if categorical:
        rows[:, -1] = rng.integers(0, 4, len(rows))
    labels = (rows[:, 0] > 0).astype(np.float32) + (rows[:, -1] == 2 if categorical else rows[:, 1] > 0.5)
    if objective == "binary:logistic":
        labels = np.minimum(labels, 1)
    matrix = xgboost.DMatrix(rows, label=labels, enable_categorical=categorical,
                             feature_types=["q"] * 7 + ["c"] if categorical else None)
    booster = xgboost.train({"objective": objective, "max_depth": 4, "nthread": 1, **params}, matrix, num_boost_round=20)
    booster.set_param({"nthread": 1})
    return booster


def _rows(n: int, features: int = 8) -> np.ndarray:
    rows = np.random.default_rng(n).standard_normal((n, features)).astype(np.float32)
    rows[:, -1] = np.arange(n) % 4  # category codes where the model has a categorical feature
    rows[::7, 3] = np.nan  # NaN is "missing"
    return rows


@pytest.mark.parametrize(("objective", "params", "margin"), [
    ("binary:logistic", {}, False),
    ("binary:logistic", {"categorical": True}, False),
    ("reg:squarederror", {}, False),
    ("multi:softprob", {"num_class": 3}, False),
    ("multi:softmax", {"num_class": 3}, True),
])
def test_dense_predictor_equals_inplace_predict(objective: str, params: dict[str, Any], margin: bool) -> None:
    booster = _booster(objective, **params)
    predictor = DensePredictor.create(booster, margin)
    assert predictor is not None
    for n in (1, 5, 300):
        rows = _rows(n)
        expected = np.asarray(booster.inplace_predict(rows, predict_type="margin" if margin else "value")).reshape(-1)
        assert np.array_equal(predictor.predict(rows), expected)


def test_dense_predictor_is_safe_from_several_threads() -> None:
    booster = _booster("binary:logistic")
    predictor = DensePredictor.create(booster, False)
    assert predictor is not None
    batches = [_rows(n) for n in range(1, 41)]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(predictor.predict, batches))
    for rows, answer in zip(batches, answers, strict=True):
        assert np.array_equal(answer, booster.inplace_predict(rows))


@pytest.mark.parametrize("n", [1, MIN_ROWS_PER_PART * 2 - 1, MIN_ROWS_PER_PART * 2, 1000, 1024])
@pytest.mark.parametrize("cores", [1, 2, 3])
def test_in_parts_keeps_row_order_and_values(n: int, cores: int) -> None:
    booster = _booster("multi:softprob", num_class=3)
    rows = _rows(n)
    calls: list[int] = []

    def predict(part: np.ndarray) -> np.ndarray:
        calls.append(len(part))
        return np.asarray(booster.inplace_predict(part))

    assert np.array_equal(in_parts(predict, rows, cores), booster.inplace_predict(rows))
    assert sum(calls) == n
    assert len(calls) == max(1, min(cores, n // MIN_ROWS_PER_PART))


def test_forest_falls_back_to_inplace_predict_without_the_c_api(monkeypatch: pytest.MonkeyPatch) -> None:
    from nereid.backends.fil import xgboost_capi
    from nereid.backends.fil.forests import XGBoostForest

    booster = _booster("binary:logistic")
    rows = _rows(600)  # enough rows to be split across threads where there are several cores
    fast = XGBoostForest(booster)

    def missing() -> None:
        raise OSError("no libxgboost")

    monkeypatch.setattr(xgboost_capi, "_load_library", missing)
    slow = XGBoostForest(booster)
    assert fast._dense is not None and slow._dense is None
    expected = booster.inplace_predict(rows).reshape(-1, 1)
    assert np.array_equal(fast.predict(rows), expected) and np.array_equal(slow.predict(rows), expected)


def test_in_parts_runs_a_queued_part_itself_when_the_helpers_are_busy() -> None:
    import threading

    from nereid.backends.fil import parallel

    release = threading.Event()
    blocker = parallel._HELPERS.submit(release.wait, 10)  # every helper busy with someone else's work
    blockers = [blocker] + [parallel._HELPERS.submit(release.wait, 10) for _ in range(parallel._HELPERS._max_workers - 1)]
    try:
        rows = _rows(MIN_ROWS_PER_PART * 2)
        threads: list[str] = []

        def predict(part: np.ndarray) -> np.ndarray:
            threads.append(threading.current_thread().name)
            return part[:, :1].copy()

        assert np.array_equal(in_parts(predict, rows, cores=2), rows[:, :1])
        assert threads == [threading.current_thread().name] * 2
    finally:
        release.set()
        for future in blockers:
            future.result()


def test_an_instance_takes_a_second_batch_while_it_runs_one_and_answers_each_with_its_own_rows(tmp_path: Path) -> None:
    """The fil instance is pipelined (two batches at once): the second waits on the instance's thread while the
    first runs, so the thread never waits for the event loop between batches; each batch gets its own answers."""
    booster = _booster("reg:squarederror")
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    booster.save_model(str(version / "xgboost.json"))
    config = parse_pbtxt(
        'name: "m" backend: "fil" max_batch_size: 64 input [ { name: "input__0" data_type: TYPE_FP32 dims: [ 8 ] } ] '
        'output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] } ] instance_group [ { count: 1 kind: KIND_CPU } ] '
        'parameters [ { key: "model_type" value: { string_value: "xgboost_json" } } ]',
        "m",
    )
    context = ModelContext("m", 1, config, tmp_path / "m", version, tmp_path)

    async def scenario() -> None:
        instance = await FilBackend().create_instance(context, InstanceSpec("m_0_0", config.instance_group[0].name, "CPU", 0, 0))
        assert isinstance(instance, PipelinedInstance) and instance.pipelined_batches == 2
        batches = [_rows(n)[:, :8] for n in (3, 5)]

        def requests(rows: np.ndarray) -> list[InferenceRequest]:
            return [InferenceRequest("m", "1", [InputTensor("input__0", "FP32", (1, 8), row[None])], id=str(i)) for i, row in enumerate(rows)]

        answered = await asyncio.gather(*(instance.execute(requests(rows)) for rows in batches))
        for rows, (responses, _) in zip(batches, answered):
            got = np.concatenate([r.outputs[0].data for r in responses]).reshape(-1)
            np.testing.assert_array_equal(got, np.asarray(booster.inplace_predict(rows)).reshape(-1).astype(np.float32))
        await instance.close()

    asyncio.run(scenario())
