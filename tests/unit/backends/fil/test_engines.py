"""The fil backend's fast paths give the framework's numbers bit for bit: XGBoost's C API called directly, and
large batches split by rows across threads; an instance takes its next batch while it runs one."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
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
from nereid.core.statistics import ModelStatistics  # noqa: E402
from nereid.core.types import InferenceRequest, InferenceResponse, InputTensor  # noqa: E402
from nereid.scheduling.dynamic_batcher import BatchingScheduler  # noqa: E402


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


class _GatedForest:
    """A loaded forest whose predictions wait until the test releases them, so a batch can be held running; it
    records each call's row count and refuses rows whose first feature is BAD."""

    BAD = 999.0

    def __init__(self, forest: Any) -> None:
        self.forest = forest
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.forest, name)

    def predict(self, rows: np.ndarray) -> np.ndarray:
        self.calls.append(len(rows))
        self.entered.set()
        assert self.release.wait(10), "the test never released the prediction"
        if (rows[:, 0] == self.BAD).any():
            raise ValueError("a row the engine refuses")
        return self.forest.predict(rows)


_GATED_CONFIG = (
    'name: "m" backend: "fil" max_batch_size: 64 input [ { name: "input__0" data_type: TYPE_FP32 dims: [ 8 ] } ] '
    'output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] } ] instance_group [ { count: 1 kind: KIND_CPU } ] '
    'parameters [ { key: "model_type" value: { string_value: "xgboost_json" } } ] dynamic_batching { }'
)


class _GatedInstance:
    """One fil instance (XGBoost) behind the dynamic batcher, its forest gated; records the batches handed to it
    and each request's response."""

    def __init__(self, tmp_path: Path) -> None:
        self.booster = _booster("reg:squarederror")
        version = tmp_path / "m" / "1"
        version.mkdir(parents=True)
        self.booster.save_model(str(version / "xgboost.json"))
        self.config = parse_pbtxt(_GATED_CONFIG, "m")
        self.context = ModelContext("m", 1, self.config, tmp_path / "m", version, tmp_path)
        self.handed: list[list[str]] = []
        self.answers: dict[str, InferenceResponse] = {}
        self.stats = ModelStatistics("m", "1")

    async def start(self) -> None:
        spec = InstanceSpec("m_0_0", self.config.instance_group[0].name, "CPU", 0, 0)
        self.instance = await FilBackend().create_instance(self.context, spec)
        self.gated = self.instance._forest = _GatedForest(self.instance._forest)
        execute = self.instance.execute

        async def recording(requests: list[InferenceRequest]) -> Any:
            self.handed.append([r.id for r in requests])
            return await execute(requests)

        self.instance.execute = recording  # type: ignore[method-assign]
        self.scheduler = BatchingScheduler(self.config, [self.instance], self.stats)  # type: ignore[list-item]

    async def close(self) -> None:
        await self.scheduler.close()
        await self.instance.close()

    def submit(self, rid: str, row: np.ndarray) -> None:
        request = InferenceRequest("m", "1", [InputTensor("input__0", "FP32", (1, 8), row[None])], id=rid)
        request.respond = lambda response: self.answers.__setitem__(rid, response)
        self.scheduler.submit(request)

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 5
        while not condition():  # polling with a deadline, not a fixed wait
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.001)

    async def hold_first_and_hand_over(self, rows: dict[str, np.ndarray]) -> None:
        """The first request runs and is held; each next one is handed over as a batch of its own while it runs."""
        (first, row), *others = rows.items()
        self.submit(first, row)
        assert await asyncio.to_thread(self.gated.entered.wait, 10)
        for rid, row in others:
            self.submit(rid, row)
            await self.until(lambda rid=rid: [rid] in self.handed, f"'{rid}' was handed to the busy instance")

    def value(self, rid: str) -> np.ndarray:
        response = self.answers[rid]
        assert response.error is None, response.error
        return response.outputs[0].data.reshape(-1)


def test_batches_handed_to_a_busy_instance_run_together_in_one_engine_call(tmp_path: Path) -> None:
    """While a fil instance runs one batch, the dynamic batcher hands it the next ones (they wait for its thread),
    and its thread runs all that waited in one engine call; each request gets its own row's answer, and a waiting
    batch counts as pending, as Triton counts it."""
    rows = _rows(3)
    m = _GatedInstance(tmp_path)

    async def scenario() -> None:
        await m.start()
        await m.hold_first_and_hand_over({"first": rows[0], "second": rows[1], "third": rows[2]})
        assert m.handed == [["first"], ["second"], ["third"]] and m.stats.pending == 2
        m.gated.release.set()
        await m.until(lambda: len(m.answers) == 3, "all answered")
        assert m.gated.calls == [1, 2]  # the two that waited went in one call
        expected = np.asarray(m.booster.inplace_predict(rows)).reshape(-1).astype(np.float32)
        np.testing.assert_array_equal(np.concatenate([m.value(rid) for rid in ("first", "second", "third")]), expected)
        assert m.stats.pending == 0 and m.stats.success.count == 3
        await m.close()

    asyncio.run(scenario())


def test_a_batch_the_engine_refuses_does_not_fail_the_batch_it_waited_with(tmp_path: Path) -> None:
    rows = _rows(3)
    rows[2, 0] = _GatedForest.BAD
    m = _GatedInstance(tmp_path)

    async def scenario() -> None:
        await m.start()
        await m.hold_first_and_hand_over({"first": rows[0], "good": rows[1], "bad": rows[2]})
        m.gated.release.set()
        await m.until(lambda: len(m.answers) == 3, "all answered")
        assert m.gated.calls == [1, 2, 1, 1]  # the merged call failed, so each batch ran again on its own
        expected = np.asarray(m.booster.inplace_predict(rows[:2])).reshape(-1).astype(np.float32)
        np.testing.assert_array_equal(np.concatenate([m.value("first"), m.value("good")]), expected)
        error = m.answers["bad"].error
        assert error is not None and "a row the engine refuses" in error.message
        assert (m.stats.success.count, m.stats.fail.count) == (2, 1)
        await m.close()

    asyncio.run(scenario())
